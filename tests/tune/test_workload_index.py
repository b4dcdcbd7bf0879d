"""The hash index of a compressed workload file (``tvmfuse/tune/workload_index.py``): read in place of the file
while it is current, ignored when not, removed by a writer; the shipped folders' indexes are current."""

import json
import lzma
from pathlib import Path

import pytest

from tvmfuse.tune import workload_index
from tvmfuse.tune.database import RECORDS, WORKLOADS, XZ, LogStore, read_lines
from tvmfuse.tune.lazy_logs import LazyLogs
from tvmfuse.tune.workload_index import INDEX, Workloads, write_index

from helpers.tune import HOST, default_entry, task_of

SHIPPED = Path(__file__).resolve().parents[2] / "tuning_logs"


@pytest.fixture(scope="module")
def entry():
    return default_entry(task_of())


def _packed_store(tmp_path, entry) -> LogStore:
    store = LogStore(tmp_path, HOST)
    store.append([entry, entry])
    path = store.path / WORKLOADS
    path.with_name(path.name + XZ).write_bytes(lzma.compress(path.read_bytes()))
    path.unlink()
    return store


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in SHIPPED.glob(f"*/{WORKLOADS}{XZ}")))
def test_shipped_indexes_are_current(folder):
    """Recompressing a shipped file needs ``python -m tvmfuse.tune.workload_index tuning_logs/<folder>``."""
    packed = SHIPPED / folder / (WORKLOADS + XZ)
    found = workload_index.indexed(packed)
    assert found is not None, f"tuning_logs/{folder}/{INDEX} is missing or not of the compressed file"
    assert [found.hash(i) for i in found] == [json.loads(line)[0] for line in read_lines(packed)]


def test_an_indexed_folder_reads_as_the_parsed_one_and_decodes(tmp_path, entry):
    store = _packed_store(tmp_path, entry)
    parsed = store.read()
    assert write_index(store.path)
    workloads, records, report = store.read()
    assert isinstance(workloads, Workloads) and workloads._lines is None  # nothing decompressed yet
    assert records == parsed[1] and report.to_json() == parsed[2].to_json()
    assert workloads[0] == parsed[0][0] and 1 not in workloads and len(workloads) == 1
    logs = LazyLogs(store)
    assert len(logs) == 2
    assert logs.database_for({parsed[0][0][0]}).has_workload(task_of().mod)


def test_a_stale_index_is_ignored_and_a_writer_removes_it(tmp_path, entry):
    store = _packed_store(tmp_path, entry)
    assert write_index(store.path)
    (store.path / INDEX).write_text(json.dumps({"xz_sha256": "0" * 64, "hashes": ["1"]}))
    assert store.read()[0] == {0: store.read()[0][0]} and not isinstance(store.read()[0], Workloads)
    (store.path / INDEX).write_text("[1, 2]")  # not an index at all
    assert not isinstance(store.read()[0], Workloads)
    assert write_index(store.path)
    store.append([entry])  # expands the compressed file: its index goes with it
    assert not (store.path / INDEX).exists() and (store.path / WORKLOADS).exists()


def test_a_file_with_a_corrupt_line_is_not_indexed(tmp_path, entry):
    store = _packed_store(tmp_path, entry)
    packed = store.path / (WORKLOADS + XZ)
    packed.write_bytes(lzma.compress(lzma.decompress(packed.read_bytes()) + b'["123", \n'))
    assert not write_index(store.path) and not (store.path / INDEX).exists()
    assert store.read()[2].skipped  # reported as before
    assert not write_index(tmp_path / "nothing here")
