"""The tuning-log store: one MetaSchedule JSON database per target under ``<logs>/<target>/``.

The files are MetaSchedule's own (``database_workload.json``: one ``[structural hash, base64 IRModule]`` line per
workload; ``database_tuning_record.json``: one ``[workload line index, record]`` line per record), so
``ms.database.JSONDatabase(work_dir=...)`` opens them too. tvmfuse reads them line by line instead: a corrupt
line, a line for another target (the database does not record which target a folder is for) or a record
without a valid run time is skipped, counted and reported in one warning, never a crash. Only a folder that
cannot be used at all is an error (:class:`TuningLogError`, one line): the logs root or the target's folder
being a file, or one of the two files being a folder or unreadable.

Writers append under an exclusive ``flock`` on ``<dir>/.lock`` and look up workload indices inside the lock,
so two tuning runs appending at once neither interleave lines nor point records at the wrong workload.
A line cut short by a killed writer is a corrupt line for readers; the next writer starts a new line.

Either file may be shipped xz-compressed (``database_workload.json.xz``): a workload line is a base64 IRModule,
so the repository's x86 workloads are 21 MB plain and 0.4 MB as xz, which is what a clone, the package and a
lent GPU machine's 64 MiB calls carry. Readers take the plain file where both exist (a writer's); a writer
first expands a compressed file into its plain form, under the lock, and appends to that.

This module is below the compile path: it never tunes, builds or runs anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import warnings
from pathlib import Path
from typing import Iterable

from ..targets import TargetSpec
from .log_files import (RECORDS, WORKLOADS, XZ, TuningLogError, packed_path, read_lines, stored_path,
                        workload_entry)
from .records import commit_records
from .workload_index import INDEX, indexed, workload_hash

LOCK = ".lock"
ENV = "TVMFUSE_TUNING_LOGS"


def default_root() -> Path:
    """Where compile and tune look for logs: ``$TVMFUSE_TUNING_LOGS`` or the repository's ``tuning_logs/``."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return Path(__file__).resolve().parents[2] / "tuning_logs"


def target_key(spec: TargetSpec) -> str:
    """The folder name for ``spec``'s logs.

    A registered name is used as is, except ``x86-host``, which means another CPU on every machine: it gets
    the LLVM CPU name (``x86-host-znver3``). A raw target dict gets ``custom-<kind>-<cpu or arch>``.
    """
    cpu = str(spec.config.get("mcpu") or spec.config.get("arch") or "generic")
    if spec.name == "x86-host":
        return f"x86-host-{cpu}"
    if spec.name == "custom":
        return f"custom-{spec.kind}-{cpu}"
    return spec.name


# The features of the CPUs that x86-avx512's shipped logs were tuned for (its own, less none).
_AVX512_LOGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vbmi"})
# The shipped logs of AVX2-only CPUs: tuned on a Zen 3; of Intel's AVX-512 CPUs: tuned on a Sapphire Rapids.
_AVX2_LOGS_CPU = "znver3"
_INTEL_LOGS_CPU = "sapphirerapids"


def shipped_fallback(spec: TargetSpec) -> TargetSpec | None:
    """The target whose shipped logs serve ``x86-host`` for the kernels this CPU's own folder has no record of
    (None: no such target).

    ``x86-host`` means another CPU on every machine, and the shipped folders cover three classes: AMD's AVX-512 CPUs
    (Zen 4 and 5) read ``x86-avx512/`` (tuned on a Zen 4), Intel's AVX-512 CPUs ``x86-host-sapphirerapids/`` (tuned
    on a Sapphire Rapids; the Sapphire Rapids class, every Intel CPU with AMX, reads it as its own folder and has
    no fallback), and every AVX2 CPU without AVX-512 ``x86-host-znver3/``. The kernels are the same at the same
    vector width, so the records apply, but their tile sizes are those of the CPU they were tuned on: Zen 4's
    records made a Sapphire Rapids 1.08-1.18x slower than the default schedules on the zoo models (a 512-bit FMA is
    two 256-bit halves on a Zen 4; Intel's server cores retire two whole ones a cycle). ``tvmfuse tune MODEL`` on a
    CPU writes ``x86-host-<cpu>/``, whose records then come first.
    """
    from .. import targets

    if spec.name != "x86-host":
        return None
    features, cpu = spec.features(), str(spec.config.get("mcpu", ""))
    if "avx512f" in features and not cpu.startswith("znver"):
        return None if cpu == _INTEL_LOGS_CPU else TargetSpec("x86-host", dict(spec.config, mcpu=_INTEL_LOGS_CPU))
    if _AVX512_LOGS <= features:
        return targets.resolve("x86-avx512")
    if "avx2" in features and "avx512f" not in features and cpu != _AVX2_LOGS_CPU:
        return TargetSpec("x86-host", dict(spec.config, mcpu=_AVX2_LOGS_CPU))
    return None


