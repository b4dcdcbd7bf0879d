"""Walking a lowered kernel (after the S-TIR passes): the x86 pipeline's passes rebuild only what they change."""

from __future__ import annotations

from tvm import tirx


def same(a, b) -> bool:
    """Whether two statements (either may be None) are the same node."""
    return (a is None and b is None) or (a is not None and b is not None and a.same_as(b))


def map_children(stmt, fn):
    """``stmt`` with ``fn`` applied to the statements it holds, for the kinds a lowered kernel nests others in
    (SeqStmt, For, IfThenElse, AttrStmt); the same node where nothing changed, and any other kind as it is."""
    if isinstance(stmt, tirx.SeqStmt):
        seq = [fn(s) for s in stmt.seq]
        return stmt if all(same(a, b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, tirx.For):
        body = fn(stmt.body)
        if same(body, stmt.body):
            return stmt
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step)
    if isinstance(stmt, tirx.IfThenElse):
        then, other = fn(stmt.then_case), (fn(stmt.else_case) if stmt.else_case is not None else None)
        if same(then, stmt.then_case) and same(other, stmt.else_case):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    if isinstance(stmt, tirx.AttrStmt):
        body = fn(stmt.body)
        return stmt if same(body, stmt.body) else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
    return stmt
