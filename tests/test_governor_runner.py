"""tvmfuse.runtime.governor in a real Runner and process: turned off by ``TVMFUSE_THREADS=fixed``, outputs exact whichever
pool size a call ran on, profiles on the whole pool, and busy processes moving calls to one thread (its rules
on scripted clocks: ``test_governor.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from tvmfuse.runtime import governor


def test_fixed_turns_it_off(monkeypatch):
    monkeypatch.setenv("TVMFUSE_THREADS", "fixed")
    assert not governor.enabled()
    monkeypatch.setenv("TVMFUSE_THREADS", "adaptive")
    assert governor.enabled()


def test_runner_outputs_are_exact_on_either_pool_size(compiled_tiny):
    """Force the calling thread's pool to one thread and back: the same input gives the same bits."""
    import tvm

    from tvmfuse.runtime import random_inputs

    cm = compiled_tiny
    x = random_inputs(cm.inputs, seed=3)
    ref = cm.run(x)
    gov = cm._get_runner()._local.governor
    assert gov is not None and gov.full == 2
    configure = tvm.get_global_func("runtime.config_threadpool")
    try:
        gov.single, gov._probe_at = True, float("inf")
        out = cm.run(x)
        assert tvm.runtime.num_threads() == 1
        for a, b in zip(out, ref):
            np.testing.assert_array_equal(a, b)
    finally:
        gov.single = False
        cm.run(x)
        assert tvm.runtime.num_threads() == 2
        configure(1, 2)


def test_profiling_runs_on_the_whole_pool_whatever_the_governor_chose(compiled_tiny):
    """An instrument hook slows every call; profiles run on the whole pool and leave the governor's mode alone."""
    import tvm

    from tvmfuse.runtime import random_inputs

    cm = compiled_tiny
    x = random_inputs(cm.inputs, seed=4)
    runner = cm._get_runner()
    gov = runner._local.governor
    configure = tvm.get_global_func("runtime.config_threadpool")
    try:
        gov.single, gov._probe_at = True, float("inf")
        cm.run(x)
        assert tvm.runtime.num_threads() == 1
        switches = gov.switches
        for a, b in zip(runner.run_whole_pool(x), cm.run(x)):
            np.testing.assert_array_equal(a, b)
        runner.run_whole_pool(x)
        assert tvm.runtime.num_threads() == 2 and gov.single and gov.switches == switches
    finally:
        gov.single = False
        cm.run(x)
        configure(1, 2)


@pytest.fixture(scope="module")
def compiled_tiny():
    import os

    if len(os.sched_getaffinity(0)) < 2 or os.environ.get("TVM_NUM_THREADS") == "1":
        pytest.skip("needs a 2-thread pool (2 CPUs)")
    if not governor.enabled():
        pytest.skip("TVMFUSE_THREADS=fixed")
    import tvmfuse

    return tvmfuse.compile(tvmfuse.zoo.get("tiny_convnet"), target="x86-host")


def test_busy_processes_move_calls_to_one_thread(tmp_path):
    """With a busy process per core in this session, the governor leaves the pool (where TVM's own pool
    ran 70-900x slower, bench/contention.py); in a fresh process, so the busy loops cannot outlive it."""
    import os
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    code = r'''
import subprocess, sys, time
import tvmfuse
from tvmfuse.runtime import random_inputs
cm = tvmfuse.compile(tvmfuse.zoo.get("tiny_convnet"), target="x86-host")
x = random_inputs(cm.inputs)
for _ in range(200):
    cm.run(x)
gov = cm._get_runner()._local.governor
quiet = gov.switches
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(sys.argv[1]))]
try:
    time.sleep(0.3)
    end = time.perf_counter() + 3.0
    while time.perf_counter() < end and not gov.single:
        cm.run(x)
    cm.run(x)
finally:
    for p in busy:
        p.kill()
print(quiet, gov.single, gov.threads)
'''
    env = {k: v for k, v in os.environ.items() if k != "TVMFUSE_THREADS"}
    out = subprocess.run([sys.executable, "-c", code, str(len(os.sched_getaffinity(0)))], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    quiet, single, threads = out.stdout.split()[-3:]
    assert single == "True" and threads == "1", out.stdout
