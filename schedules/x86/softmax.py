"""Softmax along the last axis on x86 (the compute is :func:`..compute.softmax`): one row per task.

Each row (all axes but the last, fused, in parallel) runs three passes over its values while they stay in
cache: the max (vector partials, rfactor), ``exp(x - max)`` stored once and added to the sum's vector
partials as it is stored, then the stored exponentials times one reciprocal of the sum. The default path ran each pass over the whole
tensor as its own parallel loop, computed every exponential twice (once for the sum, once for the output;
inlined) and divided per element: PP-OCRv6 tiny rec's 40 x 6912 head took 155-172 us on Zen 4, 2.3x
onnxruntime's Softmax.

A softmax with other stages fused around it gets its elementwise producers inlined (a scale before it) and
elementwise consumers inlined into its output; anything else is left to :mod:`.generic`.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from ..common import block_names
from ..compute import SOFTMAX_STAGES
from .generic import PARALLEL_MIN, row_lanes

MAX, EXP, SUM, RECIP, NORM = SOFTMAX_STAGES


def _fits(sch: s_tir.Schedule) -> bool:
    names = block_names(sch)
    if not all(name in names for name in SOFTMAX_STAGES) or names.count(NORM) != 1:
        return False
    norm = sch.get(sch.get_sblock(NORM))
    rank = len(norm.iter_vars)  # a 1-D softmax (one row) is left to the generic schedule
    return rank > 1 and int(norm.annotations.get("axis", -1)) == rank - 1


def _inline_neighbours(sch: s_tir.Schedule) -> bool:
    """Inline every other stage (producers into their consumers, consumers of the output into it); False when
    one cannot be."""
    names = block_names(sch)
    after = names[names.index(NORM) + 1:]
    for name in names[:names.index(NORM)]:
        if name not in SOFTMAX_STAGES:  # softmax_delta (x - max) goes into the exponential
            try:
                sch.compute_inline(sch.get_sblock(name))
            except s_tir.ScheduleError:
                return False
    try:
        inline_consumers(sch, after)
    except s_tir.ScheduleError:
        return False
    return True


def inline_consumers(sch: s_tir.Schedule, after: list[str]) -> None:
    """The elementwise stages after a row kernel's output (named ``after``, in order) folded into it: each
    into the next, then the last into the output. One by one into the output instead, a stage that reads
    the output besides the first one (``x * (1 + erf(x / sqrt 2))``) would be left reading a buffer that no
    longer exists. Raises ``ScheduleError`` when a stage cannot be."""
    for name in after[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    if after:
        sch.reverse_compute_inline(sch.get_sblock(after[-1]))


def _vectorize_row(sch: s_tir.Schedule, loop, lanes: int):
    _, lane = sch.split(loop, [None, lanes])
    sch.vectorize(lane)


def _reduce_row(sch: s_tir.Schedule, block, spatial: int, lanes: int):
    """Split the row's reduction into ``lanes`` partial results (rfactor, before the stages move into the row
    loop: rfactor needs its block first in its loop nest); returns the partial block."""
    loop = sch.get_loops(block)[-1]
    _, lane = sch.split(loop, [None, lanes])
    return sch.rfactor(lane, spatial)


def _sum_with_exponentials(sch: s_tir.Schedule, partial) -> None:
    """Move the sum's vector partials into the exponentials' loop: each vector of ``exp(x - max)`` is added
    to the partials as it is stored, instead of read back in a pass of its own (40 x 18720: 150 -> 137 us
    alone on Zen 4). The partials' zeroing goes before that loop."""
    step = sch.get_loops(sch.get_sblock(EXP))[-2]
    sch.reverse_compute_at(partial, step)
    sch.vectorize(sch.get_loops(partial)[-1])
    sch.decompose_reduction(partial, step)


def schedule(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    """Apply the rule to ``sch`` in place; False when the kernel is not a softmax along the last of two or
    more axes whose neighbours inline (``sch`` may then be partly changed: :func:`scheduled` starts afresh)."""
    if not _fits(sch) or not _inline_neighbours(sch):
        return False
    norm = sch.get_sblock(NORM)
    loops = sch.get_loops(norm)
    extents = [int(sch.get(loop).extent) for loop in loops]
    width, rows = extents[-1], math.prod(extents[:-1])
    lanes = row_lanes(width, vector_lanes)
    vector = lanes >= 4 and width >= 2 * lanes
    partials = {}
    if vector:
        for name in (MAX, SUM):
            partials[name] = _reduce_row(sch, sch.get_sblock(name), len(loops) - 1, lanes)
    loops = sch.get_loops(norm)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    for name in (RECIP, SUM, EXP, MAX):
        sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        if name in partials:
            sch.compute_at(partials[name], row, preserve_unit_loops=True)
    if rows > 1 and rows * width >= PARALLEL_MIN:
        sch.parallel(row)  # before decompose_reduction, which leaves the row without compact dataflow
    if vector:
        _vectorize_row(sch, sch.get_loops(norm)[-1], lanes)
        _vectorize_row(sch, sch.get_loops(sch.get_sblock(EXP))[-1], lanes)
        loops = sch.get_loops(partials[MAX])  # under the row: lane, unit loops, then the reduction loop
        lane, step = loops[1], loops[-1]
        sch.reorder(step, lane)
        sch.vectorize(lane)
        _sum_with_exponentials(sch, partials[SUM])
    return True


def scheduled(func: tirx.PrimFunc, vector_lanes: int) -> s_tir.Schedule | None:
    """A schedule of ``func`` with this rule applied, or None when it does not fit (or fails part-way)."""
    try:
        sch = s_tir.Schedule(func)
        return sch if schedule(sch, vector_lanes) else None
    except s_tir.ScheduleError:
        return None
