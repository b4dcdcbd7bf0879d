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
from tvm.ir.expr import Constant

from .fold_bn import per_channel, scaled_conv
from .utils import bindings_of, bound_call, const_array, rewrite_functions, users_of


def _split(call, op: str, lookup):
    """``(x, c)`` for ``call`` = ``op(x, c)`` or ``op(c, x)`` with ``c`` a constant (``x`` first where both are),
    else None."""
    call = bound_call(call, op, lookup)
    if call is None:
        return None
    a, b = call.args
    return (a, b) if isinstance(b, Constant) else (b, a) if isinstance(a, Constant) else None


def _chain(call, lookup, uses: dict | None, shifted: bool):
    """``(conv, bias, scale, shift)`` (bias and shift None where absent) when ``call`` ends ``(conv2d(x, W) [+ bias])
    * scale + shift`` (the shift's add, ``shifted``) or ``(conv2d(x, W) [+ bias]) * scale`` (the multiply), with
    ``W`` and the rest constants; else None. ``uses``: readers of each variable, where every value between the conv
    and ``call`` must have one (else folding would compute the conv twice); None does not ask."""

    def single(var) -> bool:
        return isinstance(var, relax.Var) and (uses is None or uses.get(var, 0) == 1)

    shift = None
    if shifted:
        found = _split(call, "relax.add", lookup)
        if found is None or not single(found[0]):
            return None
        call, shift = found
    scaled = _split(call, "relax.multiply", lookup)
    if scaled is None or not single(scaled[0]):
        return None
    biased, scale = scaled
    conv, bias = bound_call(biased, "relax.nn.conv2d", lookup), None
    if conv is None:
        found = _split(biased, "relax.add", lookup)
        if found is None or not single(found[0]):
            return None
        conv, bias = bound_call(found[0], "relax.nn.conv2d", lookup), found[1]
    if conv is None or not isinstance(conv.args[1], Constant):
        return None
    return conv, bias, scale, shift


def _fold(call, lookup, uses: dict, shifted: bool):
    """The replacement of ``call`` (see :func:`_chain`), or None."""
    chain = _chain(call, lookup, uses, shifted)
    if chain is None:
        return None
    conv, bias, scale, shift = chain
    a = conv.attrs
    if a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or conv.ty.dtype != "float32" \
            or any(str(x.ty.dtype) != "float32" for x in (scale,) + ((shift,) if shift is not None else ())):
        return None
    weight = const_array(conv.args[1]).astype("float64")
    channels = weight.shape[0]
    scale_v = per_channel(const_array(scale), channels)
    bias_v = per_channel(const_array(bias), channels) if bias is not None else np.zeros(channels)
    shift_v = per_channel(const_array(shift), channels) if shift is not None else np.zeros(channels)
    if scale_v is None or bias_v is None or shift_v is None:
        return None
    return scaled_conv(conv, weight, scale_v, bias_v * scale_v + shift_v)


def _scales_a_conv(func) -> bool:
    """Whether ``func`` multiplies the output of a conv2d (or of a conv2d plus a constant) by a constant: the
    multiply of every chain :func:`_fold` folds, shifted or not."""
    values = {b.var: b.value for b in bindings_of(func)}
    return any(_chain(value, values.get, None, False) is not None for value in values.values())


@relax.expr_functor.mutator
class _FoldScaleShift(relax.PyExprMutator):
    def __init__(self, mod, shifted: bool, folds: list):
        super().__init__(mod)
        self.shifted, self.folds, self.uses = shifted, folds, {}

    def visit_function_(self, func):
        self.uses = {var: len(readers) for var, readers in users_of(func).items()}
        return super().visit_function_(func)

    def visit_call_(self, op):
        call = super().visit_call_(op)
        folded = _fold(call, self.lookup_binding, self.uses, self.shifted)
        if folded is None:
            return call
        self.folds.append(call)
        return self.builder_.normalize(folded)


@tvm.transform.module_pass(opt_level=0, name="FoldScaleShift")
def FoldScaleShift(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Fold ``conv2d [+ bias] * constant [+ constant]`` (one value per output channel) into the conv.

    The chains ending in a shift first, then those ending in the multiply (one pass each: a pass that folded
    the multiply first would leave the shift's add). Rewritten directly, not through TVM's pattern rewriter,
    whose common-subexpression elimination hashed every weight (0.07 s of MobileNetV3's compile)."""
    if not any(_scales_a_conv(f) for f in mod.functions.values() if isinstance(f, relax.Function)):
        return mod  # the mutator visits every call in Python: longer than this look on a model without any
    for shifted in (True, False):
        folds: list = []
        out = rewrite_functions(tvm.IRModule(mod.functions, attrs=mod.attrs),
                                lambda m: _FoldScaleShift(m, shifted, folds))
        if folds:
            out = relax.transform.CanonicalizeBindings()(out)
        mod = relax.transform.DeadCodeElimination()(out)
    return mod
