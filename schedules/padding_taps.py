"""Skip the reduction steps of a convolution that read only padding.

A padded conv reads a ``pad_temp``-style stage, ``P = if_then_else(inside, data, 0)``. Every step of its
reduction adds ``P * W`` to an accumulator, so a step whose reads of ``P`` all fall in the padding adds
zeros. Large dilations make most steps like that: DeepLab's ASPP runs 3x3 convs with dilation 6, 12 and 18
on a 20x20 map, where 36 %, 64 % and 84 % of the multiply-adds are by padding. oneDNN's direct conv
kernels skip them the same way (per output row, the kernel rows that stay inside the image).

:func:`skip_padding_taps` works on a scheduled kernel. For each reduction block of the form
``acc = acc + P[...] * W[...]`` (operands in either order, either cast) it picks the innermost serial loop
around it that moves the padded index and holds that block alone, and wraps the loop's body in
``if <some read of P in this step is inside the data>``. The bounds of the reads come from
``tvm.sym.Analyzer.int_set`` over the loops inside the guard, so the test is exact per step and
conservative within it (a step that reads one real pixel runs whole). Dropped steps only ever added
``0 * W``: the results are unchanged for finite weights (up to the sign of a zero sum).

It runs after scheduling on every kernel, tuned or not (:func:`SkipPaddingTaps`); a kernel with no such
block (tensorized INT8, unpadded convs) is returned unchanged, and so is one whose guard would skip fewer
than ``MIN_SKIPPED`` of the guarded loop's steps (counted, :func:`_run_share`): the test can cost more than
it saves (see ``MIN_SKIPPED``).
"""

from __future__ import annotations

import itertools
import math

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad  # what tirx.BufferLoad builds


def _const(expr) -> int | float | None:
    return expr.value if isinstance(expr, (tirx.IntImm, tirx.FloatImm)) else None


def _conjuncts(cond) -> list:
    return _conjuncts(cond.a) + _conjuncts(cond.b) if isinstance(cond, tirx.And) else [cond]


def _interval(cond, axis_of: dict) -> dict | None:
    """``{axis: (lo, hi)}`` from a conjunction of ``c <= v``, ``v < c`` (and their mirrors) on block vars."""
    bounds: dict = {}
    for c in _conjuncts(cond):
        if not isinstance(c, (tirx.LE, tirx.LT, tirx.GE, tirx.GT)):
            return None
        a, b = c.a, c.b
        if isinstance(a, tirx.Var) and _const(b) is not None:
            var, k, var_first = a, int(_const(b)), True
        elif isinstance(b, tirx.Var) and _const(a) is not None:
            var, k, var_first = b, int(_const(a)), False
        else:
            return None
        if var not in axis_of:
            return None
        lo, hi = bounds.get(axis_of[var], (None, None))
        # Normalize to lo <= v < hi.
        upper = isinstance(c, (tirx.LT, tirx.LE)) == var_first
        if upper:
            hi = k + (1 if isinstance(c, (tirx.LE, tirx.GE)) else 0)
        else:
            lo = k + (0 if isinstance(c, (tirx.LE, tirx.GE)) else 1)
        bounds[axis_of[var]] = (lo, hi)
    return bounds


def _pad_stage(block) -> tuple | None:
    """``(buffer, {axis: (lo, hi)})`` when ``block`` writes ``P[v...] = if_then_else(inside, x, 0)``."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or block.init is not None:
        return None
    names = [iv.var for iv in block.iter_vars]
    if len(store.indices) != len(names) or any(not i.same_as(v) for i, v in zip(store.indices, names)):
        return None
    value = store.value
    if isinstance(value, tvm.ir.Call) and value.op.same_as(tvm.ir.Op.get("prim.if_then_else")):
        cond, _, other = value.args
    elif isinstance(value, tirx.Select):
        cond, other = value.condition, value.false_value
    else:
        return None
    if _const(other) != 0:
        return None
    bounds = _interval(cond, {v: axis for axis, v in enumerate(names)})
    if not bounds:
        return None
    return store.buffer, bounds


def _strip_cast(expr):
    return expr.value if isinstance(expr, tirx.Cast) else expr


def _padded_read(block, pads: dict):
    """The load of a padded buffer in ``block``'s ``acc = acc + P * W`` update, or None."""
    store = block.body
    if block.init is not None or not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return None
    add = store.value
    for acc, term in ((add.a, add.b), (add.b, add.a)):
        if (isinstance(acc, TensorLoad) and acc.source.same_as(store.buffer)
                and all(x.same_as(y) for x, y in zip(acc.indices, store.indices)) and isinstance(term, tirx.Mul)):
            for load in (_strip_cast(term.a), _strip_cast(term.b)):
                if isinstance(load, TensorLoad) and load.source in pads:
                    return load
    return None


