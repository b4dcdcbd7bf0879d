"""Partition: group supported operators into named partitions with FuseOpsByPattern.

Each match becomes a private Relax function with ``Composite = "tvmfuse.<family>[_add][_<act>[_affine]]"``; weights
stay parameters (``bind_constants=False``) so the kernels take them as arguments. Ops outside partitions
are untouched and go through TVM's default path.

FuseOpsByPattern tries every pattern at every call: the table's 60 patterns cost MobileNetV3 0.16 s, most of
them for activations the model does not have. Patterns that call an op the module never calls cannot match,
so they are left out of the table handed to it (:func:`applicable`); the rest keep their order.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .. import patterns
from .utils import called_ops


def Partition(rejections: dict | None = None, int8: bool = False,  # noqa: N802
              dtype: str = "float32") -> tvm.transform.Pass:
    """The partition pass. ``rejections`` (optional dict) collects why candidate groups were refused;
    ``int8``: partition a model to be quantized; ``dtype``: the build's float type (:func:`tvmfuse.patterns.table`)."""

    @tvm.transform.module_pass(opt_level=0, name="Partition")
    def _partition(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        table = applicable(patterns.table(rejections, int8, dtype), called_ops(mod))
        fuse = relax.transform.FuseOpsByPattern(table, bind_constants=False, annotate_codegen=False)
        return fuse(mod)

    return _partition


def is_partition(func) -> bool:
    """True for a partition function (a Relax function FuseOpsByPattern marked ``Composite``)."""
    return isinstance(func, relax.Function) and bool(func.attrs) and "Composite" in func.attrs


def composites(mod: tvm.IRModule) -> dict[str, relax.Function]:
    """The partition functions of ``mod``: global var name -> function."""
    return {gv.name_hint: func for gv, func in mod.functions_items() if is_partition(func)}


_MAX_ALTERNATIVES = 64  # past this many, a pattern's alternatives are merged into what all of them call


def applicable(table: list, ops: set[str]) -> list:
    """The entries of ``table`` whose pattern has an alternative calling only ops in ``ops``, in order (the
    table's walk: about 5 ms)."""
    return [entry for entry in table if any(need <= ops for need in required_ops(entry.pattern))]


def required_ops(pattern, seen: dict | None = None) -> frozenset:
    """The ways DFPattern ``pattern`` can match, each as the set of op names such a match calls (a frozenset of
    frozensets: a match calls every op of one of them). A pattern kind not known here requires nothing (which
    keeps its entry). ``seen``: the subpatterns walked so far (a pattern shares them between its alternatives)."""
    from tvm.relax.dpl import pattern as dpl

    seen = {} if seen is None else seen
    if pattern in seen:
        return seen[pattern]

    def each(*parts):  # every part matches: one alternative of each, combined
        out = {frozenset()}
        for part in parts:
            out = {a | b for a in out for b in required_ops(part, seen)}
        if len(out) > _MAX_ALTERNATIVES:
            out = {frozenset.intersection(*out)}
        return frozenset(out)

    found = frozenset({frozenset()})
    if isinstance(pattern, dpl.CallPattern):
        op = pattern.op
        own = {op.expr.name} if isinstance(op, dpl.ExprPattern) and isinstance(op.expr, tvm.ir.Op) else set()
        found = frozenset(need | own for need in each(*pattern.args))
    elif isinstance(pattern, dpl.OrPattern):  # either side
        found = required_ops(pattern.left, seen) | required_ops(pattern.right, seen)
    elif isinstance(pattern, dpl.AndPattern):
        found = each(pattern.left, pattern.right)
    elif isinstance(pattern, (dpl.AttrPattern, dpl.DataTypePattern, dpl.ShapePattern, dpl.TypePattern)):
        found = required_ops(pattern.pattern, seen)
    elif isinstance(pattern, dpl.TupleGetItemPattern):
        found = required_ops(pattern.tuple, seen)
    elif isinstance(pattern, dpl.TuplePattern):
        found = each(*pattern.fields)
    seen[pattern] = found
    return found