def _target_identity(config) -> tuple[str, str]:
    """What must match between a record's target and the folder's: kind and CPU (or GPU arch)."""
    kind = str(config.get("kind", ""))
    cpu = str(config.get("mcpu") or config.get("arch") or "")
    return kind, cpu.removeprefix("sm_")  # a GPU arch is written "sm_90" or "90"


@dataclasses.dataclass
class LoadReport:
    """What reading a log folder found.

    Attributes
    ----------
    path : Path
        The folder.
    workloads, records : int
        Usable workloads and records.
    skipped : list of (str, int, str)
        ``(file name, line number, reason)`` for every line left out.
    """

    path: Path
    workloads: int = 0
    records: int = 0
    skipped: list = dataclasses.field(default_factory=list)
    # (folder, records) taken from another folder for the workloads this one has no record of (``fill_from``)
    filled_from: tuple | None = None

    def to_json(self) -> dict:
        out = {"path": str(self.path), "workloads": self.workloads, "records": self.records,
               "skipped_lines": len(self.skipped)}
        if self.filled_from is not None:
            out["filled_from"] = {"path": str(self.filled_from[0]), "records": self.filled_from[1]}
        return out


def _expand(path: Path) -> None:
    """Give ``path`` its plain form where only the compressed one is there (a writer appends to it): written
    beside it and renamed, so a reader sees the compressed file or the whole plain one, then the compressed
    one removed."""
    packed = packed_path(path)
    if path.exists() or not packed.exists():
        return
    lines = read_lines(path)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(partial, path)
    packed.unlink()
    (path.parent / INDEX).unlink(missing_ok=True)  # of the compressed file