def substitute(expr, binding: dict):
    """``expr`` with variables replaced by ``binding``'s values (index arithmetic only; ValueError else)."""
    if isinstance(expr, tirx.Var):
        return binding.get(expr, expr)
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return expr
    for kind in (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max):
        if isinstance(expr, kind):
            a, b = substitute(expr.a, binding), substitute(expr.b, binding)
            lanes_a, lanes_b = _lanes(a), _lanes(b)
            if lanes_a != lanes_b:  # a vector (a Ramp put in) meets a scalar: broadcast it, as TVM's own ops do
                if min(lanes_a, lanes_b) != 1:
                    raise ValueError(f"index vectors of {lanes_a} and {lanes_b} lanes")
                a, b = (tirx.Broadcast(a, lanes_b), b) if lanes_a == 1 else (a, tirx.Broadcast(b, lanes_a))
            return kind(a, b)
    raise ValueError(f"unsupported index expression {type(expr).__name__}")


def _lanes(expr) -> int:
    return tvm.runtime.DataType(str(expr.ty.dtype)).lanes


def _blocks_in(stmt) -> list:
    found = []

    def visit(s):
        if isinstance(s, s_tir.SBlockRealize):
            found.append(s)
        for child in _children(s):
            visit(child)

    visit(stmt)
    return found


def _children(s) -> list:
    if isinstance(s, tirx.SeqStmt):
        return list(s.seq)
    if isinstance(s, tirx.For):
        return [s.body]
    if isinstance(s, s_tir.SBlockRealize):
        return [s.block]
    if isinstance(s, s_tir.SBlock):
        return [s.body] + ([s.init] if s.init is not None else [])
    if isinstance(s, tirx.IfThenElse):
        return [s.then_case] + ([s.else_case] if s.else_case is not None else [])
    return []


def _guard(loops: list, realize, load, bounds: dict):
    """``(loop, condition)``: the loop whose body the guard wraps, or None."""
    binding = {iv.var: value for iv, value in zip(realize.block.iter_vars, realize.iter_values)}
    try:
        indices = {axis: substitute(load.indices[axis], binding) for axis in bounds}
    except ValueError:
        return None
    used = set().union(*(_vars(index) for index in indices.values()))
    for depth in range(len(loops) - 1, -1, -1):
        loop = loops[depth]
        if loop.kind != tirx.ForKind.SERIAL or loop.loop_var not in used:
            continue
        if len(_blocks_in(loop.body)) != 1:
            return None
        analyzer = tvm.sym.Analyzer()
        inner = {lp.loop_var: tvm.sym.IntervalSet(lp.min, lp.min + lp.extent - 1) for lp in loops[depth + 1:]}
        terms = []
        for axis, index in indices.items():
            span = analyzer.int_set(index, inner)
            lo, hi = bounds[axis]
            if lo is not None:
                terms.append(tirx.GE(span.max_value, lo))
            if hi is not None:
                terms.append(tirx.LT(span.min_value, hi))
        outer = {lp.loop_var: tvm.ir.Range.from_min_extent(lp.min, lp.extent) for lp in loops[:depth + 1]}
        for var, dom in outer.items():
            analyzer.bind(var, dom)
        cond = analyzer.simplify(_all(terms))
        if analyzer.can_prove(cond) or not _pays(terms, loops[:depth + 1]):
            return None  # no step of this loop reads only padding, or too few to pay for the test
        return loop, cond
    return None


# The share of a padded conv's steps a guard must skip to be worth it. A test around the taps can cost the
# register tile: with one, LLVM kept the tile of 32->64 3x3 on 73x73 (4-pixel tiles, the last holding one
# real pixel) in memory, a load and a store per tap and vector: 1.6-1.9 ms against 0.9 unguarded (Zen 4),
# for 1.4 % of the steps skipped. Ordinary padded convs skip 5-11 % (the border rows' outer taps); the
# dilated ASPP convs the guard is for skip 20-73 % at the tiles' granularity (dilation 6 to 18, 20x20 map).
MIN_SKIPPED = 0.15
_MAX_COUNTED = 4096
_OPS = {tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b, tirx.Mul: lambda a, b: a * b,
        tirx.FloorDiv: lambda a, b: a // b, tirx.FloorMod: lambda a, b: a % b, tirx.Min: min, tirx.Max: max,
        tirx.LT: lambda a, b: a < b, tirx.LE: lambda a, b: a <= b, tirx.GE: lambda a, b: a >= b,
        tirx.GT: lambda a, b: a > b, tirx.EQ: lambda a, b: a == b, tirx.And: lambda a, b: a and b}


def _eval(expr, env: dict):
    """``expr`` (index arithmetic and comparisons) at the variables' values in ``env``; ValueError else."""
    if isinstance(expr, tirx.Var):
        return env[expr]
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    op = _OPS.get(type(expr))
    if op is None:
        raise ValueError(f"cannot count {type(expr).__name__}")
    return op(_eval(expr.a, env), _eval(expr.b, env))


