"""One compiled or loaded model, ``run`` and ``benchmark`` from many Python threads at once.

A Relax VM holds per-call state, so before ``Runner`` gave each thread its own VM, 8 threads sharing
one model crashed the process (segfault in ``AllocTensor``) on every try, and 2 threads raised
``TypeError`` / ``InternalError`` from inside the VM. Every output here is compared exactly with the
single-threaded result for the same input, and every wait has a timeout so a deadlock fails the test.

The threads here are long-lived daemon workers (:class:`Crew`), as a server keeps them: a thread that
ran TVM kernels leaves, when it exits, a CPU thread pool whose worker spins before it ends (see
``Runner``), which on a busy machine slowed this process for seconds. Exiting threads are tested in a
child process (:func:`test_short_lived_threads_release_their_vms`).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tvmfuse
from tvmfuse.runtime import random_inputs

N_THREADS = 8
CALLS = 50
TIMEOUT_S = 120


class Crew:
    """``n`` long-lived daemon threads; :meth:`run` gives job i to thread i and waits for all of them."""

    def __init__(self, n: int):
        self.jobs = [queue.Queue() for _ in range(n)]
        self.threads = [threading.Thread(target=self._work, args=(q,), daemon=True) for q in self.jobs]
        for t in self.threads:
            t.start()

    @staticmethod
    def _work(jobs: queue.Queue) -> None:
        while True:
            fn, done = jobs.get()
            try:
                fn()
                done.put(None)
            except BaseException as e:  # noqa: BLE001 - re-raised in the test thread by run()
                done.put(e)

    def run(self, fns, timeout: float = TIMEOUT_S) -> None:
        """Run ``fns`` at once, one per thread; re-raise the first failure; fail after ``timeout`` s."""
        assert len(fns) <= len(self.jobs)
        done: queue.Queue = queue.Queue()
        for q, fn in zip(self.jobs, fns):
            q.put((fn, done))
        deadline = time.monotonic() + timeout
        errors = []
        for finished in range(len(fns)):
            try:
                err = done.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                pytest.fail(f"{len(fns) - finished} of {len(fns)} threads still running after {timeout} s "
                            "(deadlock?)")
            if err is not None:
                errors.append(err)
        if errors:
            raise errors[0]


@pytest.fixture(scope="module")
def crew():
    return Crew(N_THREADS)


@pytest.fixture(scope="module")
def tiny_loaded(tiny_exported):
    return tvmfuse.load(tiny_exported)


@pytest.fixture(params=["compiled", "loaded"])
def model(request, tiny_compiled, tiny_loaded):
    return tiny_compiled if request.param == "compiled" else tiny_loaded


def _cases(model, n: int, first_seed: int = 100):
    """``n`` distinct seeded inputs and their single-threaded outputs."""
    inputs = [random_inputs(model.inputs, seed=first_seed + i) for i in range(n)]
    return inputs, [model.run(x) for x in inputs]


def _check(model, x, want, calls: int = 1) -> None:
    for _ in range(calls):
        got = model.run(x)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert np.array_equal(g, w), "output differs from the single-threaded result"


def test_a_thread_reusing_its_input_tensors_never_mixes_calls(model):
    # Each thread's input tensors are allocated once and refilled on every run: alternate inputs, keep the
    # returned arrays, and check that nothing from one call shows in another or in the caller's arrays.
    inputs, refs = _cases(model, 2, first_seed=300)
    copies = [{k: v.copy() for k, v in x.items()} for x in inputs]
    kept = [model.run(inputs[i % 2]) for i in range(4)]
    for i, got in enumerate(kept):
        assert all(np.array_equal(g, w) for g, w in zip(got, refs[i % 2])), i
    assert all(np.array_equal(x[k], c[k]) for x, c in zip(inputs, copies) for k in x)


def test_threads_share_one_model(model, crew):
    inputs, refs = _cases(model, N_THREADS)
    crew.run([lambda i=i: _check(model, inputs[i], refs[i], CALLS) for i in range(N_THREADS)])
    _check(model, inputs[0], refs[0])  # and the calling thread's VM still works


def test_benchmark_while_other_threads_run(model, crew):
    inputs, refs = _cases(model, 4, first_seed=200)
    stop = threading.Event()
    results = []

    def runner(i):
        while not stop.is_set():
            _check(model, inputs[i], refs[i])

    def bencher():
        try:
            for _ in range(3):
                results.append(model.benchmark(repeat=10, warmup=2))
        finally:
            stop.set()

    crew.run([lambda i=i: runner(i) for i in range(4)] + [bencher])
    assert len(results) == 3 and all(r["median_ms"] > 0 and r["repeat"] == 10 for r in results)
    assert model.benchmark(repeat=3, warmup=1)["median_ms"] > 0  # the calling thread too


def test_threads_started_after_first_call_get_their_own_vm(tiny_exported):
    model = tvmfuse.load(tiny_exported)
    inputs, refs = _cases(model, 4, first_seed=300)  # the first calls, in this thread
    main_vm = model._vm
    vms = []
    for wave in range(2):  # two waves of new threads, each creating its VM on its first call
        got = [None] * 4

        def work(i):
            _check(model, inputs[i], refs[i], 10)
            got[i] = model._vm

        Crew(4).run([lambda i=i: work(i) for i in range(4)])
        vms.extend(got)
    assert len({id(vm) for vm in vms}) == 8 and all(vm is not main_vm for vm in vms)
    assert model._vm is main_vm
    _check(model, inputs[0], refs[0])


SHORT_LIVED_CHILD = r"""
import gc, json, os, sys, threading, time, weakref
import numpy as np
import tvmfuse
from tvmfuse.runtime import random_inputs

