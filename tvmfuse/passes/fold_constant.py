"""FoldConstant: TVM's constant folding, run only on the calls that can fold.

TVM's ``FoldConstant`` legalizes every operator call of a dataflow block to see whether the result is a
``call_tir`` with constant arguments, before it looks at the arguments: each conv2d, batch-norm and add of
the graph becomes a TE compute and a PrimFunc, and is thrown away. After the ONNX-level folding of the
frontend almost no call has constant arguments, so that work is all waste: 0.27 + 0.15 s of MobileNetV2's
1.55 s of graph work and passes, on every compile and on a compile whose kernels all come from the cache.

Here only the calls whose arguments are all constants, shapes or variables bound to them (or to such calls)
go to TVM's pass, as one function of their own; the results replace their variables' uses in the graph,
as do constants and shapes bound to variables, and unused bindings are removed: the module TVM's pass
returns (a test compares them on the zoo), for 0.34 s of the CRNN's fold instead of 1.10 s, and nothing
for a graph with no such call.

TVM folds a call by building its kernel with LLVM (~25 ms each). ``broadcast_to`` and ``reshape`` of a constant
to a static shape are computed in numpy instead (:func:`_fold_in_numpy`): TVM's ONNX ``Min``/``Max`` of a tensor
and a constant broadcasts the constant, and ddddocr_rec_int8's 22 ``DynamicQuantizeLinear`` made 92 such
kernels, 2.5 s of a 9 s compile.
"""

from __future__ import annotations

import dataclasses

import numpy as np
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


@dataclasses.dataclass
class _Scan:
    """What a function holds for the folder: variables bound to a constant or a shape (var -> value), the
    bindings of calls whose arguments are all known (in order: a call on earlier ones' results included),
    and whether it needs TVM's whole pass (a ``*_like`` call, which TVM folds whatever its input)."""

    bound: dict = dataclasses.field(default_factory=dict)
    calls: list = dataclasses.field(default_factory=list)
    whole: bool = False


def _scan(func: relax.Function) -> _Scan:
    scan = _Scan()
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return scan
    known: set = set()
    for block in body.blocks:
        dataflow = isinstance(block, relax.DataflowBlock)
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                continue
            value = binding.value
            if isinstance(value, (Constant, relax.ShapeExpr)):
                scan.bound[binding.var] = value
                known.add(binding.var)
            elif dataflow and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                # zeros_like(x) and its kind legalize to a kernel without x, which TVM folds for any x
                scan.whole |= value.op.name.endswith("_like")
                if all(_known(arg, known) for arg in value.args):
                    scan.calls.append(binding)
                    known.add(binding.var)
    return scan


_NUMPY = {"relax.broadcast_to": np.broadcast_to, "relax.reshape": np.reshape}


def _numpy_value(call: relax.Call, bound: dict) -> Constant | None:
    """``call`` on a constant and a static shape computed in numpy (:data:`_NUMPY`); None otherwise."""
    compute = _NUMPY.get(call.op.name)
    if compute is None or len(call.args) != 2:
        return None
    data, shape = (bound.get(arg, arg) if isinstance(arg, relax.Var) else arg for arg in call.args)
    if not isinstance(data, Constant) or not isinstance(shape, relax.ShapeExpr) \
            or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    value = data.value.numpy()
    return relax.const(np.array(compute(value, [int(d) for d in shape.values])), str(value.dtype))  # 0-d stays 0-d


def _fold_in_numpy(scan: _Scan) -> None:
    """Move the calls :func:`_numpy_value` computes from ``scan.calls`` to ``scan.bound`` (in order, so a call on
    an earlier one's result folds too)."""
    rest = []
    for binding in scan.calls:
        value = _numpy_value(binding.value, scan.bound)
        if value is None:
            rest.append(binding)
        else:
            scan.bound[binding.var] = value
    scan.calls = rest


def _fold_calls(mod: tvm.IRModule, scan: _Scan) -> dict:
    """TVM's pass on the calls of ``scan`` alone, as one function of its own: var -> the constant each folded
    to (those that did not fold are left out)."""
    bindings = [relax.VarBinding(var, value) for var, value in scan.bound.items()] + scan.calls
    calls = [b.var for b in scan.calls]
    out = relax.Var("folded", relax.TupleType([v.ty for v in calls]))
    body = relax.SeqExpr([relax.DataflowBlock(bindings + [relax.VarBinding(out, relax.Tuple(calls))])], out)
    gv = tvm.ir.GlobalVar("tvmfuse_fold_constant")
    scratch = {g: f for g, f in mod.functions_items() if not isinstance(f, relax.Function)}  # call_tir's PrimFuncs
    folded = relax.transform.FoldConstant()(tvm.IRModule({**scratch, gv: relax.Function([], body, out.ty)}))
    (fields,) = [b.value.fields for block in folded[gv].body.blocks for b in block.bindings if b.var.same_as(out)]
    return {var: f for var, f in zip(calls, fields) if isinstance(f, Constant)}


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
    """What ``relax.transform.FoldConstant()`` returns: calls whose arguments are all known folded by TVM's
    pass on them alone, variables bound to constants or shapes substituted, unused bindings removed."""
    funcs = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function)]
    scans = [_scan(f) for _, f in funcs]
    if any(scan.whole for scan in scans):
        return relax.transform.FoldConstant()(mod)
    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for (gv, func), scan in zip(funcs, scans):
        _fold_in_numpy(scan)
        values = {**scan.bound, **(_fold_calls(mod, scan) if scan.calls else {})}
        if values:
            func = _Substitute(values, mod).visit_expr(func)
        out[gv] = relax.analysis.remove_all_unused(func)
    return out
