"""Scheduled kernels from the cache: a second compile schedules nothing, builds the same library, and a kernel
misses when its tuning records, target or pass options change."""

from __future__ import annotations

import numpy as np
import tvm
from helpers import HOST

import tvmfuse
from tvmfuse.cache import schedules
from tvmfuse.cache.store import Store
from tvmfuse.passes import schedule as schedule_passes
from tvmfuse.runtime import random_inputs

MODEL = "zoo:tiny_convnet"


def _count_scheduling(monkeypatch) -> list:
    """The number of unscheduled kernels each ScheduleKernels pass is handed."""
    from tvmfuse.schedules.backend import is_scheduled

    seen, real = [], schedule_passes.ScheduleKernels

    def counting(spec):
        inner = real(spec)

        @tvm.transform.module_pass(opt_level=0, name="CountingScheduleKernels")
        def _count(mod, ctx):
            seen.append(sum(isinstance(f, tvm.tirx.PrimFunc) and not is_scheduled(f) for _, f in mod.functions_items()))
            return inner(mod)

        return _count

    monkeypatch.setattr(schedule_passes, "ScheduleKernels", counting)
    return seen


def test_a_second_compile_schedules_nothing_and_builds_the_same_library(tmp_path, monkeypatch):
    seen = _count_scheduling(monkeypatch)
    first = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    second = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    assert seen[0] > 3 and seen[1] == 0
    logged = [r for r in Store(tmp_path).runs() if r["kind"] == "schedules"]
    assert len(logged) == 2 and logged[0]["hits"] == 0 and logged[0]["misses"] >= seen[0]  # `tvmfuse cache info`
    assert (logged[1]["hits"], logged[1]["misses"]) == (logged[0]["misses"], 0)
    assert second.cache_info["from_cache"] == second.cache_info["kernels"]  # same scheduled TIR: same objects
    assert first.library_bytes() == second.library_bytes()
    assert first.kernel_info == second.kernel_info  # who scheduled each kernel, tuning logs included
    assert getattr(first, "tuning_logs", None) == getattr(second, "tuning_logs", None)
    np.testing.assert_array_equal(first.run(random_inputs(first.inputs))[0],
                                  second.run(random_inputs(second.inputs))[0])
    uncached = tvmfuse.compile(MODEL, HOST, cache=False)
    assert uncached.kernel_info == second.kernel_info


class _Logs:
    """A stand-in for :class:`tvmfuse.tune.lazy_logs.LazyLogs`: one record string for every kernel."""

    def __init__(self, records: str):
        self.records = records

    def records_for(self, func) -> str:
        return self.records


def _kernel():
    from tvm import te

    a = te.placeholder((8,), "float32", name="a")
    return te.create_prim_func([a, te.compute((8,), lambda i: a[i] * 2.0, name="b")])


def test_the_key_changes_with_the_records_the_target_and_the_pass_options():
    func = _kernel()
    base = schedules.schedule_key(func, tvm.target.Target("llvm"), "ctx", "")
    assert base == schedules.schedule_key(func, tvm.target.Target("llvm"), "ctx", "")
    assert base != schedules.schedule_key(func, tvm.target.Target("llvm"), "ctx", '[["a better record"]]')
    assert base != schedules.schedule_key(func, tvm.target.Target({"kind": "llvm", "mcpu": "znver3"}), "ctx", "")
    assert base != schedules.schedule_key(func, tvm.target.Target("llvm"), "other ctx", "")
    assert base != schedules.schedule_key(func.with_attr("global_symbol", "other"), tvm.target.Target("llvm"), "ctx", "")


def test_passes_stay_as_they_are_without_a_store_or_with_a_database_it_cannot_key(tmp_path):
    made = []

    def make(applied):
        made.append(applied)
        return ["the passes"]

    names: list = []
    assert schedules.cached(make, None, None, names) == ["the passes"]
    assert schedules.cached(make, Store(tmp_path), object(), names) == ["the passes"]  # a MetaSchedule database
    assert made == [names, names]
    wrapped = schedules.cached(make, Store(tmp_path), _Logs(""), names)
    assert len(wrapped) == 1 and wrapped != ["the passes"] and len(made) == 2  # made when it runs
