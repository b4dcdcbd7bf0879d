"""FoldConstant: TVM's constant folding, run only on functions that have something to fold.

TVM's ``FoldConstant`` legalizes every operator call of a dataflow block to see whether the result is a
``call_tir`` with constant arguments, before it looks at the arguments: each conv2d, batch-norm and add of
the graph becomes a TE compute and a PrimFunc, and is thrown away. After the ONNX-level folding of the
frontend almost no call has constant arguments, so that work is all waste: 0.27 + 0.15 s of MobileNetV2's
1.55 s of graph work and passes, on every compile and on a compile whose kernels all come from the cache.

Here a module is handed to TVM's pass only when a call could fold: one whose arguments are all constants,
shapes or variables bound to them. Otherwise its functions get what TVM's pass does to a function with no
call to fold: variables bound to a constant or a shape replaced by it in their uses, unused bindings
removed. The result is the same module TVM's pass returns (a test compares them on the zoo).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import Constant, StringImm

# Leaves TVM's folder treats as known: constants, shapes, the callee of a call_tir, and the attribute-like
# arguments (a PrimValue, a StringImm, a DataTypeImm) that legalization reads.
_LEAVES = (Constant, relax.ShapeExpr, StringImm, tvm.ir.GlobalVar,
           *(getattr(relax.expr, name) for name in ("PrimValue", "DataTypeImm") if hasattr(relax.expr, name)))


def _known(expr, known_vars) -> bool:
    if isinstance(expr, _LEAVES):
        return True
    if isinstance(expr, relax.Var):
        return expr in known_vars
    if isinstance(expr, relax.Tuple):
        return all(_known(field, known_vars) for field in expr.fields)
    return False


def _scan(func: relax.Function) -> tuple[bool, dict]:
    """(whether a call of ``func`` could fold, the variables bound to a constant or a shape: var -> value)."""
    bound: dict = {}
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return False, bound
    for block in body.blocks:
        dataflow = isinstance(block, relax.DataflowBlock)
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            if isinstance(value, (Constant, relax.ShapeExpr)):
                bound[binding.var] = value
            elif dataflow and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                # zeros_like(x) and its kind legalize to a kernel without x, which TVM folds for any x
                if value.op.name.endswith("_like") or all(_known(arg, bound) for arg in value.args):
                    return True, bound
    return False, bound


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    """Every use of a variable bound to a constant or a shape replaced by the value, as TVM's folder does."""

    def __init__(self, values: dict, mod=None):
        super().__init__(mod)
        self.values = values

    def visit_var_(self, var):
        value = self.values.get(var)
        return value if value is not None else super().visit_var_(var)

    def visit_dataflow_var_(self, var):
        value = self.values.get(var)
        return value if value is not None else super().visit_dataflow_var_(var)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.FoldConstant")
def FoldConstant(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """``relax.transform.FoldConstant()`` where a call could fold; elsewhere what TVM's pass does to a function
    with no call to fold: variables bound to constants or shapes substituted, unused bindings removed."""
    funcs = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]
    scans = [_scan(f) for _, f in funcs]
    if any(folds for folds, _ in scans):
        return relax.transform.FoldConstant()(mod)
    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for (gv, func), (_, bound) in zip(funcs, scans):
        if bound:
            func = _Substitute(bound, mod).visit_expr(func)
        out[gv] = relax.analysis.remove_all_unused(func)
    return out
