"""Tuning logs decoded one workload at a time, when a compile meets a kernel the logs have a record for.

Decoding a record (MetaSchedule's ``Workload.from_json`` and ``TuningRecord.from_json``) costs about 3 ms, and
the shipped x86 logs hold 115: 0.35-0.55 s of every compile in a fresh process, most of it for workloads the
model does not have. The lines are parsed (JSON) and checked up front, as :meth:`LogStore.load` does, and
indexed by each workload's structural hash; :func:`tvmfuse.passes.schedule.ApplyTuningLogs` asks for the
hashes of the kernels it is about to look up, and only those are decoded (once per process).
"""

from __future__ import annotations

import threading
import warnings

from .database import LogStore, _filled, warn_skipped
from .records import commit_records
from .workload_index import workload_hash


class LazyLogs:
    """The usable records of ``store`` (filled from ``fill_from`` as :meth:`LogStore.load` does), decoded on
    demand by :meth:`database_for`. ``report`` is the :class:`LoadReport` of the parse; a record that parses
    but does not decode is skipped with a warning when it is first needed."""

    def __init__(self, store: LogStore, fill_from: LogStore | None = None, warn: bool = True):
        from tvm.s_tir import meta_schedule as ms

        workloads, records, report = store.read()
        if fill_from is not None:
            workloads, records, report = _filled(workloads, records, report, fill_from)
        if warn and report.skipped:
            warn_skipped(report)
        self.spec, self.report, self.path = store.spec, report, store.path
        self.shared = store.spec.backend().shared_records  # look kernels up by their shared form too
        self._workloads = workloads
        self._by_hash: dict[str, list] = {}
        for index, record in records:
            self._by_hash.setdefault(workload_hash(workloads, index), []).append((index, record))
        self._db = ms.database.MemoryDatabase()
        self._decoded: set[str] = set()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_hash.values())

    def records_for(self, func) -> str:
        """The record lines filed under kernel ``func``'s workload hash, else under its shared form's
        (:mod:`.shared_form`), as one JSON string ('' for none): what a cached schedule of the kernel is keyed by
        besides the kernel (:mod:`tvmfuse.cache.schedules`)."""
        import json

        from .records import kernel_hash
        from .shared_form import shared_hash

        found = self._by_hash.get(kernel_hash(func)) or self.shared and self._by_hash.get(shared_hash(func))
        return json.dumps([record for _, record in found], sort_keys=True) if found else ""

    def database_for(self, hashes):
        """The MetaSchedule database holding (at least) every record of the workloads among ``hashes``."""
        with self._lock:
            todo = [h for h in hashes if h in self._by_hash and h not in self._decoded]
            bad = commit_records(self._db, self._workloads, [e for h in todo for e in self._by_hash[h]], self.spec)
            self._decoded.update(todo)
        if bad:
            warnings.warn(f"tuning logs {self.path}: skipped {len(bad)} undecodable record(s): {bad[0]}",
                          stacklevel=3)
        return self._db
