"""The structural hashes of a compressed workload file, read without decompressing it.

A compile indexes the tuning records it may apply by their workload's structural hash (:mod:`.lazy_logs`), which
is the first field of each workload line. The shipped workload files are xz-compressed (12 MB of base64
IRModules): decompressing and parsing one cost 0.05-0.07 s of every compile on Zen 4, for the hashes alone when
the model's kernels come from the kernel cache. So a shipped folder carries ``database_workload.hashes.json``
beside ``database_workload.json.xz``: the compressed file's SHA-256 and one hash per line. A reader whose file
still has that digest takes the hashes from it and decompresses the lines only when a record must be decoded
(:class:`Workloads`); any other file is parsed as before. Written by ``python -m tvmfuse.tune.workload_index
FOLDER...`` after compressing (``tests/tune/test_workload_index.py`` checks the shipped ones are current).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .log_files import WORKLOADS, XZ, read_lines, workload_entry

INDEX = "database_workload.hashes.json"


class Workloads(Mapping):
    """Line index -> parsed ``[hash, payload]`` workload line, as :meth:`.database.LogStore.read` returns them,
    with the hashes known up front (:meth:`hash`) and the lines read from ``path`` when a payload is first
    asked for."""

    def __init__(self, path: Path, hashes: list[str]):
        self.path, self._hashes, self._lines = path, hashes, None

    def hash(self, index: int) -> str:
        return self._hashes[index]

    def __getitem__(self, index: int) -> list:
        if not isinstance(index, int) or not 0 <= index < len(self._hashes):
            raise KeyError(index)
        if self._lines is None:
            self._lines = read_lines(self.path)
        return json.loads(self._lines[index])

    def __contains__(self, index) -> bool:
        return isinstance(index, int) and 0 <= index < len(self._hashes)

    def __iter__(self):
        return iter(range(len(self._hashes)))

    def __len__(self) -> int:
        return len(self._hashes)


def workload_hash(workloads: Mapping, index: int) -> str:
    """The structural hash of workload ``index`` (without reading its line where ``workloads`` is indexed)."""
    return workloads.hash(index) if isinstance(workloads, Workloads) else workloads[index][0]


def indexed(packed: Path) -> Workloads | None:
    """The workloads of compressed file ``packed`` by its index, or None (no index, or one of another file)."""
    try:
        index = json.loads((packed.parent / INDEX).read_text(encoding="utf-8"))
        if not isinstance(index, dict) or index.get("xz_sha256") != hashlib.sha256(packed.read_bytes()).hexdigest():
            return None
    except (OSError, ValueError):
        return None
    hashes = index.get("hashes")
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
        return None
    return Workloads(packed, hashes)


def write_index(folder: Path) -> bool:
    """Write ``folder``'s index of its compressed workload file; False (and any old index removed) where there is
    no compressed file or a line does not parse (readers then parse the file)."""
    folder, packed = Path(folder), Path(folder) / (WORKLOADS + XZ)
    target = folder / INDEX
    try:
        hashes = [workload_entry(line)[0] for line in read_lines(packed)] if packed.exists() else None
    except (ValueError, RecursionError):  # a line LogStore.read skips as corrupt
        hashes = None
    if hashes is None:
        target.unlink(missing_ok=True)
        return False
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps({"xz_sha256": hashlib.sha256(packed.read_bytes()).hexdigest(),
                                   "hashes": hashes}) + "\n", encoding="utf-8")
    os.replace(partial, target)
    return True


if __name__ == "__main__":
    for name in sys.argv[1:]:
        done = write_index(Path(name))
        print(f"{name}: " + ("indexed" if done else "not indexed (no compressed workload file, or a corrupt line)"))
