"""FoldConstantLayouts: reshapes and transposes of constants done in numpy, before TVM's FoldConstant.

TVM's ``FoldConstant`` evaluates each constant subexpression by building it with LLVM and running it: about
70 ms per call on a 2-core Zen 4. The calls it meets in imported ONNX models are almost all data movement
on weights and biases (a bias ``Reshape`` to ``[1, C, 1, 1]`` for every conv of a Paddle export: 32 of them,
2.2 of en_ppocrv4_rec's 9.2 s first compile). Moving data is exact in numpy, so ``reshape``,
``expand_dims``, ``squeeze``, ``flatten`` (to the call's static output shape) and ``permute_dims`` of a
constant become constants here; ``FoldConstant`` keeps the arithmetic, whose rounding must stay TVM's.

Integer index arithmetic on constants is exact too, and TVM's ONNX importer writes five such calls for
every ``Gather`` with a constant index (its negative-index check: ``shape_to_tensor(shape_of(data))``,
``take`` of the dimension, ``less``, ``add``, ``where``): 200 builds, 2.3 s of a 9.9 s first compile for an
LSTM spelt out over 40 steps. ``shape_to_tensor`` of a static ``shape_of``, and ``take``, comparisons,
``add``/``subtract``/``multiply`` and ``where`` whose operands are all integer or boolean constants, are
evaluated here.
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


_COMPARE = {"relax.less": np.less, "relax.less_equal": np.less_equal, "relax.greater": np.greater,
            "relax.greater_equal": np.greater_equal, "relax.equal": np.equal, "relax.not_equal": np.not_equal}
_INTEGER = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply, **_COMPARE}
_TAKE_MODES = {"wrap": "wrap", "clip": "clip", "fast": "raise"}


def _static_shape_of(expr) -> np.ndarray | None:
    """``shape_to_tensor``'s value for ``shape_of`` of a tensor with a static shape, as int64."""
    if getattr(getattr(expr, "op", None), "name", None) != "relax.shape_of":
        return None
    shape = _static_shape(expr.args[0])
    return None if shape is None else np.array(shape, np.int64)


def _folded_integer(call, values: list) -> np.ndarray | None:
    """``call`` evaluated on integer or boolean constant operands (``values``); None when it is not one of
    the index-arithmetic ops or an operand is not such a constant."""
    name = getattr(getattr(call, "op", None), "name", None)
    if any(v is None or v.dtype.kind not in "iub" for v in values):
        return None
    if name in _INTEGER and len(values) == 2:
        out = np.asarray(_INTEGER[name](values[0], values[1]))
        return out if name in _COMPARE else out.astype(values[0].dtype)
    if name == "relax.where" and len(values) == 3:
        return np.asarray(np.where(values[0], values[1], values[2])).astype(values[1].dtype)
    if name == "relax.take" and len(values) == 2:
        try:
            return np.asarray(np.take(values[0], values[1], axis=int(call.attrs.axis),
                                      mode=_TAKE_MODES[str(call.attrs.mode)]))
        except (IndexError, KeyError):  # an index out of range: left to TVM (and its error)
            return None
    return None


@relax.expr_functor.mutator
class _Fold(relax.PyExprMutator):
    def _bound(self, operand):
        if isinstance(operand, relax.Var):  # a chain: the previous fold's constant, bound to a variable
            return self.lookup_binding(operand)
        return operand

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.args:
            return call
        name = getattr(getattr(call, "op", None), "name", None)
        if name == "relax.shape_to_tensor":
            value = _static_shape_of(self._bound(call.args[0]))
        else:
            value = _folded(call, const_array(self._bound(call.args[0])))
            if value is None and (name in _INTEGER or name in ("relax.where", "relax.take")):
                value = _folded_integer(call, [const_array(self._bound(a)) for a in call.args])
        return call if value is None else relax.const(value, str(value.dtype))


@tvm.transform.module_pass(opt_level=0, name="FoldConstantLayouts")
def FoldConstantLayouts(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Fold reshapes and transposes of constants in every Relax function of ``mod``."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = _Fold(mod).visit_expr(func)
    return mod
