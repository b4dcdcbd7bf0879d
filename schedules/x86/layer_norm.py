"""LayerNorm over the last axis on x86 (the compute is :func:`..layer_norm.layer_norm`): one row per task.

Each row (all axes but the last, fused, in parallel) runs its passes while its values stay in cache: the sum
(vector partials, rfactor), the sum of squared deviations (the deviation ``x - mean`` recomputed, not
stored), one reciprocal square root, then the normalized, scaled and shifted row in whole vectors.
Consumers that are elementwise are inlined into the output; anything else is left to :mod:`.generic`. The
row skeleton is :mod:`.rows`'s.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..computes.layer_norm import LAYER_NORM_STAGES, NORM, RSTD, SQSUM, SUM
from . import rows

ANCHOR = NORM  # the block its template's mark is on (the legalization puts it there)
Config = rows.Config


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False when the kernel is not this LayerNorm (``sch`` may then be
    partly changed: :func:`scheduled` starts afresh). The deviation (``ln_delta``) and other producers (a
    bias add before the norm) are inlined into their readers. ``config``: the row step (one vector by
    default; the template samples it)."""
    if not rows.fits(sch, LAYER_NORM_STAGES, NORM) or not rows.inline_neighbours(sch, NORM, (SUM, SQSUM, RSTD)):
        return False
    step, partials = rows.tile(sch, NORM, (SUM, SQSUM), (RSTD, SQSUM, SUM), vector_lanes, config)
    if step is not None:
        for partial in partials.values():
            rows.vectorize_partial(sch, partial)
    return True


def scheduled(func: tirx.PrimFunc, vector_lanes: int) -> s_tir.Schedule | None:
    """A schedule of ``func`` with this rule applied, or None when it does not fit (or fails part-way)."""
    return rows.scheduled(schedule, func, vector_lanes)
