"""Layout transforms (NCHW <-> NCHW[b]c) on x86: rows in parallel, the innermost axis vectorized."""

from __future__ import annotations

from tvm import s_tir, tirx

from ..blocked import TO_BLOCKED, TO_PLAIN
from ..common import block_names


def apply(func: tirx.PrimFunc, vector_lanes: int) -> tirx.PrimFunc | None:
    sch = s_tir.Schedule(func)
    names = block_names(sch)
    if names not in ([TO_BLOCKED], [TO_PLAIN]):
        return None
    loops = sch.get_loops(sch.get_sblock(names[0]))
    # to_blocked: (n, c/b, h, w, b); to_plain: (n, c, h, w). Whole rows per parallel iteration.
    sch.parallel(sch.fuse(*loops[:3]))
    sch.vectorize(loops[-1])
    return sch.mod["main"]