model = tvmfuse.load(sys.argv[1])
inputs = [random_inputs(model.inputs, seed=400 + i) for i in range(50)]
refs = [model.run(x) for x in inputs]
tasks_before = len(os.listdir("/proc/self/task"))
vms, exact, errors, alive = [], [], [], 0

def once(i):
    try:
        got = model.run(inputs[i])
        exact.append(all(np.array_equal(g, w) for g, w in zip(got, refs[i])))
        vms.append(weakref.ref(model._vm))
    except Exception as e:
        errors.append(repr(e))

for batch in range(10):  # 50 threads, 5 at a time, each doing one run and exiting
    threads = [threading.Thread(target=once, args=(i,), daemon=True) for i in range(5 * batch, 5 * batch + 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    alive += sum(t.is_alive() for t in threads)
gc.collect()
deadline = time.monotonic() + 60
while len(os.listdir("/proc/self/task")) > tasks_before and time.monotonic() < deadline:
    time.sleep(0.02)
print(json.dumps({"alive": alive, "errors": errors, "exact": exact, "live_vms": sum(r() is not None for r in vms),
                  "extra_os_threads": len(os.listdir("/proc/self/task")) - tasks_before,
                  "still_exact": all(np.array_equal(g, w) for g, w in zip(model.run(inputs[0]), refs[0]))}))
"""


def test_short_lived_threads_release_their_vms(tiny_exported):
    # In a child process: TVM starts a CPU thread pool per calling thread, and an exited thread's pool
    # worker first spins TVM_THREAD_POOL_SPIN_COUNT times (about 0.5 s of sched_yield each, far more on a
    # busy machine) before it exits; spin count 0 lets the 50 pools wind down at once. What is checked
    # (VMs freed, pools gone, exact results) does not depend on the spin count.
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", TVM_THREAD_POOL_SPIN_COUNT="0")
    proc = subprocess.run([sys.executable, "-c", SHORT_LIVED_CHILD, str(tiny_exported)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["alive"] == 0 and result["errors"] == []
    assert len(result["exact"]) == 50 and all(result["exact"]) and result["still_exact"]
    assert result["live_vms"] == 0, "VMs of exited threads are still alive"
    assert result["extra_os_threads"] <= 0, "OS threads (TVM pools) of exited threads remain"


@pytest.mark.gpu
def test_threads_share_one_cuda_model(tmp_path):
    compiled = tvmfuse.compile("zoo:tiny_convnet", target="cuda-sm90")
    crew = Crew(N_THREADS + 1)
    for model in (compiled, tvmfuse.load(compiled.export(tmp_path / "gpu.so"))):
        inputs, refs = _cases(model, N_THREADS)
        crew.run([lambda i=i: _check(model, inputs[i], refs[i], 20) for i in range(N_THREADS)]
                 + [lambda: model.benchmark(repeat=10, warmup=2)])
