"""CanonicalizeClip: turn the importer's Clip lowering back into ``R.clip``.

TVM's ONNX importer lowers ``Clip(x, lo, hi)`` to ``call_tir(maximum, (x, lo))`` then
``call_tir(minimum, (., hi))`` (PrimFuncs from ``topi.maximum``/``topi.minimum``, named ``maximum``,
``maximum1``, ...). Fusion patterns want one ``relax.clip`` op, so the pair (or a lone maximum/minimum
against a scalar constant) is rewritten here; the PrimFuncs left unused are dropped.
"""

from __future__ import annotations

import re

import numpy as np
import tvm
from tvm import relax

from .utils import const_array, float_scalar

_NAME = re.compile(r"^(maximum|minimum)\d*$")
F32_MAX = float(np.finfo(np.float32).max)  # a bound not given


@relax.expr_functor.mutator
class _ClipRewriter(relax.PyExprMutator):
    def _min_max(self, call):
        """``(kind, tensor, bound)`` when ``call`` is call_tir(maximum|minimum, (tensor, scalar const))."""
        if not (isinstance(call, relax.Call) and call.op == tvm.ir.Op.get("relax.call_tir")):
            return None
        callee, args = call.args[0], call.args[1]
        if not isinstance(callee, tvm.ir.GlobalVar) or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
            return None
        m = _NAME.match(callee.name_hint)
        value = self._const(args.fields[1])  # maybe a guard folded above, bound to a var
        bound = float_scalar(value)
        if m is None or bound is None:
            return None
        return m.group(1), args.fields[0], bound

    def _const(self, expr):
        """numpy value of a constant, also through a var bound to one."""
        if isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        return const_array(expr) if expr is not None else None

    def _fold_guard(self, call):
        """Evaluate the importer's bound guards ``isnan(c)`` / ``where(cond, a, b)`` on constants in numpy.

        TVM's FoldConstant would build and run a kernel for each (seconds per model).
        """
        name = getattr(call.op, "name", "")
        if name not in ("relax.isnan", "relax.where"):
            return None
        values = [self._const(a) for a in call.args]
        if any(v is None for v in values):
            return None
        result = np.isnan(values[0]) if name == "relax.isnan" else np.where(*values)
        return relax.const(np.asarray(result, dtype=str(call.ty.dtype)))

    def visit_call_(self, call):
        call = super().visit_call_(call)
        folded = self._fold_guard(call)
        if folded is not None:
            return folded
        outer = self._min_max(call)
        if outer is None:
            return call
        kind, tensor, bound = outer
        lo, hi = (bound, F32_MAX) if kind == "maximum" else (-F32_MAX, bound)
        if kind == "minimum" and isinstance(tensor, relax.Var):
            # The inner maximum was visited first: one clip for the pair, merged only where lo <= hi (TVM's clip is
            # max(lo, min(x, hi)), ONNX's min(max(x, lo), hi), which is hi when lo > hi)
            inner = self._lower_bound(self.lookup_binding(tensor))
            if inner is not None and inner[1] <= hi:
                tensor, lo = inner
        return clip_op(tensor, lo, hi)

    def _lower_bound(self, call):
        """``(x, lo)`` of a lower bound alone: a relu (a maximum against 0 rewritten), ``R.clip(x, lo, float32
        max)`` (another maximum rewritten) or a maximum not rewritten; None for anything else."""
        if isinstance(call, relax.Call) and call.op == tvm.ir.Op.get("relax.nn.relu"):
            return call.args[0], 0.0
        if isinstance(call, relax.Call) and call.op == tvm.ir.Op.get("relax.clip"):
            lo, hi = (a.value if isinstance(a, tvm.tirx.FloatImm) else None for a in call.args[1:3])
            return (call.args[0], float(lo)) if lo is not None and hi == F32_MAX else None
        inner = self._min_max(call)
        return (inner[1], inner[2]) if inner is not None and inner[0] == "maximum" else None


def clip_op(tensor, lo: float, hi: float):
    """``min(max(tensor, lo), hi)`` (``lo <= hi``) as the one op the partition patterns take: ``R.nn.relu`` for
    0 and the float32 maximum, ``R.clip`` otherwise (the importer's direct form too, ``frontend/clip.py``)."""
    if lo == 0.0 and hi == F32_MAX:
        return relax.op.nn.relu(tensor)
    return relax.op.clip(tensor, lo, hi)


@tvm.transform.module_pass(opt_level=0, name="CanonicalizeClip")
def CanonicalizeClip(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Rewrite maximum/minimum call_tir pairs with scalar constant bounds into ``R.clip`` / ``R.nn.relu``."""
    rewriter = _ClipRewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())
