"""Softmax along the last axis on x86 (the compute is :func:`..softmax.softmax`): one row per task.

Each row (all axes but the last, fused, in parallel) runs three passes over its values while they stay in
cache: the max (vector partials, rfactor), ``exp(x - max)`` stored once and added to the sum's vector
partials as it is stored, then the stored exponentials times one reciprocal of the sum. The default path ran each pass over the whole
tensor as its own parallel loop, computed every exponential twice (once for the sum, once for the output;
inlined) and divided per element: PP-OCRv6 tiny rec's 40 x 6912 head took 155-172 us on Zen 4, 2.3x
onnxruntime's Softmax.

A softmax with other stages fused around it gets its elementwise producers inlined (a scale before it) and
elementwise consumers inlined into its output; anything else is left to :mod:`.generic`. The row skeleton
is :mod:`.rows`'s.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..common import vectorize_steps
from ..computes.softmax import SOFTMAX_STAGES
from . import rows

MAX, EXP, SUM, RECIP, NORM = SOFTMAX_STAGES
ANCHOR = NORM  # the block its template's mark is on (the legalization puts it there)
Config = rows.Config


def _sum_with_exponentials(sch: s_tir.Schedule, partial) -> None:
    """Move the sum's vector partials into the exponentials' loop: each vector of ``exp(x - max)`` is added
    to the partials as it is stored, instead of read back in a pass of its own (40 x 18720: 150 -> 137 us
    alone on Zen 4). The partials' zeroing goes before that loop."""
    step = sch.get_loops(sch.get_sblock(EXP))[-2]
    sch.reverse_compute_at(partial, step)
    sch.vectorize(sch.get_loops(partial)[-1])
    sch.decompose_reduction(partial, step)


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False when the kernel is not a softmax along the last of two or
    more axes whose neighbours inline (``sch`` may then be partly changed: :func:`scheduled` starts afresh).
    ``softmax_delta`` (x - max) is inlined into the exponential. ``config``: the row step (one vector by
    default; the template samples it)."""
    if not rows.fits(sch, SOFTMAX_STAGES, NORM) or not rows.inline_neighbours(sch, NORM, SOFTMAX_STAGES):
        return False
    step, partials = rows.tile(sch, NORM, (MAX, SUM), (RECIP, SUM, EXP, MAX), vector_lanes, config)
    if step is not None:
        vectorize_steps(sch, sch.get_loops(sch.get_sblock(EXP))[-1], step)
        rows.vectorize_partial(sch, partials[MAX])
        _sum_with_exponentials(sch, partials[SUM])
    return True


def scheduled(func: tirx.PrimFunc, vector_lanes: int) -> s_tir.Schedule | None:
    """A schedule of ``func`` with this rule applied, or None when it does not fit (or fails part-way)."""
    return rows.scheduled(schedule, func, vector_lanes)
