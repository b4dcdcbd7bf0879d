"""Tuning's worker processes: started without what they do not need, and never left behind.

MetaSchedule's builders and runners run in ``tvm.exec.popen_worker`` processes. Each worker asks Linux to kill
it when the thread that started it goes away; every pool tvmfuse makes is closed on every exit path (normal
end, error, Ctrl-C), and an atexit net kills any worker of this process that is not someone else's (an RPC
server's), so a tuner stopped any way leaves no process behind.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import tempfile
import weakref
from pathlib import Path

# tvm-ffi imports PyTorch whenever it can (``try: import torch``), so with PyTorch installed every builder and
# runner worker paid a PyTorch import, and the builder pool is restarted for every batch: on the lent GPU
# machine (16 cores, PyTorch 2.11) a 400 s x86-avx512 tuning run measured 6 candidates. No worker needs it.
KEPT_OUT_OF_WORKERS = ("torch",)


@contextlib.contextmanager
def workers_without(modules=KEPT_OUT_OF_WORKERS):
    """Inside the block, Python processes started from this one (MetaSchedule's builder and runner workers)
    find each of ``modules`` unimportable: a package of that name that raises ImportError is put first on
    ``PYTHONPATH``. This process, and processes started outside the block, are untouched."""
    old = os.environ.get("PYTHONPATH")
    with tempfile.TemporaryDirectory(prefix="tvmfuse-workers-") as folder:
        for name in modules:
            (Path(folder) / name).mkdir()
            (Path(folder) / name / "__init__.py").write_text(
                f"raise ImportError('tvmfuse keeps {name} out of its tuning workers (tune/workers.py)')\n")
        os.environ["PYTHONPATH"] = os.pathsep.join([folder] + ([old] if old else []))
        try:
            yield Path(folder)
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old


POPEN_WORKER = "tvm.exec.popen_worker"
_tuned_here = False  # set once this process started tuning workers: the atexit net then looks for survivors


def _die_with_parent(parent: int) -> None:
    """Worker initializer (runs in every builder and runner process we start): ask Linux to SIGKILL the
    worker when the thread that started it goes away (``prctl(PR_SET_PDEATHSIG)``), so even a tuner killed
    with ``kill -9`` leaves no worker behind. TVM's ``PopenWorker`` has no option of its own for this."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the tuner died before the prctl: nobody will ever read our results
        os._exit(0)


def worker_initializer():
    """The initializer of every builder and runner pool: the worker dies with the thread that started it."""
    global _tuned_here
    _tuned_here = True
    return functools.partial(_die_with_parent, os.getpid())


def popen_workers(pid: int | None = None, recursive: bool = False) -> list:
    """The ``tvm.exec.popen_worker`` processes started by ``pid`` (default: this process); with ``recursive``,
    those started by its descendants too."""
    import psutil

    try:
        children = psutil.Process(os.getpid() if pid is None else pid).children(recursive=recursive)
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if POPEN_WORKER in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def kill_workers(exclude=(), timeout: float = 5.0) -> int:
    """Kill and reap the popen workers this process started (but those in ``exclude``, pids of workers that
    are not ours), with whatever they started; return how many workers."""
    import psutil

    workers = [w for w in popen_workers() if w.pid not in exclude]
    victims = list(workers)
    for worker in workers:
        try:
            victims.extend(worker.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    for victim in victims:
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=timeout)  # reaps our own children: no zombies either
    return len(workers)


_POOLS = weakref.WeakSet()  # every worker pool tvmfuse made, while it lives
_FOREIGN: set = set()  # popen workers this process had before it first tuned: someone else's (an RPC server)


def close_pool(pool) -> None:
    """Stop a ``PopenPoolExecutor`` now: drop its queued calls, kill its workers, join its threads, then kill
    any worker a thread started meanwhile. Safe to call twice."""
    if pool is None:
        return
    from tvm.support.popen_pool import kill_child_processes

    pool._threadpool.shutdown(wait=False, cancel_futures=True)  # no queued call may start a new worker
    # Kill the processes before PopenWorker.kill closes their pipes: a pool thread blocked reading a busy
    # worker holds the pipe's lock, so closing it first (what pool.shutdown does) waits for the worker to
    # finish (minutes, for a slow build). A dead worker's pipe gives that thread EOF at once.
    with pool._lock:
        workers = list(pool._worker_map.values())
    for worker in workers:
        proc = worker._proc
        if proc is not None:
            try:
                kill_child_processes(proc.pid)
                proc.kill()
            except (OSError, TypeError):
                pass
    if not pool._shutdown:
        pool.shutdown(wait=True)  # closes the pipes and joins the threads, which now return at once
    for worker in list(pool._worker_map.values()):
        try:
            worker.kill()
        except ImportError:  # interpreter shutting down
            pass


@contextlib.contextmanager
def reaping_workers():
    """Inside the block tvmfuse may start builder and runner workers; on leaving it, however (normal end,
    error, Ctrl-C), every popen worker this process started inside it is killed and reaped."""
    before = {w.pid for w in popen_workers()}
    _FOREIGN.update(before)
    try:
        yield
    finally:
        _close_all(exclude=before)


def _close_all(exclude, timeout: float = 5.0) -> None:
    """Close every pool tvmfuse made, then kill the popen workers of this process but those in ``exclude``."""
    for pool in list(_POOLS):
        close_pool(pool)
    kill_workers(exclude=exclude, timeout=timeout)


@atexit.register
def _kill_leftover_workers() -> None:
    """Safety net at interpreter exit (Ctrl-C and uncaught errors included): close the pools tvmfuse made and
    kill any popen worker of this process that is not someone else's."""
    if not _tuned_here:
        return
    try:
        _close_all(exclude=_FOREIGN, timeout=2.0)
    except Exception:  # noqa: BLE001 - never fail interpreter exit
        pass


def track_pool(pool) -> None:
    """Close ``pool`` with the others when :func:`reaping_workers` ends, and at interpreter exit."""
    _POOLS.add(pool)


def new_pool(max_workers, timeout, initializer):
    """A ``PopenPoolExecutor``, tracked (see :func:`track_pool`)."""
    from tvm.support.popen_pool import PopenPoolExecutor

    pool = PopenPoolExecutor(max_workers=max_workers, timeout=timeout, initializer=initializer)
    track_pool(pool)
    return pool