class LogStore:
    """The tuning logs of one target.

    Parameters
    ----------
    root : str or Path
        The logs folder holding one subfolder per target (``tuning_logs/``).
    spec : TargetSpec
        The target; its records go to ``root / target_key(spec)``.
    """

    def __init__(self, root: str | Path, spec: TargetSpec):
        self.root = Path(root)
        self.spec = spec
        self.path = self.root / target_key(spec)

    def __repr__(self) -> str:
        return f"LogStore({str(self.path)!r})"

    # -- reading -------------------------------------------------------------------------------------------------
    def read(self):
        """Parse the folder into ``(workloads, records, report)``.

        ``workloads`` maps a workload's line index to its parsed ``[hash, payload]`` JSON (a compressed file with a
        current index: :class:`.workload_index.Workloads`, its lines read when a payload is first asked for);
        ``records`` is a list of ``(workload index, record JSON)`` whose workload exists and whose target fits.
        """
        report = LoadReport(self.path)
        for folder in (self.root, self.path):
            if folder.exists() and not folder.is_dir():
                raise TuningLogError(f"tuning logs: {folder} is not a folder")
        workloads = _indexed_workloads(self.path / WORKLOADS)
        if workloads is None:
            workloads = {}
            lines = read_lines(self.path / WORKLOADS)
        else:  # a compressed file with a current index: its lines are read when a payload is needed
            lines = []
        for i, line in enumerate(lines):
            try:
                workloads[i] = workload_entry(line)
            except (ValueError, RecursionError) as err:  # RecursionError: a line of deeply nested brackets
                report.skipped.append((WORKLOADS, i + 1, f"corrupt workload line: {str(err)[:200]}"))
        want = _target_identity(self.spec.config)
        records = []
        for i, line in enumerate(read_lines(self.path / RECORDS)):
            reason = None
            try:
                index, record = json.loads(line)
                reason = _check_record(index, record, workloads, want)
            except (ValueError, TypeError, RecursionError) as err:
                reason = f"corrupt record line: {str(err)[:200]}"
            if reason:
                report.skipped.append((RECORDS, i + 1, reason))
            else:
                records.append((index, record))
        report.workloads, report.records = len(workloads), len(records)
        return workloads, records, report

    def load(self, warn: bool = True, fill_from: "LogStore | None" = None):
        """A MetaSchedule ``MemoryDatabase`` with every usable record, and the :class:`LoadReport`.

        Lines that parse as JSON but that MetaSchedule cannot decode are skipped like corrupt ones. With
        ``fill_from``, that folder's records serve the workloads this one has no record of (``x86-host`` and
        the shipped logs of its class of CPU, :func:`shipped_fallback`); the report then names the folder that
        gave the records (this one, or ``fill_from`` alone when this one gave none) and counts what was taken.
        """
        from tvm.s_tir import meta_schedule as ms

        workloads, records, report = self.read()
        if fill_from is not None:
            workloads, records, report = _filled(workloads, records, report, fill_from)
        db = ms.database.MemoryDatabase()
        errors = commit_records(db, workloads, records, self.spec)
        report.records -= len(errors)
        report.skipped += [(RECORDS, None, f"undecodable record: {e}") for e in errors]
        if warn and report.skipped:
            warn_skipped(report)
        return db, report

    def stamp(self) -> tuple:
        """What identifies the folder's contents cheaply: size and modification time of both files."""
        out = []
        for name in (WORKLOADS, RECORDS):
            try:
                path = stored_path(self.path / name)
                st = path.stat()
                out.append((path.name, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    # -- writing -------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self):
        """Hold the folder's exclusive write lock (blocks until other writers are done)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise TuningLogError(f"tuning logs: cannot write to {self.path}: {err.strerror}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def append(self, entries: Iterable[tuple[list, list]]) -> int:
        """Append ``(workload JSON, record JSON)`` pairs under the lock; return how many records were written.

        A workload already in the file is referenced by its existing line; a new one is appended first.
        """
        entries = list(entries)
        if not entries:
            return 0
        with self.locked():
            for name in (WORKLOADS, RECORDS):
                _expand(self.path / name)
            index = {}
            lines = read_lines(self.path / WORKLOADS)
            for i, line in enumerate(lines):
                with contextlib.suppress(ValueError, TypeError, KeyError, IndexError, RecursionError):
                    index.setdefault(json.loads(line)[0], i)
            new_workloads, new_records = [], []
            count = len(lines)
            for workload, record in entries:
                if workload[0] not in index:
                    index[workload[0]] = count
                    count += 1
                    new_workloads.append(json.dumps(workload))
                new_records.append(json.dumps([index[workload[0]], record], separators=(",", ":")))
            _append_lines(self.path / WORKLOADS, new_workloads)
            _append_lines(self.path / RECORDS, new_records)
        return len(new_records)


def _filled(workloads: dict, records: list, report: LoadReport, other: LogStore):
    """``workloads``/``records`` with ``other``'s records for every workload (by structural hash) that has none
    here; the report says where they came from."""
    more_workloads, more_records, more = other.read()
    if not more_records:
        return workloads, records, report
    if not records and not report.skipped:
        return more_workloads, more_records, more
    have = {workload_hash(workloads, i) for i, _ in records}
    offset = max(workloads, default=-1) + 1
    taken = [(i + offset, r) for i, r in more_records if workload_hash(more_workloads, i) not in have]
    workloads = dict(workloads) | {i + offset: w for i, w in more_workloads.items()}
    report.records += len(taken)
    report.workloads += len({i for i, _ in taken})
    report.skipped += more.skipped
    report.filled_from = (other.path, len(taken))
    return workloads, records + taken, report


def _indexed_workloads(path: Path):
    """The workloads of ``path`` by the index of its compressed form (:mod:`.workload_index`), or None."""
    packed = stored_path(path)
    return indexed(packed) if packed.name.endswith(XZ) else None


def _check_record(index, record, workloads: dict, want: tuple[str, str]) -> str | None:
    """Why a parsed record line is unusable, or None."""
    if not isinstance(index, int) or not isinstance(record, list) or len(record) < 4:
        return "corrupt record line: not [workload index, record]"
    if index not in workloads:
        return f"record for workload line {index + 1}, which is missing or corrupt"
    run_secs, target = record[1], record[2]
    if not (isinstance(run_secs, list) and run_secs
            and all(isinstance(s, (int, float)) and math.isfinite(s) and 0 < s < 1e9 for s in run_secs)):
        return "record without a valid run time (failed candidate)"
    if not isinstance(target, dict):
        return "record without a target"
    got = _target_identity(target)
    if got != want:
        return f"foreign record: tuned for {got[0]} {got[1] or '(generic)'}, this folder is {want[0]} {want[1]}"
    return None


def _append_lines(path: Path, lines: list[str]) -> None:
    if not lines:
        return
    # A writer killed mid-line leaves no final newline: start on a fresh line so only that line is lost.
    prefix = ""
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            prefix = "" if f.read(1) == b"\n" else "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(prefix + "\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())


def warn_skipped(report: LoadReport) -> None:
    """One warning for all the lines a load left out, with the first few reasons."""
    first = "; ".join(f"{name}:{line or '?'}: {why}" for name, line, why in report.skipped[:3])
    more = f" (and {len(report.skipped) - 3} more)" if len(report.skipped) > 3 else ""
    warnings.warn(f"tuning logs {report.path}: skipped {len(report.skipped)} line(s): {first}{more}", stacklevel=3)
