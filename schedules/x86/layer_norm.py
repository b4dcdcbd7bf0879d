"""LayerNorm over the last axis on x86 (the compute is :func:`..layer_norm.layer_norm`): one row per task.

Each row (all axes but the last, fused, in parallel) runs its passes while its values stay in cache: the sum
(vector partials, rfactor), the sum of squared deviations (the deviation ``x - mean`` recomputed, not
stored), one reciprocal square root, then the normalized, scaled and shifted row in whole vectors.
Consumers that are elementwise are inlined into the output; anything else is left to :mod:`.generic`.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from ..common import block_names
from ..layer_norm import DELTA, LAYER_NORM_STAGES, NORM, RSTD, SQSUM, SUM
from .generic import PARALLEL_MIN, row_lanes
from .softmax import _reduce_row, _vectorize_row, inline_consumers


def _fits(sch: s_tir.Schedule) -> bool:
    names = block_names(sch)
    if not all(name in names for name in LAYER_NORM_STAGES) or names.count(NORM) != 1:
        return False
    norm = sch.get(sch.get_sblock(NORM))
    return int(norm.annotations.get("axis", -1)) == len(norm.iter_vars) - 1


def _inline_neighbours(sch: s_tir.Schedule) -> bool:
    """The deviation into its two readers, other producers (a bias add before the norm) into theirs,
    elementwise consumers of the output into it; False when one cannot be."""
    names = block_names(sch)
    try:
        for name in names[:names.index(NORM)]:
            if name not in (SUM, SQSUM, RSTD):
                sch.compute_inline(sch.get_sblock(name))
        inline_consumers(sch, names[names.index(NORM) + 1:])
    except s_tir.ScheduleError:
        return False
    return True


def schedule(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    """Apply the rule to ``sch`` in place; False when the kernel is not this LayerNorm (``sch`` may then be
    partly changed: :func:`scheduled` starts afresh)."""
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
        for name in (SUM, SQSUM):
            partials[name] = _reduce_row(sch, sch.get_sblock(name), len(loops) - 1, lanes)
    loops = sch.get_loops(norm)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    for name in (RSTD, SQSUM, SUM):
        sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
        if name in partials:
            sch.compute_at(partials[name], row, preserve_unit_loops=True)
    if rows > 1 and rows * width >= PARALLEL_MIN:
        sch.parallel(row)
    if vector:
        _vectorize_row(sch, sch.get_loops(norm)[-1], lanes)
        for partial in partials.values():
            loops = sch.get_loops(partial)  # under the row: lane, unit loops, then the reduction loop
            lane, step = loops[1], loops[-1]
            sch.reorder(step, lane)
            sch.vectorize(lane)
    return True


def scheduled(func: tirx.PrimFunc, vector_lanes: int) -> s_tir.Schedule | None:
    """A schedule of ``func`` with this rule applied, or None when it does not fit (or fails part-way)."""
    try:
        sch = s_tir.Schedule(func)
        return sch if schedule(sch, vector_lanes) else None
    except s_tir.ScheduleError:
        return None