def _run_share(terms: list, loops: list) -> float | None:
    """The share of the steps of ``loops`` in which every term holds: terms that share variables counted
    together, each such group over the loops it reads (their shares multiply). None when a group reads
    something other than constant-range loops, has more than ``_MAX_COUNTED`` combinations, or an
    expression :func:`_eval` does not take."""
    groups: list = []  # [variables, terms]
    for term in terms:
        names, members = _vars(term.a) | _vars(term.b), [term]
        for group in [g for g in groups if g[0] & names]:
            groups.remove(group)
            names, members = names | group[0], members + group[1]
        groups.append([names, members])
    share = 1.0
    for names, members in groups:
        counted = [lp for lp in loops if lp.loop_var in names]
        if len(counted) != len(names) or any(not isinstance(lp.min, tirx.IntImm) or
                                             not isinstance(lp.extent, tirx.IntImm) for lp in counted):
            return None
        ranges = [range(int(lp.min), int(lp.min) + int(lp.extent)) for lp in counted]
        combos = math.prod(len(r) for r in ranges)
        if combos > _MAX_COUNTED:
            return None
        cond, held = _all(members), 0
        try:
            for values in itertools.product(*ranges):
                held += bool(_eval(cond, {lp.loop_var: v for lp, v in zip(counted, values)}))
        except (ValueError, KeyError, ZeroDivisionError):
            return None
        share *= held / combos
    return share


def _pays(terms: list, loops: list) -> bool:
    """Whether the steps ``terms`` skip (all must hold for a step to run) are at least ``MIN_SKIPPED`` of
    the loops' steps (True when they cannot be counted: the guard's behaviour before the count)."""
    share = _run_share(terms, loops)
    return share is None or 1.0 - share >= MIN_SKIPPED


def _all(terms: list):
    cond = terms[0]
    for term in terms[1:]:
        cond = tirx.And(cond, term)
    return cond


def _vars(expr) -> set:
    """The variables of an index expression made by :func:`_substitute`."""
    if isinstance(expr, tirx.Var):
        return {expr}
    return set().union(*(_vars(getattr(expr, f)) for f in ("a", "b") if hasattr(expr, f)))


def rebuild_loops(s, replace):
    """``s`` with each loop for which ``replace(loop)`` (called inner loops first) returns a statement replaced
    by it; the rest rebuilt as it was."""
    if isinstance(s, tirx.SeqStmt):
        return tirx.SeqStmt([rebuild_loops(x, replace) for x in s.seq])
    if isinstance(s, tirx.For):
        loop = tirx.For(s.loop_var, s.min, s.extent, s.kind, rebuild_loops(s.body, replace), s.thread_binding,
                        s.annotations, s.step)
        replaced = replace(loop)
        return loop if replaced is None else replaced
    if isinstance(s, s_tir.SBlockRealize):
        return s_tir.SBlockRealize(s.iter_values, s.predicate, rebuild_loops(s.block, replace))
    if isinstance(s, s_tir.SBlock):
        init = rebuild_loops(s.init, replace) if s.init is not None else None
        return s_tir.SBlock(s.iter_vars, s.reads, s.writes, s.name_hint, rebuild_loops(s.body, replace), init,
                            s.alloc_buffers, s.match_buffers, s.annotations)
    if isinstance(s, tirx.IfThenElse):
        other = rebuild_loops(s.else_case, replace) if s.else_case is not None else None
        return tirx.IfThenElse(s.condition, rebuild_loops(s.then_case, replace), other)
    return s


def _guarded(guards: dict):
    """A :func:`rebuild_loops` replacement wrapping each guarded loop's body in its condition."""
    originals = {(g.loop_var, int(g.extent)): cond for g, cond in guards.items()}

    def replace(loop):
        cond = originals.get((loop.loop_var, int(loop.extent)))
        if cond is None:
            return None
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, tirx.IfThenElse(cond, loop.body, None),
                        loop.thread_binding, loop.annotations, loop.step)

    return replace


def skip_padding_taps(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the reduction steps that read only padding skipped (unchanged when there are none)."""
    pads: dict = {}
    for realize in _blocks_in(func.body):
        found = _pad_stage(realize.block)
        if found is not None:
            pads[found[0]] = found[1]
    if not pads:
        return func
    guards: dict = {}

    def visit(s, loops):
        if isinstance(s, s_tir.SBlockRealize):
            load = _padded_read(s.block, pads)
            if load is not None:
                found = _guard(loops, s, load, pads[load.source])
                if found is not None:
                    guards[found[0]] = found[1]
        for child in _children(s):
            visit(child, loops + [s] if isinstance(s, tirx.For) else loops)

    visit(func.body, [])
    return func.with_body(rebuild_loops(func.body, _guarded(guards))) if guards else func


def SkipPaddingTaps() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """:func:`skip_padding_taps` on every PrimFunc of a module."""

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmfuse.SkipPaddingTaps")
    def _pass(func, _mod, _ctx):
        return skip_padding_taps(func)

    return _pass
