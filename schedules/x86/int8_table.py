"""The table lookup after an INT8 kernel's requantize (``int8_epilogue.TABLE_STAGE``) on x86.

The rules schedule the kernel as without a table: the requantize stage, which then writes table indices, is
the epilogue they place in the accumulator's register tile. :func:`finish` places the lookup there too:

- with AVX512-VBMI, when the tile's innermost loop is 16 outputs, the indices stay in a local buffer and
  each 16 are looked up at once (the loop is marked for :mod:`.intrin.table_vbmi`, whose pass writes two
  ``vpermi2b`` and a select after scheduling);
- otherwise the lookup is inlined into the requantize stage: a byte load per output.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..common import block_names
from ..computes.int8_epilogue import EPILOGUE, TABLE_STAGE
from .intrin import table_vbmi

_INNER = (tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED)


def _tile(sch: s_tir.Schedule, block) -> int | None:
    """The depth of ``block``'s tile loop: its innermost loop that is neither unrolled nor vectorized; None
    when all are."""
    loops = sch.get_loops(block)
    return next((d for d in range(len(loops) - 1, -1, -1) if sch.get(loops[d]).kind not in _INNER), None)


def _vector_lookup(sch: s_tir.Schedule) -> bool:
    """Place the lookup in the requantize stage's tile, its 16-lane loop marked for the vector lookup (True);
    False (``sch`` untouched) when the tile's innermost loop is not 16 wide."""
    codes, lookup = sch.get_sblock(EPILOGUE), sch.get_sblock(TABLE_STAGE)
    loops, depth = sch.get_loops(codes), _tile(sch, codes)
    if depth is None or depth == len(loops) - 1 or int(sch.get(loops[-1]).extent) != table_vbmi.LANES:
        return False
    sch.reverse_compute_at(lookup, loops[depth], preserve_unit_loops=True)
    sch.set_scope(codes, 0, "local")
    *outer, inner = sch.get_loops(lookup)[depth + 1:]
    for loop in outer:
        sch.unroll(loop)
    sch.annotate(inner, table_vbmi.MARK, 1)  # table_vbmi.VectorTableLookups rewrites it after scheduling
    return True


def finish(sch: s_tir.Schedule, vbmi: bool, rescheduled, inlined_first=None) -> s_tir.Schedule:
    """``sch`` (a kernel's rule applied) with its table lookup placed (see the module); ``sch`` as it is when
    the kernel has none. ``rescheduled()`` gives the rule's schedule anew: when the vector lookup fails
    part-way, the byte loads go into a fresh one. ``inlined_first()``: the rule applied to the kernel with
    the lookup already inlined (:func:`inline`), for a schedule whose stages the lookup cannot be inlined
    into any more (a padding stage partitioned into nested blocks, as the float depthwise's)."""
    if TABLE_STAGE not in block_names(sch):
        return sch
    if vbmi:
        try:
            if _vector_lookup(sch):
                return sch
        except s_tir.ScheduleError:
            sch = rescheduled()
    try:
        sch.reverse_compute_inline(sch.get_sblock(TABLE_STAGE))
    except s_tir.ScheduleError:
        if inlined_first is None:
            raise
        return inlined_first()
    return sch


def inline(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its table lookup inlined into the requantize stage, before any rule (a byte load per
    output, as :func:`finish` places it)."""
    sch = s_tir.Schedule(func)
    sch.reverse_compute_inline(sch.get_sblock(TABLE_STAGE))
    return sch.mod["main"]
