"""FuseLayerNorm: a LayerNorm spelt out over the last axis becomes one ``relax.nn.layer_norm``.

Exporters that predate ONNX's ``LayerNormalization`` (opset 17), and Paddle's, write
``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * gamma + beta`` as nine ops. TVM fuses them into three
kernels that pass over the tensor five times; as one op the CPU backends compute it a row at a time
(``schedules/layer_norm.py``).

Matched: both means over the last axis alone with ``keepdims``, the square as ``Pow(d, 2)`` or ``d * d``,
``eps`` a one-element constant, the division by the root, then optional
``* gamma`` and ``+ beta`` whose constants hold one value per element of the last axis (or one value). Every
operand order is matched. float32 only.
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


def _last_axis_mean(call, rank: int) -> bool:
    axes = call.attrs.axis
    return axes is not None and [int(a) % rank for a in axes] == [rank - 1] and bool(call.attrs.keepdims)


def _per_column(value: np.ndarray | None, width: int) -> np.ndarray | None:
    """A constant as ``[width]`` when it holds one value per element of the last axis (or one value)."""
    if value is None or value.dtype != np.float32 or any(d != 1 for d in value.shape[:-1]) \
            or (value.ndim and value.shape[-1] not in (1, width)):
        return None
    return np.broadcast_to(value.reshape(-1), (width,)).astype(np.float32)


def _rewrite(matched, m, parts: dict):
    x = m[parts["x"]]
    shape = x.ty.shape
    if str(x.ty.dtype) != "float32" or shape is None or any(not isinstance(d, tvm.tirx.IntImm) for d in shape):
        return matched
    rank, width = len(shape), int(shape[-1])
    if not all(_last_axis_mean(m[parts[k]], rank) for k in ("mean", "variance")):
        return matched
    if parts["two"] in m and not np.array_equal(const_array(m[parts["two"]]).reshape(-1), [2.0]):
        return matched
    eps = float_scalar(const_array(m[parts["eps"]]))
    if eps is None or not 0 <= eps < 1:
        return matched
    gamma = _per_column(const_array(m[parts["gamma"]]), width) if parts["gamma"] in m else np.ones(width, np.float32)
    beta = _per_column(const_array(m[parts["beta"]]), width) if parts["beta"] in m else np.zeros(width, np.float32)
    if gamma is None or beta is None:
        return matched
    return relax.op.nn.layer_norm(x, relax.const(gamma), relax.const(beta), axes=[-1], epsilon=eps)


@tvm.transform.module_pass(opt_level=0, name="FuseLayerNorm")
def FuseLayerNorm(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Rewrite every spelt-out last-axis LayerNorm of float32 values into ``relax.nn.layer_norm``."""
    # Longest first: bindings are rewritten in order, so a shorter form would match first and leave the rest.
    for scaled, shifted in ((True, True), (True, False), (False, False)):
        root, parts = _pattern(scaled, shifted)
        out = tvm.IRModule(mod.functions, attrs=mod.attrs)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gv] = relax.dpl.rewrite_call(root, lambda e, m: _rewrite(e, m, parts), func)
        mod = relax.transform.DeadCodeElimination()(out)
    return mod
