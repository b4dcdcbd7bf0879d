"""How fast each core does float32 multiply-adds right now, all cores busy at once: a check that a run was quiet.

    python bench/vcpu_probe.py [--rounds 3]

One process per core, pinned to it, each running the same single-threaded float32 matrix products (NumPy's
BLAS, one thread; 256 x 256, in L2) at the same moment, then summing a 64 MiB array of its own. It prints
each core's GFLOP/s and GB/s per round, and their spread (fastest over slowest core).

Why: on the shared VMs we measure on, the cores under our vCPUs slow down in phases, and unequally (Zen 4, 2
vCPUs: the same loop 0.64-0.88x or 1.14-1.53x between the two in slow phases, 0.97-1.04x quietly, with the
guest's steal time at 0-3%). TVM gives each thread a fixed half of every parallel loop and waits for both, so
in such a phase every kernel runs at the slower core's speed, while onnxruntime's pool hands the faster core
more blocks: the ratio against onnxruntime moves with the phase. ``bench/real_models.py`` prints this probe
before and after its run. Unequal or low figures mean a slow phase; level figures at the usual speed (Zen 4
here: ~95-100 GFLOP/s a core) do not prove a quiet run: small, memory-latency-bound models (crnn) ran 1.5x
their quiet time in a minute where the probe read 96-101 GFLOP/s on both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

N = 256  # matrix side: 3 x 256 KiB of float32, in L2
PRODUCTS = 400  # per core per round: ~13 GFLOP, 0.1-0.2 s on a Zen 4 core
STREAM, READS = 16 << 20, 4  # then each core sums its own 64 MiB array 4 times: memory read speed

_CHILD = """
import os, sys, time, json
os.sched_setaffinity(0, {int(sys.argv[1])})
import numpy as np
a = np.random.default_rng(0).random((%(n)d, %(n)d), dtype=np.float32)
b = a.copy()
big = np.ones(%(m)d, np.float32)  # 64 MiB: read from memory, not cache
a @ b  # warm
big.sum()
start = float(sys.argv[2])
while time.time() < start:
    pass
t = time.perf_counter()
for _ in range(%(k)d):
    a @ b
fma = time.perf_counter() - t
t = time.perf_counter()
for _ in range(%(r)d):
    big.sum()
print(json.dumps([fma, time.perf_counter() - t]))
""" % {"n": N, "k": PRODUCTS, "r": READS, "m": STREAM}


def probe(rounds: int = 3) -> list[list[tuple[float, float]]]:
    """Per round, each core's (GFLOP/s, GB/s read) (cores in ``os.sched_getaffinity`` order), all cores at once."""
    cores = sorted(os.sched_getaffinity(0))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    flop, read = 2 * N ** 3 * PRODUCTS, 4 * STREAM * READS
    out = []
    for _ in range(rounds):
        start = time.time() + 1.0  # each child imports NumPy first, then waits for the common start
        procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(c), str(start)], env=env,
                                  stdout=subprocess.PIPE, text=True) for c in cores]
        seconds = [json.loads(p.communicate()[0]) for p in procs]
        out.append([(flop / f / 1e9, read / m / 1e9) for f, m in seconds])
    return out


def summary(rounds: list[list[tuple[float, float]]]) -> str:
    """One line: each round's per-core GFLOP/s and GB/s, with the spread of each (fastest over slowest core)."""
    def part(values, fmt):
        return "/".join(fmt.format(v) for v in values) + f" ({max(values) / min(values):.2f})"

    return "per core, all busy: GFLOP/s (spread), GB/s read (spread): " + ", ".join(
        part([f for f, _ in r], "{:.0f}") + " " + part([m for _, m in r], "{:.1f}") for r in rounds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    print(summary(probe(args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
