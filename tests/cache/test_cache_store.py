"""The store under the kernel cache: atomic entries, checksums, a private folder, eviction, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import warnings

import pytest

from tvmfuse.cache import resolve
from tvmfuse.cache.store import SCAN_EVERY, USAGE_FILE, CacheError, Store


def test_an_entry_round_trips_in_a_private_folder(tmp_path):
    store = Store(tmp_path / "c")
    assert (os.stat(store.root).st_mode & 0o777) == 0o700
    store.put("ab" * 32, b"payload")
    assert store.get("ab" * 32) == b"payload"
    assert store.get("cd" * 32) is None
    assert (os.stat(store.path("ab" * 32)).st_mode & 0o777) == 0o600


def test_an_entry_written_in_parts_reads_back_whole(tmp_path):
    store = Store(tmp_path / "c")
    store.put("ab" * 32, b"head", memoryview(b"-library-"), b"")
    assert store.get("ab" * 32) == b"head-library-"
    store.path("ab" * 32).write_bytes(store.path("ab" * 32).read_bytes()[:-1])  # the size covers every part
    with pytest.warns(UserWarning, match="damaged"):
        assert store.get("ab" * 32) is None


# "empty" and "zeros": what a power cut can leave of an entry written without fsync
@pytest.mark.parametrize("damage", ["truncate", "flip", "header", "empty", "zeros"])
def test_a_damaged_entry_is_a_miss_with_one_warning_and_is_removed(tmp_path, damage):
    store = Store(tmp_path)
    key = "0f" * 32
    store.put(key, bytes(range(256)) * 8)
    path = store.path(key)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-100]
    elif damage == "flip":
        data[-7] ^= 0xFF
    elif damage == "empty":
        data = bytearray()
    elif damage == "zeros":
        data = bytearray(len(data))
    else:
        data[:5] = b"XXXXX"
    path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.get(key) is None
    assert len(caught) == 1 and "damaged" in str(caught[0].message) and str(path) in str(caught[0].message)
    assert not path.exists()


def test_a_folder_other_users_can_write_is_refused_in_one_line(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CacheError) as e:
        Store(shared)
    assert "writable by other users" in str(e.value) and str(shared) in str(e.value)
    assert "\n" not in str(e.value)
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(CacheError, match="file"):
        Store(not_a_folder)


def test_an_entry_other_users_can_write_is_not_loaded(tmp_path):
    store = Store(tmp_path)
    key = "aa" * 32
    store.put(key, b"code")
    store.path(key).chmod(0o666)
    with pytest.warns(UserWarning, match="writable by other users"):
        assert store.get(key) is None


def test_least_recently_used_entries_go_first_past_the_limit(tmp_path):
    store = Store(tmp_path, limit_mb=1)
    keys = [f"{i:02x}" * 32 for i in range(4)]
    for i, k in enumerate(keys):
        store.put(k, bytes(400_000))
        os.utime(store.path(k), (1000 + i, 1000 + i))
    store.get(keys[0])  # used now: the newest
    assert store.evict() == 2
    assert store.get(keys[0]) is not None and store.get(keys[3]) is not None
    assert store.get(keys[1]) is None and store.get(keys[2]) is None


def _scans(store, monkeypatch) -> list:
    """The scans of ``store``'s folder from now on (each call of ``entries``)."""
    calls, entries = [], store.entries
    monkeypatch.setattr(store, "entries", lambda: calls.append(1) or entries())
    return calls


def _usage(store) -> dict:
    return json.loads((store.root / USAGE_FILE).read_text())


