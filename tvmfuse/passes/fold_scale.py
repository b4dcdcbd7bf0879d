"""FoldScaleShift: fold a constant scale and shift after a conv into the conv's weights and bias.

Paddle's learnable affine blocks (PP-LCNetV3, the backbone of the PP-OCRv4/v5 recognizers) put
``x * s + t`` with one-element ``s`` and ``t`` between every conv (after its folded batch-norm) and its
activation. Left there, the chain ``conv -> multiply -> add -> hardswish`` breaks the partition pattern
after the conv, and the scale, shift and activation run as a separate kernel that reads and writes the
whole tensor (8% of PP-OCRv5 rec). Folded, the conv and its activation are one kernel again:
``(conv(x, W) + b) * s + t = conv(x, W * s) + (b * s + t)``.

Matched: an NCHW/OIHW float32 conv2d (any groups), an optional constant bias, ``multiply`` by a constant
(either operand order), an optional ``add`` of a constant. Each constant must be one value per output
channel under broadcasting (one element, ``(C,1,1)``, ``(1,C,1,1)``, ...): a ``(C,)`` constant broadcasts
along W, not the channels, and is left alone.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .fold_bn import per_channel, scaled_conv
from .utils import bindings_of, const_array, users_of


def _pattern(shifted: bool):
    """The chain ending in the shift's add (``shifted``) or in the multiply. Two patterns, not one with an
    optional add: bindings are rewritten in order, so the multiply would match first and leave the add."""
    data, weight, bias, scale, shift = wildcard(), is_const(), is_const(), is_const(), is_const()
    conv = is_op("relax.nn.conv2d")(data, weight)
    biased = is_op("relax.add")(conv, bias) | conv
    scaled = is_op("relax.multiply")(biased, scale) | is_op("relax.multiply")(scale, biased)
    root = (is_op("relax.add")(scaled, shift) | is_op("relax.add")(shift, scaled)) if shifted else scaled
    return root, (conv, biased, scaled, weight, bias, scale, shift)


def _uses(func) -> tuple[dict, dict]:
    """Each bound call's variable (by object) and how many bindings (and the result) read each variable."""
    var_of = {binding.value: binding.var for binding in bindings_of(func)}
    return var_of, {var: len(readers) for var, readers in users_of(func).items()}


def _single_use(exprs, var_of: dict, uses: dict) -> bool:
    """Whether every intermediate of the chain is read once (else folding would compute the conv twice)."""
    return all(e in var_of and uses.get(var_of[e], 0) == 1 for e in exprs)


def _rewrite(matched, m, var_of, uses, conv_p, biased_p, scaled_p, weight_p, bias_p, scale_p, shift_p):
    conv = m[conv_p]
    a = conv.attrs
    inner = [conv, m[biased_p]] if bias_p in m else [conv]
    if shift_p in m:
        inner.append(m[scaled_p])
    if not _single_use(inner, var_of, uses):
        return matched
    if a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or conv.ty.dtype != "float32" \
            or any(str(x.ty.dtype) != "float32" for x in (m[scale_p],) + ((m[shift_p],) if shift_p in m else ())):
        return matched
    weight = const_array(m[weight_p]).astype("float64")
    channels = weight.shape[0]
    scale = per_channel(const_array(m[scale_p]), channels)
    bias = per_channel(const_array(m[bias_p]), channels) if bias_p in m else np.zeros(channels)
    shift = per_channel(const_array(m[shift_p]), channels) if shift_p in m else np.zeros(channels)
    if scale is None or bias is None or shift is None:
        return matched
    return scaled_conv(conv, weight, scale, bias * scale + shift)


@tvm.transform.module_pass(opt_level=0, name="FoldScaleShift")
def FoldScaleShift(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Fold ``conv2d [+ bias] * constant [+ constant]`` (one value per output channel) into the conv."""
    for shifted in (True, False):
        pattern, parts = _pattern(shifted)
        out = tvm.IRModule(mod.functions, attrs=mod.attrs)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                var_of, uses = _uses(func)
                out[gv] = relax.dpl.rewrite_call(pattern, lambda e, m: _rewrite(e, m, var_of, uses, *parts), func)
        mod = relax.transform.DeadCodeElimination()(out)
    return mod
