"""FoldBatchNorm: fold inference batch-norm into the preceding conv2d's weights and bias.

The ONNX importer emits ``conv2d -> add(bias) -> batch_norm -> [0]``; TVM's own
``FoldBatchnormToConv2D`` only matches conv2d directly followed by batch_norm, so this pass handles both.
With ``s = gamma / sqrt(var + eps)``: ``W' = W * s`` per output channel and ``b' = (b - mean) * s + beta``.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, wildcard

from .utils import const_array


def _pattern():
    data, weight, bias = wildcard(), is_const(), is_const()
    conv = is_op("relax.nn.conv2d")(data, weight)
    biased = is_op("relax.add")(conv, bias) | conv
    stats = [is_const() for _ in range(4)]
    bn = is_op("relax.nn.batch_norm")(biased, *stats)
    return is_tuple_get_item(bn, 0), conv, weight, bias, bn, stats


def _rewrite(matched, m, conv_p, weight_p, bias_p, bn_p, stats_p):
    conv, bn = m[conv_p], m[bn_p]
    a, bn_attrs = conv.attrs, bn.attrs
    if (a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or int(bn_attrs.axis) != 1
            or bool(bn_attrs.training) or conv.ty.dtype != "float32"):
        return matched
    gamma, beta, mean, var = (const_array(m[p]).astype("float64") for p in stats_p)
    if not bn_attrs.scale:
        gamma = np.ones_like(gamma)
    if not bn_attrs.center:
        beta = np.zeros_like(beta)
    scale = gamma / np.sqrt(var + float(bn_attrs.epsilon))
    weight = const_array(m[weight_p]).astype("float64")
    bias = per_channel(const_array(m[bias_p]), weight.shape[0]) if bias_p in m else np.zeros(weight.shape[0])
    if bias is None:
        return matched
    return scaled_conv(conv, weight, scale, (bias - mean) * scale + beta)


def per_channel(value: np.ndarray | None, channels: int) -> np.ndarray | None:
    """``value`` as one float64 per output channel of an NCHW tensor, or None when it broadcasts otherwise:
    a ``(C,)`` constant broadcasts along W, not the channels."""
    if value is None or value.ndim > 4:
        return None
    v4 = value.reshape((1,) * (4 - value.ndim) + value.shape)
    if v4.shape[0] != 1 or v4.shape[2:] != (1, 1) or v4.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(v4.reshape(-1), (channels,)).astype("float64")


def scaled_conv(conv, weight: np.ndarray, scale: np.ndarray, bias: np.ndarray):
    """``conv`` with its OIHW ``weight`` scaled per output channel, then ``+ bias`` (one per output channel)."""
    a, channels = conv.attrs, weight.shape[0]
    new_w = (weight * scale.reshape(-1, 1, 1, 1)).astype("float32")
    new_conv = relax.op.nn.conv2d(conv.args[0], relax.const(new_w), strides=a.strides, padding=a.padding,
                                  dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                                  kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=a.out_dtype)
    return relax.op.add(new_conv, relax.const(bias.astype("float32").reshape(1, channels, 1, 1)))


@tvm.transform.module_pass(opt_level=0, name="FoldBatchNorm")
def FoldBatchNorm(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Fold ``batch_norm`` (inference, constant statistics) into a preceding NCHW/OIHW conv2d."""
    pattern, *parts = _pattern()
    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = relax.dpl.rewrite_call(pattern, lambda e, m: _rewrite(e, m, *parts), func)
    return relax.transform.DeadCodeElimination()(out)
