"""The tuning-log files of a folder and how they are read: plain, or xz-compressed as the shipped ones are (see
:mod:`.database`, which reads and writes them, and :mod:`.workload_index`)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from ..errors import TvmfuseError

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"
XZ = ".xz"  # a shipped file's compressed form: database_workload.json.xz


class TuningLogError(TvmfuseError):
    """A tuning-log folder that cannot be used at all (not a folder, not writable)."""


def packed_path(path: Path) -> Path:
    """``path``'s compressed form (``database_workload.json.xz``)."""
    return path.with_name(path.name + XZ)


def stored_path(path: Path) -> Path:
    """The file that holds ``path``'s lines: ``path``, else its compressed form where only that exists."""
    packed = packed_path(path)
    return packed if not path.exists() and packed.exists() else path


def read_lines(path: Path) -> list[str]:
    """The file's lines (a cut-short last line included), read from its compressed form where only that is
    there; blank lines are dropped.

    Raises TuningLogError when the file is there but is not a readable file (a folder, no permission, a
    compressed file that does not decompress).
    """
    path = stored_path(path)
    if not path.exists():
        return []
    if not path.is_file():
        raise TuningLogError(f"tuning logs: {path} is not a file")
    try:
        opener = lzma.open if path.name.endswith(XZ) else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            return [line for line in f.read().split("\n") if line.strip()]
    except OSError as err:
        raise TuningLogError(f"tuning logs: cannot read {path}: {err.strerror or err}") from None
    except (lzma.LZMAError, EOFError) as err:
        raise TuningLogError(f"tuning logs: cannot read {path}: not a whole xz file ({err})") from None


def workload_entry(line: str) -> list:
    """A workload line parsed: ``[structural hash, base64 IRModule]``. Raises ValueError (or RecursionError, for a
    line of deeply nested brackets) on anything else."""
    entry = json.loads(line)
    if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
        raise ValueError("not a [hash, workload] pair")
    return entry
