"""FuseLayerNorm: a LayerNorm spelt out over the last axis, or over the channels of NCHW, becomes one
``relax.nn.layer_norm``.

Exporters that predate ONNX's ``LayerNormalization`` (opset 17), and Paddle's, write
``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta`` as nine ops. TVM fuses them into three
kernels that pass over the tensor five times; as one op the CPU backends compute it a row at a time
(``schedules/computes/layer_norm.py``).

Matched: both means over the same one axis with ``keepdims`` (the last, or axis 1 of a tensor of rank 3 or
more: ConvNeXt's channels-first LayerNorm, which the x86 backend computes a run of pixels at a time), the
square as ``Pow(d, 2)`` or ``d * d``, ``eps`` a one-element constant, the division by the root, then
optional ``* gamma`` and ``+ beta`` whose constants hold one value per element of that axis (or one value).
Every operand order is matched. float32 only.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .utils import commuted, const_array, float_scalar


def _pattern(scaled: bool, shifted: bool):
    x, two, eps, gamma, beta = wildcard(), is_const(), is_const(), is_const(), is_const()
    mean = is_op("relax.mean")(x)
    delta = is_op("relax.subtract")(x, mean)
    square = is_op("relax.power")(delta, two) | is_op("relax.multiply")(delta, delta)
    variance = is_op("relax.mean")(square)
    root = is_op("relax.sqrt")(commuted("relax.add", variance, eps))
    out = is_op("relax.divide")(delta, root)
    if scaled:
        out = commuted("relax.multiply", out, gamma)
    if shifted:
        out = commuted("relax.add", out, beta)
    return out, {"x": x, "mean": mean, "variance": variance, "two": two, "eps": eps, "gamma": gamma, "beta": beta}


def _mean_axis(call, rank: int) -> int | None:
    """The one axis a ``keepdims`` mean reduces when it is the last axis, or axis 1 of a tensor of rank 3 or
    more (NCHW's channels); None otherwise."""
    axes = call.attrs.axis
    if axes is None or len(axes) != 1 or not bool(call.attrs.keepdims):
        return None
    axis = int(axes[0]) % rank
    return axis if axis == rank - 1 or (axis == 1 and rank >= 3) else None


def _per_element(value: np.ndarray | None, axis: int, rank: int, width: int) -> np.ndarray | None:
    """A constant as ``[width]`` when it holds one value per element of ``axis`` (or one value), broadcast
    against a tensor of ``rank`` (``gamma[:, None, None]`` for NCHW's channels)."""
    if value is None or value.dtype != np.float32 or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, width):
        return None
    return np.broadcast_to(value.reshape(-1), (width,)).astype(np.float32)


def _rewrite(matched, m, parts: dict, channels: bool):
    x = m[parts["x"]]
    shape = x.ty.shape
    if str(x.ty.dtype) != "float32" or shape is None or any(not isinstance(d, tvm.tirx.IntImm) for d in shape):
        return matched
    rank = len(shape)
    axis = _mean_axis(m[parts["mean"]], rank)
    if axis is None or _mean_axis(m[parts["variance"]], rank) != axis or (axis != rank - 1 and not channels):
        return matched
    width = int(shape[axis])
    if parts["two"] in m and not np.array_equal(const_array(m[parts["two"]]).reshape(-1), [2.0]):
        return matched
    eps = float_scalar(const_array(m[parts["eps"]]))
    if eps is None or not 0 <= eps < 1:
        return matched
    gamma = (_per_element(const_array(m[parts["gamma"]]), axis, rank, width) if parts["gamma"] in m
             else np.ones(width, np.float32))
    beta = (_per_element(const_array(m[parts["beta"]]), axis, rank, width) if parts["beta"] in m
            else np.zeros(width, np.float32))
    if gamma is None or beta is None:
        return matched
    return relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[axis], epsilon=eps)


def FuseLayerNorm(channels: bool = True) -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Rewrite every spelt-out LayerNorm of float32 values over the last axis, and with ``channels`` over the
    channels of NCHW (where the backend computes that as one kernel: ``Backend.channel_layer_norm``), into
    ``relax.nn.layer_norm``."""

    @tvm.transform.module_pass(opt_level=0, name="FuseLayerNorm")
    def _fuse(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        # Longest first: bindings are rewritten in order, so a shorter form would match first and leave the rest.
        for scaled, shifted in ((True, True), (True, False), (False, False)):
            root, parts = _pattern(scaled, shifted)
            out = tvm.IRModule(mod.functions, attrs=mod.attrs)
            for gv, func in mod.functions_items():
                if isinstance(func, relax.Function):
                    out[gv] = relax.dpl.rewrite_call(root, lambda e, m: _rewrite(e, m, parts, channels), func)
            mod = relax.transform.DeadCodeElimination()(out)
        return mod

    return _fuse
