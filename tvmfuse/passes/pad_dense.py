"""PadDenseColumns: a dense whose column count has no small divisor gets its constant weight padded.

The x86 dense rule (``schedules/x86/dense.py``) gives each task a block of output columns that divides ``N``.
Recognizer heads have class counts like 18,385 = 5 x 3,677: the largest block was 5 columns, a third of
one vector, and PP-OCRv5 rec's head ran at 20 GFLOP/s, 41 % of the model's time. Padding the weight (and a
following per-column bias) with zero columns up to a multiple of 16 gives whole-vector blocks; the padded
columns are sliced off after the kernel (one copy of the output). Counts that already have a block of at
least one vector (N = 1000: 50 columns) are left alone, so their kernels and tuning records stay as they were.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvmfuse.schedules.common import largest_divisor
from tvmfuse.schedules.families import DENSE, static_shape

from .utils import const_array, rewrite_call, rewrite_functions

PAD_TO = 16  # columns: a multiple of both AVX2's (8) and AVX-512's (16) float lanes
MAX_BLOCK = 4 * PAD_TO  # the dense rule's largest column block for a count without whole vectors

_MATMUL = tvm.ir.Op.get(DENSE.anchor_op)
_ADD, _SLICE = (tvm.ir.Op.get(n) for n in ("relax.add", "relax.strided_slice"))


def needs_padding(n: int) -> bool:
    """True when ``n`` columns split into blocks narrower than one vector only."""
    return n > PAD_TO and largest_divisor(n, MAX_BLOCK) < PAD_TO


@relax.expr_functor.mutator
class _Pad(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self._made = []  # the padded matmul (or matmul + bias) var of every slice this pass wrote

    def _matmul(self, call):
        x, w = call.args
        weight, xs = const_array(w), static_shape(x)
        if weight is None or weight.ndim != 2 or xs is None or len(xs) != 2 or not needs_padding(weight.shape[1]):
            return None
        n = weight.shape[1]
        padded = np.zeros((weight.shape[0], -(-n // PAD_TO) * PAD_TO), weight.dtype)
        padded[:, :n] = weight
        mm = self.builder_.emit(relax.op.matmul(x, relax.const(padded, str(weight.dtype)), out_dtype=call.attrs.out_dtype))
        return self._slice(mm, n)

    def _slice(self, var, n):
        self._made.append(var)
        return relax.op.strided_slice(var, axes=[1], begin=[0], end=[n])

    def _bias(self, call):
        a, b = call.args
        value = const_array(b)
        if value is None or not isinstance(a, relax.Var):
            return None
        sliced = self.lookup_binding(a)
        if not (isinstance(sliced, relax.Call) and sliced.op == _SLICE
                and any(sliced.args[0].same_as(v) for v in self._made)):
            return None
        padded_shape = static_shape(sliced.args[0])
        n = static_shape(sliced)[1]
        if value.size != n or value.shape[-1:] != (n,) or static_shape(call) != static_shape(sliced):
            return None  # not one value per column
        bias = np.zeros(padded_shape[1], value.dtype)
        bias[:n] = value.reshape(n)
        added = self.builder_.emit(relax.op.add(sliced.args[0], relax.const(bias, str(value.dtype))))
        return self._slice(added, n)

    def visit_call_(self, call):
        return rewrite_call(super().visit_call_(call), {_MATMUL: self._matmul, _ADD: self._bias})


@tvm.transform.module_pass(opt_level=0, name="PadDenseColumns")
def PadDenseColumns(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return rewrite_functions(mod, _Pad)
