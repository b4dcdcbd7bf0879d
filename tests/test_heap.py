"""The build's heap and cycle-collector settings: raised once for the outermost build, set back when it ends,
accepted by this machine's glibc."""

from __future__ import annotations

import gc
import threading

import pytest
from helpers import HOST

import tvmfuse
from tvmfuse import heap


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, param, value):
        self.calls.append(("mallopt", param, value))
        return 1


RAISED = [("mallopt", p, v) for p, v in heap.BUILD.items()]
RESTORED = [("mallopt", p, v) for p, v in heap.AFTER.items()]


@pytest.fixture
def own_gc_thresholds():
    """Thresholds of the process's own, unlike the build's, put back after the test."""
    before = gc.get_threshold()
    gc.set_threshold(701, 11, 12)
    yield (701, 11, 12)
    gc.set_threshold(*before)


def test_nested_builds_raise_once_and_restore_once_even_after_an_error(own_gc_thresholds):
    libc = FakeLibc()
    with pytest.raises(ValueError):
        with heap.build_heap(libc):
            with heap.build_heap(libc):
                assert libc.calls == RAISED
                assert gc.get_threshold() == heap.GC_THRESHOLDS
            assert libc.calls == RAISED and gc.get_threshold() == heap.GC_THRESHOLDS
            raise ValueError("a failed build")
    assert libc.calls == RAISED + RESTORED
    assert gc.get_threshold() == own_gc_thresholds


def test_concurrent_builds_restore_when_the_last_one_ends(own_gc_thresholds):
    libc = FakeLibc()
    inside, release = threading.Event(), threading.Event()

    def other():
        with heap.build_heap(libc):
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait(10)
    with heap.build_heap(libc):
        pass
    assert libc.calls == RAISED and gc.get_threshold() == heap.GC_THRESHOLDS  # the other build still runs
    release.set()
    thread.join()
    assert libc.calls == RAISED + RESTORED and gc.get_threshold() == own_gc_thresholds


def test_compile_and_export_run_inside_the_build_heap(monkeypatch, tmp_path):
    libc = FakeLibc()
    monkeypatch.setattr(heap, "_LIBC", libc)
    from tvmfuse import api

    seen, run = [], api.run_graph_passes
    monkeypatch.setattr(api, "run_graph_passes", lambda *a, **k: seen.append(gc.get_threshold()) or run(*a, **k))
    cm = tvmfuse.compile("zoo:tiny_convnet", HOST, cache=False)
    assert seen == [heap.GC_THRESHOLDS]
    assert libc.calls == RAISED + RESTORED
    cm.export(tmp_path / "m.so")
    assert libc.calls == (RAISED + RESTORED) * 2


@pytest.mark.skipif(heap.glibc() is None, reason="not glibc: the settings are not applied")
def test_this_glibc_accepts_every_setting():
    libc = heap.glibc()
    for param, value in list(heap.BUILD.items()) + list(heap.AFTER.items()):
        assert libc.mallopt(param, value) == 1, (param, value)


def test_the_cli_compiles_and_exports_inside_one_build_heap(monkeypatch, tmp_path):
    from tvmfuse import cli

    libc = FakeLibc()
    monkeypatch.setattr(heap, "_LIBC", libc)
    assert cli.main(["compile", "zoo:tiny_convnet", "--target", HOST, "--no-cache", "-o", str(tmp_path / "m.so"),
                     "-q"]) == 0
    assert libc.calls == RAISED + RESTORED  # the export reuses what the compile freed
