"""FlattenMatmul: ``matmul(x[..., M, K], W[K, N])`` with a constant 2-D weight becomes a 2-D dense.

Transformer mixers and recognizer heads multiply a 3-D activation (batch, sequence, features) by a
constant weight. The ``dense`` family takes 2-D data only, so these stayed on TVM's default path:
PP-OCRv6 rec small spent 56 % of its time in one such kernel, its 18,710-class head at about 6 GFLOP/s.
Every row of ``x`` meets the same weight, so ``reshape(x, (prod(lead), K)) @ W`` reshaped back is the same
product, and then the dense rule (and its bias epilogue) applies. The reshape back sinks below the
elementwise ops that follow (the ONNX MatMul + Add bias, a GELU spelt with Erf, an activation) when their
other operands are scalars or constants along the last axis, so those meet the dense in 2-D and join its
partition: ConvNeXt's GELUs ran as kernels of their own after every expansion.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from tvmfuse.schedules.families import DENSE, static_shape

from .utils import const_array, rewrite_call, rewrite_functions

# The dense family's anchor (a matmul): what this pass turns N-D operands of into the 2-D form it takes.
_MATMUL = tvm.ir.Op.get(DENSE.anchor_op)
_RESHAPE = tvm.ir.Op.get("relax.reshape")


# Elementwise ops a flattened product's reshape sinks below (so the dense partition takes them as its bias
# and activation): their other operands must be scalars or per-column constants.
_ELEMENTWISE = {tvm.ir.Op.get(n) for n in (
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.erf", "relax.sigmoid", "relax.tanh",
    "relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.clip", "relax.nn.leakyrelu")}


@relax.expr_functor.mutator
class _Flatten(relax.PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self._flat: set = set()  # 2-D vars holding a flattened product (or an elementwise op of one)

    def _flat_source(self, var):
        """``(y2, shape)`` when ``var`` is bound to ``reshape(y2, shape)`` of a flattened 2-D product."""
        if not isinstance(var, relax.Var):
            return None
        value = self.lookup_binding(var)
        if not (isinstance(value, relax.Call) and value.op == _RESHAPE and value.args[0] in self._flat):
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
        self._flat.add(y2)
        return relax.op.reshape(y2, lead + (ws[1],))

    def _elementwise(self, call):
        """``op(reshape(y2, shape), c)`` -> ``reshape(op(y2, c'), shape)`` for the ops in ``_ELEMENTWISE``,
        where every tensor operand is such a reshape of the same shape or a constant that is a scalar or
        varies along the last axis only (``c'``: it as a vector). A GELU or a bias after the flattened product
        then meets the dense in 2-D."""
        shape, args = static_shape(call), []
        for arg in call.args:
            flat = self._flat_source(arg)
            if flat is not None:
                if flat[1] != shape:
                    return None
                args.append(flat[0])
                continue
            value = const_array(arg)
            if value is None:
                if isinstance(arg, relax.Var):
                    return None  # another activation
                args.append(arg)  # a PrimValue (clip's bounds) or an attribute-like operand
            elif value.size == 1:
                args.append(relax.const(value.reshape(()), str(value.dtype)))
            elif shape and value.size == shape[-1] and value.shape[-1:] == (shape[-1],):
                args.append(relax.const(value.reshape(shape[-1]), str(value.dtype)))
            else:
                return None  # it would broadcast over more than the last axis
        if len(args) == len(call.args) and any(a in self._flat for a in args):
            y2 = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
            self._flat.add(y2)
            return relax.op.reshape(y2, shape)
        return None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        handlers = {_MATMUL: self._matmul} | dict.fromkeys(_ELEMENTWISE, self._elementwise)
        return rewrite_call(call, handlers)


@tvm.transform.module_pass(opt_level=0, name="FlattenMatmul")
def FlattenMatmul(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return rewrite_functions(mod, _Flatten)
