"""Timing contenders honestly on a noisy machine: one process, interleaved rounds, paired ratios.

Every contender is loaded and warmed before the first timed call. A round visits every contender once, in
a fresh random order; each visit is a pause (so the previous contender's spinning worker threads have
gone quiet), one untimed call (the first call after a pause wakes the pool) and a short block of timed
calls. Rounds continue until the interval of every ratio against the baseline is tight enough or the
budget is spent. See :mod:`.stats` for the estimate.
"""

from __future__ import annotations

import random
import time
from typing import Callable, Sequence

from .stats import paired_ratio, relative_half_width

PAUSE_S = 0.05  # between blocks: TVM (spin count 10,000) and ORT (spinning off) workers are asleep by then
BLOCK_S = 0.03  # target length of a timed block
MAX_BLOCK = 20  # calls per block at most
MIN_ROUNDS = 8
MAX_ROUNDS = 1000


def warm(fn: Callable[[], object], seconds: float = 0.2, calls: int = 3) -> float:
    """Call ``fn`` at least ``calls`` times and for about ``seconds``; return its fastest call (s)."""
    best, deadline, n = float("inf"), time.perf_counter() + seconds, 0
    while n < calls or (time.perf_counter() < deadline and n < 200):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        n += 1
    return best


def measure(fns: dict[str, Callable[[], object]], baseline: str, pairs: Sequence[tuple[str, str]] = (),
            budget_s: float = 60.0, target_ci: float = 0.02, seed: int = 0, min_rounds: int = MIN_ROUNDS,
            pause_s: float = PAUSE_S, clock=time.perf_counter, sleep=time.sleep) -> dict[str, list[list[float]]]:
    """Time ``fns`` (name -> callable) in rounds; return name -> per-round samples in ms.

    Stops when every ``(contender, baseline)`` in ``pairs`` (by default every contender against
    ``baseline``) has a relative interval half-width of at most ``target_ci`` after ``min_rounds``
    rounds, or when ``budget_s`` seconds have passed (at least 3 rounds are always run).
    """
    names = list(fns)
    if baseline not in fns:
        raise ValueError(f"baseline {baseline!r} is not among the contenders")
    pairs = list(pairs) or [(n, baseline) for n in names if n != baseline]
    block = {}
    for name in names:
        best = warm(fns[name])
        block[name] = max(1, min(MAX_BLOCK, round(BLOCK_S / max(best, 1e-6))))
    rng = random.Random(seed)
    rounds = {name: [] for name in names}
    start = clock()
    for i in range(MAX_ROUNDS):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            fn = fns[name]
            sleep(pause_s)
            fn()
            samples = []
            for _ in range(block[name]):
                t0 = clock()
                fn()
                samples.append((clock() - t0) * 1e3)
            rounds[name].append(samples)
        done = i + 1
        if done >= 3 and clock() - start >= budget_s:
            break
        if done >= min_rounds and all(relative_half_width(paired_ratio(rounds[a], rounds[b])) <= target_ci
                                      for a, b in pairs):
            break
    return rounds
