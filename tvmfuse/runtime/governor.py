"""Per calling thread, run the kernels on the whole thread pool or on the calling thread alone.

TVM splits each parallel kernel into one fixed chunk per thread and waits for every chunk. When other
processes compete for the cores, a descheduled pool thread holds up every kernel until the scheduler
runs it again, on every kernel of the model; the calling thread alone never waits for anyone. Measured
with ``bench/contention.py`` (2 cores, two busy processes in the same session, steady state): the whole
pool ran mobilenet_v2 in 354 ms, one thread in 13.2 ms, while quietly the pool is 1.9x faster.

The signal is the calls' own wall time. A whole-pool call ``SLOW`` times slower than the fastest one
since the last probe, and ``SLOW`` times slower than the fastest one-thread call seen, is contended;
``SLOW_CALLS`` contended calls among the last ``SLOW_WINDOW`` move the thread to one pool thread. (Quietly, a
small model's whole-pool calls can switch between two speeds 1.3x apart, both faster than one thread:
ppocrv5_cls, 0.64 and 0.84 ms against 0.95 ms.) Before one thread was ever timed, its speed is taken as
``SCALING`` times the pool's threads times the pool's best (1.5x on 2 threads). Both margins matter on a noisy
VM: a neighbour's steal time makes the pool's calls slow in spikes and makes one thread slow too, so a pool
only a little slower than one thread's best is no reason to move (ppocrv6_tiny_rec under light noise: pool
calls of 5.0-5.3 ms against one thread's best of 4.5 moved it, and one thread then ran 5.0-5.5 against the
pool's median of 3.1); and the whole VM slows down in phases, every contender alike (mobilenet_v3_large's pool
calls went from 3.7 to 6.0-6.4 ms, onnxruntime's and OpenVINO's as much, and as contention they moved it to
one thread, 1.7x slower than the pool). Under two busy processes, on the other hand, some pool calls get
through at near full speed, so contended calls need not come in a row.

On one thread, whenever one thread runs at its own best speed again (``CALM``: the cores may be free), or
``UNCALM_HOLDS`` holds after a probe would have been due (a light load that slows one thread for good), the
governor *probes* the whole pool for ``PROBE_CALLS`` calls and keeps whichever was faster. A
failed probe cost ``sum(probe) - calls * single``; the next one waits until at least
``cost / PROBE_SHARE`` more seconds were spent in calls, so probing costs at most ``PROBE_SHARE`` (3%) of
the time spent running the model; cheap failed probes back off by doubling, up to ``MAX_HOLD_S``. Holds
count time spent in calls, not the clock: a server idle between requests would otherwise probe on every
request. A winning probe resets the reference (the machine's speed drifts).

Calls right after the model sat idle (``IDLE_S`` since the last call ended), and a model's first calls, are
not evidence of contention: the pool's threads and the cores are asleep then (or the pages and caches cold:
ppocrv6_tiny_rec's first calls took 5.5, 5.1, 5.0 and 4.4 ms, then 2.5, against 4.2 on one thread, and as the
pool's steady speed they moved it to one thread), and on the KVM guests we measure on the first 3-4 calls
after a 0.2 s pause ran 1.7-3.3x slower than steady state (ConvNeXt: 4.07, 2.83, 2.73, 2.14, then 1.22 ms).
Counted, they moved every benchmark block of ``bench/real_models.py`` to one thread (convnext_tiny 1.96 ms
against 1.23-1.36 with the pool). So the first calls after an idle gap only count the time spent: at least
``WARM_CALLS`` of them and at least ``WARM_S`` of call time (the wake-up is time, not calls: ConvNeXt's took
11.8 ms; five 0.4 ms calls of a small classifier were not enough, and its INT8 build was moved to one thread
for a whole benchmark, 0.55 against 0.38 ms with the pool). The cost: a server whose every request is an
idle gap plus fewer calls than that is never moved to one thread under contention. One exception: a warm-up
call ``WAKE_MAX`` times slower than the reference and longer than ``WARM_S`` (longer than a whole wake-up) is
contention and counts. Under two busy processes mobilenet_v2's calls after a pause took 250-420 ms against 3.5
quietly, and the warm-up had kept the governor on the pool for five of them (2 s) before it could move.

Quietly, a small model can itself run faster on one thread: its kernels last a few microseconds, and waking
the other pool thread and waiting for it at every kernel costs more than the thread gives
(ppocr_mobile_v2_cls on Zen 4, 2 cores: 0.57 ms on the pool, 0.46 on one thread; INT8 0.67 / 0.48). So on the
whole pool the governor also probes one thread, once ``POOL_CALLS`` steady calls give the pool's median, and
under the same budget: a one-thread call not under ``WIN`` times that median ends the probe at once (a large
model pays one slow call, then the back-off), ``PROBE_CALLS`` all under ``WIN`` times it move the thread to one
thread, which then probes the pool as above. The two ``WIN`` margins keep a model whose two speeds are close
where it is.

``TVMFUSE_THREADS=fixed`` turns it off (every call uses the whole pool, TVM's behaviour).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import deque

SLOW = 1.3  # a whole-pool call this much slower than the reference is a contended call
SLOW_CALLS = 3  # contended calls among the last SLOW_WINDOW whole-pool calls that move to one thread
SLOW_WINDOW = 5
CALM = 1.15  # one thread runs within this of its fastest: the cores may be free again, worth a probe
UNCALM_HOLDS = 3  # ... or, probe after this many more holds anyway
PROBE_CALLS = 3  # whole-pool calls per probe (the first may wake sleeping pool threads)
WIN = 0.9  # the probe's fastest call must beat the one-thread median by this factor
PROBE_SHARE = 0.03
MIN_HOLD_S, MAX_HOLD_S = 0.05, 10.0
IDLE_S = 0.01  # a gap this long between calls lets the pool's threads (and the vCPUs) fall asleep
WARM_CALLS = 5  # calls after such a gap that say nothing about contention ...
WARM_S = 0.012  # ... nor does this much call time after it
SCALING = 0.75  # one thread's speed, before one was measured: the pool's times this share of its threads
WAKE_MAX = 10  # ... unless a call is this much slower than the reference and longer than WARM_S: contention
POOL_CALLS = 5  # steady whole-pool calls whose median a one-thread probe must beat

_pool = threading.local()  # .threads: what this OS thread's TVM pool is configured to (shared by its models)


def enabled() -> bool:
    return os.environ.get("TVMFUSE_THREADS", "adaptive") != "fixed"


class Governor:
    """Chooses the calling thread's pool size before each call; :meth:`done` gets the call's time."""

    def __init__(self, full: int, configure, clock=time.perf_counter, probe_one_thread: bool = True):
        """``probe_one_thread``: False leaves the pool only under contention (no quiet one-thread probes)."""
        self.full, self._configure, self._clock = full, configure, clock
        self.probe_one_thread = probe_one_thread
        self.single = False  # the thread's chosen mode
        self.switches = 0  # mode changes (for tests and reports)
        self._reference = float("inf")  # fastest whole-pool call since the last probe won
        self._slow: deque[bool] = deque(maxlen=SLOW_WINDOW)  # whether each recent whole-pool call was contended
        self._fastest_single = float("inf")
        self._single_walls: deque[float] = deque(maxlen=9)
        self._pool_walls: deque[float] = deque(maxlen=9)  # steady whole-pool calls since the last switch
        self._probe: list[float] | None = None  # walls of the probe under way (of the other mode)
        self._hold = MIN_HOLD_S
        self._spent = 0.0  # seconds spent in this thread's calls of this model
        self._probe_at = 0.0  # ... when the next probe may start
        self._last_end: float | None = None  # clock at the end of the last call
        self._warming = WARM_CALLS  # calls left that follow an idle gap (the first calls follow one too)
        self._warm_until = WARM_S  # ... and the call time (``_spent``) until which they say nothing

    @property
    def threads(self) -> int:
        """The calling thread's pool size now."""
        return getattr(_pool, "threads", self.full)

    def use_whole_pool(self) -> None:
        """Configure the calling thread's pool to its whole size for a call the governor does not judge (see
        ``Runner.run_whole_pool``); the chosen mode stays and applies again at the next :meth:`start`."""
        self._set(self.full)

    def _set(self, n: int) -> None:
        if n != self.threads:
            self._configure(1, n)  # kBig affinity mode, n threads, for this thread's pool only
            _pool.threads = n

    def _pool_probe_worth_it(self) -> bool:
        """On one thread: it runs near its best (CALM: the cores may be free), or it has not for UNCALM_HOLDS
        holds (a probe anyway: under a light, steady load one thread never gets back to its best)."""
        recent = list(self._single_walls)[-3:]
        return (len(recent) == 3 and statistics.median(recent) < CALM * self._fastest_single
                or self._spent >= self._probe_at + UNCALM_HOLDS * self._hold)

    def start(self) -> float:
        """Before a call: pick the pool size; returns the time to pass to :meth:`done`."""
        now = self._clock()
        if self._last_end is not None and now - self._last_end > IDLE_S:
            self._warming, self._warm_until = WARM_CALLS, self._spent + WARM_S
        warm = not self._warming and self._spent > self._warm_until  # a probe's calls must count
        due = self._probe is None and warm and self._spent >= self._probe_at
        if due and (self._pool_probe_worth_it() if self.single
                    else self.probe_one_thread and len(self._pool_walls) >= POOL_CALLS):
            self._probe = []
        self._set(1 if self.single == (self._probe is None) else self.full)
        return self._clock()

    def done(self, started: float) -> None:
        """After a call: learn from its wall time."""
        self._last_end = self._clock()
        wall = self._last_end - started
        if wall <= 0:
            return
        self._spent += wall
        if self._warming or self._spent <= self._warm_until:
            self._warming = max(0, self._warming - 1)
            if not (wall > WAKE_MAX * self._reference and wall > WARM_S):  # a wake-up, or too little to tell
                return
        if not self.single and self._probe is not None:
            self._probe_one_thread(wall)
            return
        if not self.single:
            one_thread = self._fastest_single  # one thread's best, else what near-linear scaling would give
            if one_thread == float("inf"):
                one_thread = SCALING * self.full * self._reference
            contended = wall > SLOW * self._reference and wall > SLOW * one_thread
            self._slow.append(contended)
            self._reference = min(self._reference, wall)
            if not contended:
                self._pool_walls.append(wall)
            if sum(self._slow) >= SLOW_CALLS:
                self._to_single([])
            return
        if self._probe is None:
            self._single_walls.append(wall)
            self._fastest_single = min(self._fastest_single, wall)
            return
        self._probe.append(wall)
        if len(self._probe) < PROBE_CALLS:
            return
        probe, self._probe = self._probe, None
        single = statistics.median(self._single_walls)
        if min(probe) < WIN * single:
            self.single, self._reference = False, min(probe)
            self._pool_walls.clear()
            self._switched()
            return
        self._back_off(sum(probe) - len(probe) * single)

    def _to_single(self, walls: list[float]) -> None:
        """Move to one thread; ``walls``: one-thread calls just measured (a won probe's)."""
        self.single = True
        self._single_walls.clear()
        self._single_walls.extend(walls)
        self._switched()

    def _switched(self) -> None:
        """After either switch: no slow calls counted, the shortest hold before the next probe."""
        self._slow.clear()
        self._hold, self._probe_at = MIN_HOLD_S, self._spent + MIN_HOLD_S
        self.switches += 1

    def _back_off(self, cost: float) -> None:
        """A failed probe cost ``cost`` seconds: the next waits until probing is at most PROBE_SHARE of the time."""
        self._hold = max(min(MAX_HOLD_S, 2 * self._hold), cost / PROBE_SHARE)
        self._probe_at = self._spent + self._hold

    def _probe_one_thread(self, wall: float) -> None:
        """A call of the one-thread probe made from the whole pool."""
        self._probe.append(wall)
        self._fastest_single = min(self._fastest_single, wall)
        pool = statistics.median(self._pool_walls)
        if wall < WIN * pool and len(self._probe) < PROBE_CALLS:
            return
        probe, self._probe = self._probe, None
        if max(probe) < WIN * pool:
            self._to_single(probe)
        else:
            self._back_off(max(0.0, sum(probe) - len(probe) * pool))
