"""FlattenMatmul: ``matmul(x[..., M, K], W[K, N])`` with a constant 2-D weight becomes a 2-D dense.

Transformer mixers and recognizer heads multiply a 3-D activation (batch, sequence, features) by a
constant weight. The ``dense`` family takes 2-D data only, so these stayed on TVM's default path:
PP-OCRv6 rec small spent 56 % of its time in one such kernel, its 18,710-class head at about 6 GFLOP/s.
Every row of ``x`` meets the same weight, so ``reshape(x, (prod(lead), K)) @ W`` reshaped back is the same
product, and then the dense rule (and its bias epilogue) applies. A following ``add`` of a constant that
only varies along the last axis (the ONNX MatMul + Add bias) is moved before the reshape, into the
dense partition.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from tvmfuse.schedules.families import FAMILIES, static_shape

from .utils import const_array, rewrite_call, rewrite_functions

# The dense family's anchor (a matmul): what this pass turns N-D operands of into the 2-D form it takes.
_MATMUL = tvm.ir.Op.get(FAMILIES["dense"].anchor_op)
_ADD, _RESHAPE = (tvm.ir.Op.get(n) for n in ("relax.add", "relax.reshape"))


@relax.expr_functor.mutator
class _Flatten(relax.PyExprMutator):
    def _flat_matmul(self, var):
        """``(y2, shape)`` when ``var`` is bound to reshape(y2, shape) of a flattened 2-D constant matmul."""
        if not isinstance(var, relax.Var):
            return None
        value = self.lookup_binding(var)
        if not (isinstance(value, relax.Call) and value.op == _RESHAPE and isinstance(value.args[0], relax.Var)):
            return None
        inner = self.lookup_binding(value.args[0])
        if not (isinstance(inner, relax.Call) and inner.op == _MATMUL
                and isinstance(inner.args[1], tvm.ir.expr.Constant) and len(static_shape(inner) or ()) == 2):
            return None
        return value.args[0], static_shape(value)

    def _matmul(self, call):
        x, w = call.args
        xs, ws = static_shape(x), static_shape(w)
        if not isinstance(w, tvm.ir.expr.Constant) or xs is None or ws is None or len(ws) != 2 or len(xs) < 3:
            return None
        lead, k = xs[:-1], xs[-1]
        if k != ws[0]:
            return None
        x2 = self.builder_.emit(relax.op.reshape(x, (math.prod(lead), k)))
        y2 = self.builder_.emit(relax.op.matmul(x2, w, out_dtype=call.attrs.out_dtype))
        return relax.op.reshape(y2, lead + (ws[1],))

    def _bias(self, call):
        a, b = call.args
        flat, value = self._flat_matmul(a), const_array(b)
        if flat is None or value is None:
            return None
        y2, shape = flat
        n = shape[-1]
        if value.size != n or value.shape[-1:] != (n,) or static_shape(call) != shape:
            return None  # not a per-column bias (it would broadcast over more than the last axis)
        added = self.builder_.emit(relax.op.add(y2, relax.const(value.reshape(n), str(value.dtype))))
        return relax.op.reshape(added, shape)

    def visit_call_(self, call):
        return rewrite_call(super().visit_call_(call), {_MATMUL: self._matmul, _ADD: self._bias})


@tvm.transform.module_pass(opt_level=0, name="FlattenMatmul")
def FlattenMatmul(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return rewrite_functions(mod, _Flatten)
