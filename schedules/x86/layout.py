"""Layout transforms (NCHW <-> NCHW[b]c) on x86: rows in parallel, the innermost axis vectorized."""

from __future__ import annotations

from tvm import s_tir, tirx

from ..blocked import TO_BLOCKED, TO_PLAIN
from ..common import block_names


def apply(func: tirx.PrimFunc, vector_lanes: int) -> tirx.PrimFunc | None:
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it is not a layout transform."""
    del vector_lanes  # the innermost axis is the block or the row, whatever the target's width
    names = block_names(sch)
    if names not in ([TO_BLOCKED], [TO_PLAIN]):
        return False
    loops = sch.get_loops(sch.get_sblock(names[0]))
    # to_blocked: (n, c/b, h, w, b); to_plain: (n, c, h, w). Whole rows per parallel iteration.
    sch.parallel(sch.fuse(*loops[:3]))
    sch.vectorize(loops[-1])
    return True
