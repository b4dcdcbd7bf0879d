"""Row kernels on x86, the skeleton :mod:`.softmax` and :mod:`.layer_norm` share: one row per task.

A row kernel reduces each row (all axes but the last) to a few values, then writes an output stage over the
row (``NORM``, annotated with its ``axis``). Each row's reductions keep vector partial results (rfactor),
every stage moves under the fused row loop (so a row stays in cache through its passes), the rows run in
parallel, and the output is written in whole vectors. Elementwise neighbours are inlined: producers into
their consumers, consumers into the output.
"""

from __future__ import annotations

import dataclasses
import math

from tvm import s_tir, tirx

from ..common import block_names, vectorize_steps
from .generic import PARALLEL_MIN, row_lanes


@dataclasses.dataclass(frozen=True)
class Config:
    """A row kernel's knob: ``step``, the elements each step of its row loops takes (a whole number of row
    vectors, :func:`steps`); each reduction keeps ``step`` partial results, so a step of several vectors
    adds into independent accumulators instead of waiting on one. None: one vector (the default); the
    template samples it."""

    step: object = None


def steps(width: int, vector_lanes: int) -> list[int]:
    """The steps a row of ``width`` can take: 1, 2 or 4 of its vectors (:func:`generic.row_lanes`), each
    dividing the row and at most half of it; [] when the row stays scalar (vectors under 4 lanes, or a row
    under two of them)."""
    lanes = row_lanes(width, vector_lanes)
    if lanes < 4 or width < 2 * lanes:
        return []
    return [lanes * v for v in (1, 2, 4) if width % (lanes * v) == 0 and width >= 2 * lanes * v]


def fits(sch: s_tir.Schedule, stages, norm: str) -> bool:
    """Whether every stage of the row kernel is there, its output once, over the last of two or more axes (a
    1-D kernel, one row, is left to the generic schedule)."""
    names = block_names(sch)
    if not all(name in names for name in stages) or names.count(norm) != 1:
        return False
    out = sch.get(sch.get_sblock(norm))
    rank = len(out.iter_vars)
    return rank > 1 and int(out.annotations.get("axis", -1)) == rank - 1


def inline_neighbours(sch: s_tir.Schedule, norm: str, keep) -> bool:
    """Inline the producers of ``norm`` not in ``keep`` and fold its consumers into it (:func:`inline_consumers`);
    False when one cannot be."""
    names = block_names(sch)
    try:
        for name in names[:names.index(norm)]:
            if name not in keep:
                sch.compute_inline(sch.get_sblock(name))
        inline_consumers(sch, names[names.index(norm) + 1:])
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


def _reduce_row(sch: s_tir.Schedule, block, spatial: int, lanes):
    """Split the row's reduction into ``lanes`` partial results (rfactor, before the stages move into the row
    loop: rfactor needs its block first in its loop nest); returns the partial block."""
    loop = sch.get_loops(block)[-1]
    _, lane = sch.split(loop, [None, lanes])
    return sch.rfactor(lane, spatial)


def vectorize_partial(sch: s_tir.Schedule, partial) -> None:
    """Vectorize a reduction's partials over their lanes, the reduction step outside them."""
    loops = sch.get_loops(partial)  # under the row: lane, unit loops, then the reduction loop
    lane, step = loops[1], loops[-1]
    sch.reorder(step, lane)
    sch.vectorize(lane)


def tile(sch: s_tir.Schedule, norm: str, reductions, stages, vector_lanes: int,
         config: Config | None = None) -> tuple[object, dict]:
    """Lay out a row kernel whose neighbours are inlined: ``reductions`` (stage names) get partials of the
    row step (``config.step``, else one vector; :func:`steps`) when the row takes whole vectors, ``stages``
    (innermost first) move under the fused row loop with their partials, the rows run in parallel when
    there is enough work, and ``norm`` is written a step at a time. Returns ``(step, partials)``: the step
    (None when the row stays scalar) and the partial block of each reduction, for the caller to finish."""
    out = sch.get_sblock(norm)
    loops = sch.get_loops(out)
    extents = [int(sch.get(loop).extent) for loop in loops]
    width, rows = extents[-1], math.prod(extents[:-1])
    candidates = steps(width, vector_lanes)
    step = (config.step if config is not None and config.step is not None else candidates[0]) if candidates else None
    partials = {}
    if step is not None:
        for name in reductions:
            partials[name] = _reduce_row(sch, sch.get_sblock(name), len(loops) - 1, step)
    loops = sch.get_loops(out)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    for name in stages:
        sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        if name in partials:
            sch.compute_at(partials[name], row, preserve_unit_loops=True)
    if rows > 1 and rows * width >= PARALLEL_MIN:
        sch.parallel(row)  # before any decompose_reduction, which leaves the row without compact dataflow
    if step is None:
        return None, partials
    kept = int(sch.get(out).writes[0].source.shape[-1])  # fewer than the row: a slice inlined into the output
    vectorize_steps(sch, sch.get_loops(out)[-1], step, kept if kept < width else None)
    return step, partials


def scheduled(schedule, func: tirx.PrimFunc, vector_lanes: int) -> s_tir.Schedule | None:
    """A schedule of ``func`` with the rule ``schedule(sch, vector_lanes)`` applied, or None when it does not
    fit (or fails part-way)."""
    try:
        sch = s_tir.Schedule(func)
        return sch if schedule(sch, vector_lanes) else None
    except s_tir.ScheduleError:
        return None
