"""FoldConstantLayouts: reshapes and transposes of constants done in numpy, before TVM's FoldConstant.

TVM's ``FoldConstant`` evaluates each constant subexpression by building it with LLVM and running it: about
70 ms per call on a 2-core Zen 4. The calls it meets in imported ONNX models are almost all data movement
on weights and biases (a bias ``Reshape`` to ``[1, C, 1, 1]`` for every conv of a Paddle export: 32 of them,
2.2 of en_ppocrv4_rec's 9.2 s first compile). Moving data is exact in numpy, so ``reshape``,
``expand_dims``, ``squeeze``, ``flatten`` (to the call's static output shape) and ``permute_dims`` of a
constant become constants here; ``FoldConstant`` keeps the arithmetic, whose rounding must stay TVM's.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .utils import const_array

_RESHAPES = frozenset({"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"})


def _static_shape(call) -> tuple[int, ...] | None:
    shape = getattr(call.ty, "shape", None)
    if shape is None:
        return None
    dims = []
    for d in shape:
        if not isinstance(d, (int, tvm.tirx.IntImm)):
            return None
        dims.append(int(d))
    return tuple(dims)


def _folded(call, value: np.ndarray | None) -> np.ndarray | None:
    """``call`` applied to its first operand's constant ``value``; None when it is not one of the ops above."""
    name = getattr(getattr(call, "op", None), "name", None)
    if value is None or name not in _RESHAPES and name != "relax.permute_dims":
        return None
    if name == "relax.permute_dims":
        axes = call.attrs.axes
        return np.ascontiguousarray(np.transpose(value, None if axes is None else [int(a) for a in axes]))
    shape = _static_shape(call)
    if shape is None or int(np.prod(shape, dtype=np.int64)) != value.size:
        return None
    return value.reshape(shape)


@relax.expr_functor.mutator
class _Fold(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.args:
            return call
        operand = call.args[0]
        if isinstance(operand, relax.Var):  # a chain: the previous fold's constant, bound to a variable
            operand = self.lookup_binding(operand)
        value = _folded(call, const_array(operand))
        return call if value is None else relax.const(value, str(value.dtype))


@tvm.transform.module_pass(opt_level=0, name="FoldConstantLayouts")
def FoldConstantLayouts(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Fold reshapes and transposes of constants in every Relax function of ``mod``."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = _Fold(mod).visit_expr(func)
    return mod