def test_evict_scans_only_when_the_kept_total_passes_the_limit(tmp_path, monkeypatch):
    store = Store(tmp_path, limit_mb=1)
    store.put("01" * 32, bytes(300_000))
    scans = _scans(store, monkeypatch)
    assert store.evict() == 0 and len(scans) == 1  # no usage file yet: scanned
    first = _usage(store)["bytes"]
    assert first == store.path("01" * 32).stat().st_size
    other = Store(tmp_path, limit_mb=1)  # another process's store: its writes count too
    other.put("02" * 32, bytes(300_000))
    assert other.evict() == 0 and len(scans) == 1  # 0.6 MB of 1: not scanned
    assert _usage(store)["bytes"] == first + store.path("02" * 32).stat().st_size
    for i, k in enumerate(["03", "04"]):
        store.put(k * 32, bytes(300_000))
    for i, k in enumerate(["01", "02", "03", "04"]):
        os.utime(store.path(k * 32), (1000 + i, 1000 + i))
    assert store.evict() == 1 and len(scans) == 2  # 1.2 MB: scanned, the oldest went
    assert store.get("01" * 32) is None and store.get("02" * 32) is not None
    assert _usage(store)["bytes"] == sum(st.st_size for _, st in store.entries())


def test_evict_scans_when_the_last_scan_is_an_hour_old(tmp_path, monkeypatch):
    store = Store(tmp_path)
    store.put("05" * 32, b"x")
    store.evict()
    dead = store.path("05" * 32).parent / ".tmp-dead-writer"
    dead.write_bytes(b"half")
    os.utime(dead, (1000, 1000))
    scans = _scans(store, monkeypatch)
    store.evict()
    assert not scans and dead.exists()
    (store.root / USAGE_FILE).write_text(json.dumps({"bytes": 10, "scanned": time.time() - SCAN_EVERY - 1}))
    store.evict()
    assert len(scans) == 1 and not dead.exists()
    (store.root / USAGE_FILE).write_text("not json")
    store.evict()
    assert len(scans) == 2  # a damaged usage file: scanned again


def _write_and_evict(root: str, n: int, rounds: int) -> None:
    store = Store(root)
    for i in range(rounds):
        store.put(f"{n:02x}{i:02x}" * 16, bytes(1000))
        store.evict()


def test_concurrent_evicts_lose_no_written_bytes(tmp_path):
    Store(tmp_path).evict()
    before = _usage(Store(tmp_path))["bytes"]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_and_evict, args=(str(tmp_path), n, 60)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    one = Store(tmp_path).path("0000" * 16).stat().st_size
    assert _usage(Store(tmp_path))["bytes"] == before + 240 * one


def test_clear_removes_every_entry_and_the_run_log(tmp_path):
    store = Store(tmp_path)
    store.put("11" * 32, b"a")
    store.log_run("kernels", 1, 2)
    assert store.runs()[0]["misses"] == 2
    size = store.path("11" * 32).stat().st_size
    assert store.clear() == (1, size)
    assert store.entries() == [] and store.runs() == []


def test_resolve_follows_the_argument_and_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMFUSE_NO_CACHE", "1")
    assert resolve(None) is None and resolve(False) is None
    assert resolve(tmp_path / "a").root == (tmp_path / "a").absolute()
    monkeypatch.delenv("TVMFUSE_NO_CACHE")
    monkeypatch.setenv("TVMFUSE_CACHE_DIR", str(tmp_path / "b"))
    assert resolve(None).root == (tmp_path / "b").absolute()
    with pytest.raises(CacheError):
        resolve(42)


def _hammer(root: str, seed: int, rounds: int, out) -> None:
    import random

    store = Store(root)
    rng = random.Random(seed)
    bad = 0
    for _ in range(rounds):
        k = rng.randrange(6)
        key = f"{k:02x}" * 32
        if rng.random() < 0.5:
            store.put(key, bytes([k]) * (50_000 + 1000 * k))
        else:
            got = store.get(key)
            bad += got is not None and got != bytes([k]) * (50_000 + 1000 * k)
    out.put(bad)


def test_concurrent_writers_and_readers_never_see_a_half_written_entry(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), seed, 300, out)) for seed in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert results == [0, 0, 0, 0]
    assert not list(tmp_path.glob("*/.tmp-*"))  # every writer renamed or removed its temporary file
