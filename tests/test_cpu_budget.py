"""tvmfuse.threads.cpu_budget: affinity and cgroup CPU quotas (v1, v2, hybrid), on fake cgroup trees."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tvmfuse import threads

CORES = len(os.sched_getaffinity(0))


def _tree(tmp_path, files: dict[str, str], proc: str):
    for rel, text in files.items():
        path = tmp_path / "cg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "cg").mkdir(exist_ok=True)
    (tmp_path / "proc_cgroup").write_text(proc)
    return tmp_path / "cg", tmp_path / "proc_cgroup"


def test_v2_quota_of_the_process_cgroup(tmp_path):
    root, proc = _tree(tmp_path, {"cgroup.controllers": "cpu", "cpu.max": "max 100000\n",
                                  "app/cpu.max": "150000 100000\n"}, "0::/app\n")
    assert threads.cgroup_cpu_quota(root, proc) == pytest.approx(1.5)
    assert threads.cpu_budget(root, proc) == 1  # rounded down: 2 threads would be throttled every period


def test_v2_smallest_quota_on_the_path_wins(tmp_path):
    root, proc = _tree(tmp_path, {"cgroup.controllers": "cpu", "kube/cpu.max": "100000 100000\n",
                                  "kube/pod/cpu.max": "max 100000\n"}, "0::/kube/pod\n")
    assert threads.cgroup_cpu_quota(root, proc) == pytest.approx(1.0)
    assert threads.cpu_budget(root, proc) == 1


def test_v2_without_quota_uses_affinity(tmp_path):
    root, proc = _tree(tmp_path, {"cgroup.controllers": "cpu", "cpu.max": "max 100000\n"}, "0::/\n")
    assert threads.cgroup_cpu_quota(root, proc) is None
    assert threads.cpu_budget(root, proc) == CORES


def test_v1_cfs_quota(tmp_path):
    root, proc = _tree(tmp_path, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
                                  "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                                  "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
                       "4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert threads.cgroup_cpu_quota(root, proc) == pytest.approx(0.5)
    assert threads.cpu_budget(root, proc) == 1  # never below one thread


def test_hybrid_v2_tree_under_unified(tmp_path):
    root, proc = _tree(tmp_path, {"unified/svc/cpu.max": "300000 100000\n", "cpu/cpu.cfs_quota_us": "-1\n",
                                  "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n0::/svc\n")
    assert threads.cgroup_cpu_quota(root, proc) == pytest.approx(3.0)
    assert threads.cpu_budget(root, proc) == min(CORES, 3)


@pytest.mark.parametrize("text", ["", "garbage", "0::/gone\n", "1:cpu:/../../etc\n"])
def test_unreadable_or_odd_cgroup_files_mean_no_quota(tmp_path, text):
    root, proc = _tree(tmp_path, {"cpu.max": "oops\n"}, text)
    assert threads.cgroup_cpu_quota(root, proc) is None
    assert threads.cpu_budget(root, proc) == CORES


@pytest.mark.skipif(CORES < 2, reason="needs 2 CPUs to restrict the affinity to 1")
def test_affinity_limits_the_pool_size_of_a_fresh_process():
    """Under ``taskset`` to one CPU, a fresh process gives TVM one thread (TVM alone counts all CPUs) once it imports
    tvmfuse's runtime, which every path that runs a kernel does (``tvmfuse.load``, ``compile``, calibration)."""
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); import tvmfuse.runtime, tvm; "
            "print(os.environ['TVM_NUM_THREADS'], tvm.runtime.num_threads())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]
