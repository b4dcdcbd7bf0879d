"""A tuning run's private database: ``<logs>/<target>/.runs/<id>/``, locked for as long as the run lives.

MetaSchedule appends every measured record to the run's JSON database as soon as a batch is measured, so a
run stopped by Ctrl-C or ``kill -9`` keeps everything measured so far. Only validated records move on to the
shared log (``LogStore.append``). A run folder whose lock nobody holds belongs to a run that ended without
finishing; ``--resume`` adopts the newest one and continues from its records.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

from .database import RECORDS, WORKLOADS, LogStore

RUNS = ".runs"


def _try_lock(path: Path):
    """An fd holding ``path``'s exclusive lock, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _drop_broken_lines(path: Path) -> int:
    """Rewrite ``path`` without lines that are not JSON (a line cut short by a kill); return how many."""
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    good = []
    for line in lines:
        if not line.strip():
            continue
        try:
            json.loads(line)
            good.append(line)
        except ValueError:
            pass
    dropped = sum(1 for line in lines if line.strip()) - len(good)
    if dropped:
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(g + "\n" for g in good), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


class StagingRun:
    """One run's folder and lock. Create with :meth:`create` or :meth:`adopt`; end with :meth:`release`."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd
        self.dropped_lines = 0

    @staticmethod
    def create(store: LogStore, info: dict) -> "StagingRun":
        path = store.path / RUNS / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        path.mkdir(parents=True)
        fd = _try_lock(path / ".lock")
        (path / "run.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        return StagingRun(path, fd)

    @staticmethod
    def orphans(store: LogStore) -> list[Path]:
        """Run folders nobody holds (ended without finishing), newest first."""
        found = []
        for path in sorted((store.path / RUNS).glob("*"), reverse=True):
            if not path.is_dir():
                continue
            fd = _try_lock(path / ".lock")
            if fd is not None:
                os.close(fd)
                found.append(path)
        return found

    @staticmethod
    def adopt(store: LogStore) -> "StagingRun | None":
        """Take over the newest unfinished run (its records count as trials done), or None."""
        for path in StagingRun.orphans(store):
            fd = _try_lock(path / ".lock")
            if fd is None:
                continue  # another --resume got there first
            run = StagingRun(path, fd)
            run.dropped_lines = _drop_broken_lines(path / WORKLOADS) + _drop_broken_lines(path / RECORDS)
            return run
        return None

    def database(self):
        from tvm.s_tir import meta_schedule as ms

        return ms.database.JSONDatabase(work_dir=str(self.path))

    def trials_by_workload(self) -> Counter:
        """Structural hash -> records measured in this run (failed candidates included: they were trials)."""
        hashes = []
        for line in (self.path / WORKLOADS).read_text().splitlines() if (self.path / WORKLOADS).exists() else []:
            hashes.append(json.loads(line)[0] if line.strip() else None)
        counts = Counter()
        if (self.path / RECORDS).exists():
            for line in (self.path / RECORDS).read_text().splitlines():
                if line.strip():
                    index = json.loads(line)[0]
                    if 0 <= index < len(hashes):
                        counts[hashes[index]] += 1
        return counts

    def release(self, remove: bool) -> None:
        """Drop the lock; with ``remove`` (the run finished) delete the folder."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)
            # Drop the parent .runs/ too when it is empty.
            try:
                self.path.parent.rmdir()
            except OSError:
                pass
