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
_F32_MAX = float(np.finfo(np.float32).max)


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
        lo, hi = (bound, _F32_MAX) if kind == "maximum" else (-_F32_MAX, bound)
        if kind == "minimum" and isinstance(tensor, relax.Var):
            # The inner maximum was visited first and may already be a relu (maximum against 0).
            inner_call = self.lookup_binding(tensor)
            # merged only where lo <= hi: clip(x, lo, hi) is max(lo, min(x, hi)) in TVM, min(max(x, lo), hi) = hi
            # in ONNX when lo > hi
            if isinstance(inner_call, relax.Call) and inner_call.op == tvm.ir.Op.get("relax.nn.relu") and hi >= 0.0:
                tensor, lo = inner_call.args[0], 0.0
            elif _lower_clip(inner_call) is not None and _lower_clip(inner_call) <= hi:  # a maximum rewritten before
                tensor, lo = inner_call.args[0], _lower_clip(inner_call)
            else:
                inner = self._min_max(inner_call)
                if inner is not None and inner[0] == "maximum":
                    tensor, lo = inner[1], inner[2]
        if lo == 0.0 and hi == _F32_MAX:
            return relax.op.nn.relu(tensor)
        return relax.op.clip(tensor, lo, hi)


def _lower_clip(call) -> float | None:
    """The lower bound of ``R.clip(x, lo, <float32 max>)`` (a maximum alone, rewritten); None otherwise."""
    if not (isinstance(call, relax.Call) and call.op == tvm.ir.Op.get("relax.clip")):
        return None
    lo, hi = (a.value if isinstance(a, tvm.tirx.FloatImm) else None for a in call.args[1:3])
    return float(lo) if lo is not None and hi == _F32_MAX else None


@tvm.transform.module_pass(opt_level=0, name="CanonicalizeClip")
def CanonicalizeClip(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Rewrite maximum/minimum call_tir pairs with scalar constant bounds into ``R.clip`` / ``R.nn.relu``."""
    rewriter = _ClipRewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())
