"""Tuning logs decoded per workload: only the kernels a compile meets, with the hash tuning filed them under."""

from __future__ import annotations

import json

import pytest
from helpers.tune import HOST, default_entry, task_of, wide_conv

from tvmfuse.tune.database import RECORDS, LogStore
from tvmfuse.tune.records import kernel_hash
from tvmfuse.tune.lazy_logs import LazyLogs


@pytest.fixture(scope="module")
def two_tasks():
    return task_of(), task_of(wide_conv())


def test_only_the_workloads_asked_for_are_decoded(tmp_path, two_tasks):
    small, wide = two_tasks
    store = LogStore(tmp_path, HOST)
    store.append([default_entry(small), default_entry(wide)])
    lazy = LazyLogs(store)
    assert len(lazy) == 2 and lazy.report.records == 2
    assert len(lazy.database_for({"0"}).get_all_tuning_records()) == 0  # a hash the logs do not hold
    db = lazy.database_for({kernel_hash(wide.mod["main"])})
    assert len(db.get_all_tuning_records()) == 1 and db.has_workload(wide.mod) and not db.has_workload(small.mod)
    assert len(lazy.database_for({kernel_hash(small.mod["main"])}).get_all_tuning_records()) == 2


def test_a_record_that_does_not_decode_warns_when_its_kernel_is_met(tmp_path, two_tasks):
    small, _ = two_tasks
    store = LogStore(tmp_path, HOST)
    store.append([default_entry(small)])
    index, record = json.loads((store.path / RECORDS).read_text().splitlines()[0])
    record[0] = [[["NoSuchInstruction", [], [], []]], []]
    with open(store.path / RECORDS, "w") as f:
        f.write(json.dumps([index, record]) + "\n")
    lazy = LazyLogs(store, warn=False)
    with pytest.warns(UserWarning, match="undecodable record"):
        db = lazy.database_for({kernel_hash(small.mod["main"])})
    assert len(db.get_all_tuning_records()) == 0


def test_compile_applies_the_same_kernels_from_lazy_logs_as_from_the_whole_database():
    import tvmfuse
    from tvmfuse import targets
    from tvmfuse.passes.pipeline import PassRecord, fused_module, run_graph_passes
    from tvmfuse.passes.schedule import ApplyTuningLogs
    from tvmfuse.tune.database import default_root, shipped_fallback

    spec = targets.resolve("x86-avx512")
    store = LogStore(default_root(), spec)
    cm = tvmfuse.compile("zoo:mobilenet_v2", spec, cache=False)  # lazily, through load_logs
    eager, _ = store.load()
    imported = tvmfuse.frontend.import_model("zoo:mobilenet_v2")
    target = spec.tvm_target()
    mod = fused_module(run_graph_passes(imported.mod, spec, target, PassRecord()), spec, target)
    applied: list = []
    with target:
        ApplyTuningLogs(eager, applied)(mod)
    assert sorted(cm.tuning_logs["applied"]) == sorted(applied) and len(applied) > 20
    assert shipped_fallback(spec) is None
