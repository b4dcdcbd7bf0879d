"""How many CPU threads tvmfuse's kernels use: the cores this process may run on, within its cgroup's quota.

TVM's own default is half of ``std::thread::hardware_concurrency()`` (it assumes hyper-threading), which
counts every online CPU: it ignores ``taskset``/``sched_setaffinity`` and a container's CPU quota, so a
process limited to 2 CPUs of a 64-core host would start 32 threads that a quota of 2 then throttles.
:func:`cpu_budget` is ``min(len(sched_getaffinity(0)), floor(cgroup quota / period))``, at least 1 (floor,
as Go's automaxprocs: with a quota of 1.5 CPUs, 2 busy threads use it up 75 ms into each 100 ms period
and are throttled for the rest, and a parallel kernel waits for its slowest thread); the quota is the smallest ``cpu.max`` (cgroup v2) or ``cpu.cfs_quota_us`` (v1) on the path from the process's
cgroup up to the root. ``TVM_NUM_THREADS`` set by the user wins (see :func:`configure`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """The process's cgroup v2 path and its v1 ``cpu`` controller path (either may be None)."""
    v2 = v1 = None
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _ancestors(base: Path, path: str) -> list[Path]:
    """``base/path`` and each of its parents up to ``base``, deepest first."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota, in CPUs, that the process's cgroups impose (the smallest on its path); None if none."""
    v2, v1 = _own_cgroup(proc_cgroup)
    quotas = []
    if v2 is not None:  # a hybrid host mounts the v2 tree at unified/
        base = root if (root / "cgroup.controllers").exists() or not (root / "unified").is_dir() else root / "unified"
        quotas += [_quota_v2(d) for d in _ancestors(base, v2)]
    if v1 is not None:
        for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            if (root / mount).is_dir():
                quotas += [_quota_v1(d) for d in _ancestors(root / mount, v1)]
                break
    quotas = [q for q in quotas if q is not None]
    return min(quotas) if quotas else None


def cpu_budget(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """Threads to use: the CPUs this process may run on, capped by its cgroup quota (rounded down), >= 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        cores = min(cores, math.floor(quota + 1e-9))
    return max(1, cores)


# How many times an idle pool thread calls sched_yield before it sleeps. TVM's 300,000 kept idle pool
# threads yielding for 0.1-0.5 s after every call on a quiet machine (seconds on a loaded one), CPU that
# other processes could use; 10,000 bridges the gaps between one call's kernels all the same (no
# measurable quiet loss in 40-round quiet runs of bench/contention.py). Under two busy processes it
# halved mobilenet_v2's slowdown with an earlier version of the governor (3.6x -> 1.7x, one run).
SPIN_COUNT = 10_000


def configure() -> None:
    """Set TVM's thread-pool environment defaults before TVM's pool starts; values the user set win."""
    os.environ.setdefault("TVM_NUM_THREADS", str(cpu_budget()))
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", str(SPIN_COUNT))
