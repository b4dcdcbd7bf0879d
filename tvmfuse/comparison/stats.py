"""Statistics for latency comparisons: ratios paired per round, with a confidence interval.

A round visits every contender once, in a fresh random order, each for a short block of calls. The
machine's speed drifts (other jobs, frequency, the cache), but slowly compared to a round, so the ratio of
two contenders' block medians *within* a round cancels most of the drift that a ratio of overall medians
keeps. The estimate is the geometric mean of the per-round ratios and the interval a Student-t interval on
their logarithms (the log-ratio is closer to normal and symmetric in A and B).
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

CONFIDENCE = 0.95


def t_quantile(p: float, dof: int) -> float:
    """Quantile ``p`` of Student's t with ``dof`` degrees of freedom (Hill's 1970 expansion of the normal
    quantile; exact for dof 1 and 2, within 0.004 of the exact value at dof 3 and 1e-3 from dof 4 up)."""
    if dof < 1:
        raise ValueError("t_quantile needs dof >= 1")
    if dof == 1:  # Cauchy
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        a = 4 * p * (1 - p)
        return (2 * p - 1) * math.sqrt(2 / a)
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / dof + g2 / dof ** 2 + g3 / dof ** 3 + g4 / dof ** 4


def paired_ratio(rounds_a: Sequence[Sequence[float]], rounds_b: Sequence[Sequence[float]],
                 confidence: float = CONFIDENCE) -> dict:
    """Latency ratio ``a / b`` from per-round samples: ``{"ratio", "ci": [lo, hi], "rounds"}``.

    Rounds where either side has no sample are skipped. With fewer than 2 paired rounds the interval is
    unbounded (``[0, inf]`` written as ``[0.0, None]``).
    """
    logs = [math.log(statistics.median(a) / statistics.median(b))
            for a, b in zip(rounds_a, rounds_b) if a and b]
    n = len(logs)
    if n == 0:
        return {"ratio": None, "ci": [0.0, None], "rounds": 0}
    mean = statistics.fmean(logs)
    if n < 2:
        return {"ratio": math.exp(mean), "ci": [0.0, None], "rounds": n}
    half = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return {"ratio": math.exp(mean), "ci": [math.exp(mean - half), math.exp(mean + half)], "rounds": n}


def relative_half_width(estimate: dict) -> float:
    """Half the interval's width over the ratio (inf while the interval is unbounded)."""
    lo, hi = estimate["ci"]
    if hi is None or not estimate["ratio"]:
        return math.inf
    return (hi - lo) / 2 / estimate["ratio"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, linear interpolation between order statistics."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("percentile of no samples")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


P99_MIN_SAMPLES = 200  # below this the 99th percentile is the largest sample or two: not reported


def latency_summary(rounds: Sequence[Sequence[float]]) -> dict:
    """``{"rounds", "p50", "p90", "p99", "mean", "samples"}`` of per-round samples (ms); p99 is None with
    fewer than :data:`P99_MIN_SAMPLES` samples."""
    flat = [x for r in rounds for x in r]
    return {"rounds": [list(r) for r in rounds], "p50": percentile(flat, 50), "p90": percentile(flat, 90),
            "p99": percentile(flat, 99) if len(flat) >= P99_MIN_SAMPLES else None,
            "mean": statistics.fmean(flat), "samples": len(flat)}
