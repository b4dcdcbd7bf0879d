"""Tuning logs shipped xz-compressed (``database_workload.json.xz``): read as the plain files are, expanded by
the first writer, a damaged one refused in one line; and the repository's own workloads stay compressed."""

import lzma
from pathlib import Path

import pytest

from tvmfuse.tune.database import RECORDS, WORKLOADS, XZ, LogStore, TuningLogError, read_lines

from helpers.tune import HOST, default_entry, task_of

SHIPPED = Path(__file__).resolve().parents[2] / "tuning_logs"


@pytest.fixture(scope="module")
def entry():
    return default_entry(task_of())


def _pack(path: Path) -> None:
    path.with_name(path.name + XZ).write_bytes(lzma.compress(path.read_bytes()))
    path.unlink()


def test_a_compressed_folder_reads_as_the_plain_one(tmp_path, entry):
    plain = LogStore(tmp_path / "plain", HOST)
    plain.append([entry, entry])
    packed = LogStore(tmp_path / "packed", HOST)
    packed.append([entry, entry])
    for name in (WORKLOADS, RECORDS):
        _pack(packed.path / name)
    assert packed.read()[:2] == plain.read()[:2]
    db, report = packed.load()
    assert (report.workloads, report.records, report.skipped) == (1, 2, [])
    assert db.has_workload(task_of().mod)
    assert packed.stamp() != plain.stamp() and all(s[0].endswith(XZ) for s in packed.stamp())


def test_a_writer_expands_the_compressed_files_and_appends(tmp_path, entry):
    store = LogStore(tmp_path, HOST)
    store.append([entry])
    _pack(store.path / WORKLOADS)
    assert store.append([entry]) == 1
    assert sorted(p.name for p in store.path.iterdir() if not p.name.startswith(".")) == [RECORDS, WORKLOADS]
    assert len(read_lines(store.path / WORKLOADS)) == 1  # the workload found in the expanded file, not added again
    assert [line.split(",")[0] for line in read_lines(store.path / RECORDS)] == ["[0", "[0"]


def test_the_plain_file_wins_over_a_compressed_one(tmp_path, entry):
    store = LogStore(tmp_path, HOST)
    store.append([entry])
    (store.path / (RECORDS + XZ)).write_bytes(lzma.compress(b"[0, []]\n" * 3))  # stale: never read
    assert store.read()[2].records == 1 and not store.read()[2].skipped


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"not xz at all"])
def test_a_damaged_compressed_file_is_refused_in_one_line(tmp_path, entry, damage):
    store = LogStore(tmp_path, HOST)
    store.append([entry])
    _pack(store.path / WORKLOADS)
    packed = store.path / (WORKLOADS + XZ)
    packed.write_bytes(damage(packed.read_bytes()))
    with pytest.raises(TuningLogError, match=r"^tuning logs: cannot read .*database_workload\.json\.xz: not a whole "
                                             r"xz file [^\n]*$"):
        store.read()


def test_the_shipped_workloads_stay_compressed():
    # 21 MB of base64 IRModules as plain JSON, 0.4 MB as xz: what a clone and a GPU machine's calls carry.
    # After a tuning run appended to a shipped folder: xz -6 tuning_logs/<target>/database_workload.json
    folders = [f for f in SHIPPED.iterdir() if f.is_dir()]
    assert folders
    for folder in folders:
        plain = folder / WORKLOADS
        assert not plain.exists() or plain.stat().st_size < 1_000_000, f"{plain}: commit it as {plain.name}{XZ}"
        assert read_lines(plain)
