"""Partition: group supported operators into named partitions with FuseOpsByPattern.

Each match becomes a private Relax function with ``Composite = "tvmfuse.<family>[_add][_<act>[_affine]]"``; weights
stay parameters (``bind_constants=False``) so the kernels take them as arguments. Ops outside partitions
are untouched and go through TVM's default path.

FuseOpsByPattern tries every pattern at every call and then rewrites the whole module once per pattern, matched or
not: the table's 60 patterns cost MobileNetV3 0.16 s, most of them for activations the model does not have.
A pattern can only match where each op it calls reads the value of the op it nests, so a pattern needing an op
the module never calls, or an op reading another's output where no binding of the module does, is left out
of the table handed to it (:func:`applicable`, over :func:`module_facts`); the rest keep their order.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .. import patterns


def Partition(rejections: dict | None = None, int8: bool = False,  # noqa: N802
              dtype: str = "float32") -> tvm.transform.Pass:
    """The partition pass. ``rejections`` (optional dict) collects why candidate groups were refused;
    ``int8``: partition a model to be quantized; ``dtype``: the build's float type (:func:`tvmfuse.patterns.table`)."""

    @tvm.transform.module_pass(opt_level=0, name="Partition")
    def _partition(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        table = applicable(patterns.table(rejections, int8, dtype), module_facts(mod))
        fuse = relax.transform.FuseOpsByPattern(table, bind_constants=False, annotate_codegen=False)
        return fuse(mod)

    return _partition


def is_partition(func) -> bool:
    """True for a partition function (a Relax function FuseOpsByPattern marked ``Composite``)."""
    return isinstance(func, relax.Function) and bool(func.attrs) and "Composite" in func.attrs


def composites(mod: tvm.IRModule) -> dict[str, relax.Function]:
    """The partition functions of ``mod``: global var name -> function."""
    return {gv.name_hint: func for gv, func in mod.functions_items() if is_partition(func)}


_MAX_ALTERNATIVES = 64  # past this many, a pattern's alternatives are merged into what all of them need


def module_facts(mod: tvm.IRModule) -> set:
    """What the Relax functions of ``mod`` hold, as :func:`required_ops` names it: the op names they call, and
    ``(producer, consumer)`` for each call of op ``consumer`` with an argument bound to a call of op ``producer``
    (in the same function, nested bodies included: the bindings the pattern matcher follows)."""
    facts: set = set()
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        values = {var: value for var, value in relax.analysis.get_var2val(func).items()
                  if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)}
        for value in values.values():
            consumer = value.op.name
            facts.add(consumer)
            for arg in value.args:
                producer = values.get(arg) if isinstance(arg, relax.Var) else None
                if producer is not None:
                    facts.add((producer.op.name, consumer))
    return facts


def applicable(table: list, facts: set) -> list:
    """The entries of ``table`` whose pattern has an alternative needing only what the module holds (``facts``,
    :func:`module_facts`), in order (the table's walk: about 5 ms)."""
    return [entry for entry in table if any(need <= facts for need in required_ops(entry.pattern))]


def required_ops(pattern, seen: dict | None = None) -> frozenset:
    """The ways DFPattern ``pattern`` can match, each as the set of what such a match needs (a frozenset of
    frozensets: a match needs all of one of them): the op names it calls, and ``(producer, consumer)`` where a
    call of op ``consumer`` takes the result of a call of op ``producer`` as an argument. A pattern kind not
    known here requires nothing (which keeps its entry). ``seen``: the subpatterns walked so far (a pattern
    shares them between its alternatives)."""
    return frozenset(need for _, need in _alternatives(pattern, {} if seen is None else seen))


def _alternatives(pattern, seen: dict) -> frozenset:
    """``{(root op name or None, needs)}``: each way ``pattern`` matches, with the op its match's root calls."""
    from tvm.relax.dpl import pattern as dpl

    if pattern in seen:
        return seen[pattern]

    def each(*parts):  # every part matches: one alternative of each, combined (roots: the parts' own)
        out = {((), frozenset())}
        for part in parts:
            out = {(roots + (root,), a | b) for roots, a in out for root, b in _alternatives(part, seen)}
        if len(out) > _MAX_ALTERNATIVES:
            out = {((None,) * len(parts), frozenset.intersection(*(need for _, need in out)))}
        return out

    found = frozenset({(None, frozenset())})
    if isinstance(pattern, dpl.CallPattern):
        op = pattern.op
        name = op.expr.name if isinstance(op, dpl.ExprPattern) and isinstance(op.expr, tvm.ir.Op) else None
        own = {name} if name else set()
        found = frozenset((name, need | own | {(root, name) for root in roots if root and name})
                          for roots, need in each(*pattern.args))
    elif isinstance(pattern, dpl.OrPattern):  # either side
        found = _alternatives(pattern.left, seen) | _alternatives(pattern.right, seen)
    elif isinstance(pattern, dpl.AndPattern):
        found = frozenset((None, need) for _, need in each(pattern.left, pattern.right))
    elif isinstance(pattern, (dpl.AttrPattern, dpl.DataTypePattern, dpl.ShapePattern, dpl.TypePattern)):
        found = _alternatives(pattern.pattern, seen)
    elif isinstance(pattern, dpl.TupleGetItemPattern):
        found = frozenset((None, need) for _, need in _alternatives(pattern.tuple, seen))
    elif isinstance(pattern, dpl.TuplePattern):
        found = frozenset((None, need) for _, need in each(*pattern.fields))
    seen[pattern] = found
    return found
