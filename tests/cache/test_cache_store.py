"""The store under the kernel cache: atomic entries, checksums, a private folder, eviction, concurrent writers."""

from __future__ import annotations

import multiprocessing
import os
import warnings

import pytest

from tvmfuse.cache import resolve
from tvmfuse.cache.store import CacheError, Store


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
