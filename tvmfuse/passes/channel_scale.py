"""The squeeze-and-excitation product folded into the conv that reads it (issue #18).

``y = conv(x * scale)``, ``scale`` a ``[1, C, 1, 1]`` tensor computed at run time (the SE block's gate), was two
kernels: an elementwise one writing the product, then the conv reading it back. When the product has no
other reader, ``LowerPartitions`` gives the conv's partition a prologue instead (:func:`with_prologue`): its
data parameter becomes ``x * scale``, both passed blocked, and the kernel multiplies its packed weight by the
scale once per call and reads ``x`` as it is (``conv(x * s, W) = conv(x, W * s)``,
``tvmfuse/schedules/channel_scale.py``). The kernel's partition function (what op-check runs as the
reference) carries the same prologue.
"""

from __future__ import annotations

from tvm import relax

from tvmfuse.schedules.computes.channel_scale import SCALE_PARAM

MULTIPLY = "relax.multiply"


def channel_scale(call, base) -> object | None:
    """The per-channel operand of ``call`` when it is ``base * scale`` (either order) with ``scale`` a
    ``[1, C, 1, 1]`` variable of ``base``'s channels and dtype; None otherwise."""
    if getattr(getattr(call, "op", None), "name", None) != MULTIPLY or len(call.args) != 2:
        return None
    other = call.args[1] if call.args[0].same_as(base) else call.args[0] if call.args[1].same_as(base) else None
    shape = getattr(getattr(other, "ty", None), "shape", None)
    if not isinstance(other, relax.Var) or shape is None or len(shape) != 4:
        return None
    dims, channels = [int(d) for d in shape], int(base.ty.shape[1])
    return other if dims == [1, channels, 1, 1] and other.ty.dtype == base.ty.dtype else None


def with_prologue(fn: relax.Function, data_index: int) -> relax.Function:
    """``fn`` whose data parameter is computed as ``x * scale``: ``x`` takes its place among the parameters,
    ``scale`` (``[1, C, 1, 1]``) is appended; the body is unchanged after the new first binding."""
    data = fn.params[data_index]
    x = relax.Var("x", data.ty)
    scale = relax.Var(SCALE_PARAM, relax.TensorType([1, int(data.ty.shape[1]), 1, 1], data.ty.dtype))
    params = list(fn.params)
    params[data_index] = x
    first, *rest = fn.body.blocks
    prologue = relax.VarBinding(data, relax.BlockBuilder().normalize(relax.op.multiply(x, scale)))
    block = type(first)([prologue] + list(first.bindings))
    body = relax.SeqExpr([block] + rest, fn.body.body)
    return relax.Function(params + [scale], body, fn.ret_ty, fn.is_pure, fn.attrs)
