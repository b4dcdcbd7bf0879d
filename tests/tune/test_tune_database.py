"""The tuning-log store and applying logs at compile time (no tuning run: records are made directly)."""

import json
import multiprocessing
import warnings
from pathlib import Path

import numpy as np
import pytest

import tvmfuse
from tvmfuse import targets
from tvmfuse.runtime import random_inputs
from tvmfuse.passes.kernel_names import kind
from tvmfuse.tune.database import (RECORDS, WORKLOADS, LogStore, TuningLogError, default_root, shipped_fallback,
                                   target_key)

from helpers.tune import HOST, MODEL, default_entry, task_of


@pytest.fixture(scope="module")
def entry():
    return default_entry(task_of())


def _store_with(tmp_path, entries):
    store = LogStore(tmp_path, HOST)
    store.append(entries)
    return store


def test_target_keys_name_the_cpu():
    assert target_key(targets.resolve("x86-avx512")) == "x86-avx512"
    assert target_key(HOST) == f"x86-host-{HOST.config['mcpu']}"
    assert target_key(targets.resolve({"kind": "llvm", "mcpu": "znver4"})) == "custom-llvm-znver4"


def test_append_and_load_round_trip(tmp_path, entry):
    store = _store_with(tmp_path, [entry, entry])
    assert len((store.path / WORKLOADS).read_text().splitlines()) == 1  # the workload is written once
    db, report = store.load()
    assert (report.workloads, report.records, report.skipped) == (1, 2, [])
    assert db.has_workload(task_of().mod)
    # MetaSchedule's own JSON database reads the same files.
    from tvm.s_tir import meta_schedule as ms

    assert len(ms.database.JSONDatabase(work_dir=str(store.path)).get_all_tuning_records()) == 2


def test_compile_applies_logs_and_records_them(tmp_path, entry):
    store = _store_with(tmp_path, [entry])
    tuned = tvmfuse.compile(MODEL, target=HOST, logs=tmp_path)
    plain = tvmfuse.compile(MODEL, target=HOST, logs=False)
    assert list(map(kind, tuned.tuning_logs["applied"])) == ["tvmfuse_conv2d_relu"]
    assert tuned.tuning_logs["path"] == str(store.path) and tuned.tuning_logs["records"] == 1
    assert plain.tuning_logs is None
    assert list(map(kind, tuned.manifest()["tuning_logs"]["applied"])) == ["tvmfuse_conv2d_relu"]
    x = random_inputs(tuned.inputs)
    np.testing.assert_allclose(tuned.run(x)[0], plain.run(x)[0], rtol=1e-5, atol=1e-5)


def test_logs_of_another_target_folder_are_not_applied(tmp_path, entry):
    _store_with(tmp_path, [entry])
    other = targets.resolve({"kind": "llvm", "mcpu": HOST.config["mcpu"], "num-cores": 2})
    cm = tvmfuse.compile(MODEL, target=other, logs=tmp_path)  # folder custom-llvm-<cpu> does not exist
    assert cm.tuning_logs is None


def test_bad_lines_are_skipped_counted_and_warned(tmp_path, entry):
    store = _store_with(tmp_path, [entry])
    good = (store.path / RECORDS).read_text().splitlines()[0]
    index, record = json.loads(good)
    foreign = json.loads(good)
    foreign[1][2] = {"kind": "llvm", "mcpu": "a64fx"}
    failed = json.loads(good)
    failed[1][1] = [1e10]
    bad_lines = ["not json at all", "[0]", json.dumps([7, record]), json.dumps(foreign), json.dumps(failed),
                 good[: len(good) // 2]]  # the last one: a line cut short by a killed writer
    with open(store.path / RECORDS, "a") as f:
        f.write("\n".join(bad_lines))
    with open(store.path / WORKLOADS, "a") as f:
        f.write('["123", "bm90IGEgbW9kdWxl"]\n')  # parses, but MetaSchedule cannot decode it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db, report = store.load()
    assert report.records == 1 and len(report.skipped) == len(bad_lines)
    reasons = " ".join(r for _, _, r in report.skipped)
    assert "corrupt record line" in reasons and "foreign record" in reasons and "a64fx" in reasons
    assert "failed candidate" in reasons and "workload line 8" in reasons
    assert any("skipped 6 line(s)" in str(w.message) for w in caught)
    # A compile over the damaged log still applies the good record.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = tvmfuse.compile(MODEL, target=HOST, logs=tmp_path)
    assert list(map(kind, cm.tuning_logs["applied"])) == ["tvmfuse_conv2d_relu"]
    assert cm.tuning_logs["skipped_lines"] == 6
    # The next writer starts a fresh line after the cut-short one: only that line stays lost.
    store.append([entry])
    assert store.load(warn=False)[1].records == 2


def test_undecodable_record_is_skipped(tmp_path, entry):
    store = _store_with(tmp_path, [entry])
    index, record = json.loads((store.path / RECORDS).read_text().splitlines()[0])
    record[0] = [[["NoSuchInstruction", [], [], []]], []]
    with open(store.path / RECORDS, "a") as f:
        f.write(json.dumps([index, record]) + "\n")
    db, report = store.load(warn=False)
    assert report.records == 1 and "undecodable record" in report.skipped[0][2]


def _append_many(args):
    root, entry, n = args
    store = LogStore(root, HOST)
    for _ in range(n):
        store.append([entry])


def test_concurrent_writers_lose_and_corrupt_nothing(tmp_path, entry):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        pool.map(_append_many, [(str(tmp_path), entry, 40), (str(tmp_path), entry, 40)])
    store = LogStore(tmp_path, HOST)
    _, records, report = store.read()
    assert report.skipped == [] and len(records) == 80
    assert len((store.path / WORKLOADS).read_text().splitlines()) == 1


def test_logs_root_that_is_a_file_is_a_clear_error(tmp_path, entry):
    path = tmp_path / "logs"
    path.write_text("not a folder")
    with pytest.raises(TuningLogError, match="not a folder"):
        LogStore(path, HOST).read()


def test_cli_compile_with_and_without_logs(tmp_path, entry, capsys):
    from tvmfuse.cli import main

    _store_with(tmp_path / "logs", [entry])
    model = tmp_path / "m.onnx"
    model.write_bytes(MODEL.SerializeToString())
    out = tmp_path / "m.so"
    assert main(["compile", str(model), "--target", "x86-host", "-o", str(out), "-q", "--logs",
                 str(tmp_path / "logs")]) == 0
    assert "1 kernel(s) tuned" in capsys.readouterr().out
    applied = json.loads(out.with_suffix(".json").read_text())["tuning_logs"]["applied"]
    assert list(map(kind, applied)) == ["tvmfuse_conv2d_relu"]
    assert main(["compile", str(model), "--target", "x86-host", "-o", str(out), "-q", "--no-logs"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["tuning_logs"] is None


SHIPPED = LogStore(default_root(), HOST)
FALLBACK = shipped_fallback(HOST)
APPLIED = SHIPPED if SHIPPED.path.exists() or FALLBACK is None else LogStore(default_root(), FALLBACK)


def _partition_kernels(cm) -> list[str]:
    """The kernels of tvmfuse's partitions in a compiled model (the ones every tuned model has a record for)."""
    return [n for n in tvmfuse.export.kernel_names(cm.lowered) if n.startswith("tvmfuse_")]


def test_x86_host_reads_the_shipped_logs_of_its_class_of_cpu(monkeypatch):
    """Where this CPU has no folder of its own, x86-host reads x86-avx512/ (AMD with AVX-512 + VNNI + VBMI),
    x86-host-sapphirerapids/ (Intel with AVX-512) or x86-host-znver3/ (AVX2 only); a CPU with a folder of its own
    reads that."""
    for cpu, key in (("znver4", "x86-avx512"), ("znver3", None), ("haswell", "x86-host-znver3"),
                     ("cascadelake", "x86-host-sapphirerapids"), ("skylake-avx512", "x86-host-sapphirerapids"),
                     ("sapphirerapids", None)):
        spec = targets.TargetSpec("x86-host", {"kind": "llvm", "mcpu": cpu})
        fallback = shipped_fallback(spec)
        assert (target_key(fallback) if fallback else None) == key
        if fallback is not None:
            assert (default_root() / key).is_dir()
    assert shipped_fallback(targets.resolve("x86-avx512")) is None  # a named target reads its own folder only


def test_a_cpus_own_records_come_first_and_the_shipped_folder_fills_the_rest(tmp_path):
    from helpers.tune import wide_conv

    own_spec = targets.TargetSpec("x86-host", {"kind": "llvm", "mcpu": "haswell"})  # AVX2: falls back on znver3's
    shipped = shipped_fallback(own_spec)
    a, b = task_of(spec=own_spec), task_of(wide_conv(), spec=own_spec)
    LogStore(tmp_path, shipped).append([default_entry(t, shipped, 3e-5) for t in (a, b)])
    own = LogStore(tmp_path, own_spec)
    db, report = own.load(fill_from=LogStore(tmp_path, shipped))  # no folder of its own yet: the shipped one
    assert report.path == tmp_path / "x86-host-znver3" and report.records == 2 and report.filled_from is None
    own.append([default_entry(a, own_spec, 1e-5)])  # tuned here for one kernel
    db, report = own.load(fill_from=LogStore(tmp_path, shipped))
    assert report.path == own.path and report.records == 2
    assert report.to_json()["filled_from"] == {"path": str(tmp_path / "x86-host-znver3"), "records": 1}
    assert db.has_workload(a.mod) and db.has_workload(b.mod)
    (best,) = db.get_top_k(db.commit_workload(a.mod), 5)
    assert [float(s) for s in best.run_secs] == [1e-5]  # this CPU's record, not the shipped one


@pytest.mark.skipif(not APPLIED.path.exists(), reason=f"no shipped tuning logs for this CPU ({SHIPPED.path.name})")
def test_shipped_logs_still_match_every_kernel_of_a_tuned_zoo_model():
    # A change to a kernel's compute changes its workload hash and silently orphans the shipped records.
    cm = tvmfuse.compile("zoo:mobilenet_v2", target=HOST)
    assert cm.tuning_logs["path"] == str(APPLIED.path)
    assert cm.tuning_logs["skipped_lines"] == 0
    assert set(_partition_kernels(cm)) <= set(cm.tuning_logs["applied"])


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet50", "efficientnet_lite0"])
def test_shipped_avx512_records_still_match_every_kernel(name):
    # The x86-avx512 logs were tuned on AVX-512 machines; compiling for that target (no run, so on any
    # machine) must still find a record for every kernel of the zoo models, or a compute change has
    # orphaned them.
    folder = Path(__file__).resolve().parents[2] / "tuning_logs" / "x86-avx512"
    cm = tvmfuse.compile(f"zoo:{name}", target="x86-avx512")
    assert cm.tuning_logs["path"] == str(folder)
    assert cm.tuning_logs["skipped_lines"] == 0
    kernels = _partition_kernels(cm)
    assert kernels and set(kernels) <= set(cm.tuning_logs["applied"])


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet50", "efficientnet_lite0"])
def test_shipped_sapphire_rapids_records_match_every_fp32_kernel(name, tmp_path):
    # Tuned on a Sapphire Rapids for x86-host; its FP32 kernels are x86-avx512's (the same 512-bit computes), so
    # compiling for x86-avx512 with that folder in x86-avx512's place checks the records on any machine.
    (tmp_path / "x86-avx512").symlink_to(default_root() / "x86-host-sapphirerapids")
    cm = tvmfuse.compile(f"zoo:{name}", target="x86-avx512", logs=str(tmp_path))
    assert cm.tuning_logs["skipped_lines"] == 0
    kernels = _partition_kernels(cm)
    assert kernels and set(kernels) <= set(cm.tuning_logs["applied"])


def test_a_process_decodes_a_log_folder_once_while_it_is_unchanged(tmp_path, entry, monkeypatch):
    from tvmfuse import cached_build
    from tvmfuse.tune import database

    store = _store_with(tmp_path, [entry])
    loads = []
    real = database.LogStore.read
    monkeypatch.setattr(database.LogStore, "read", lambda self, *a, **k: loads.append(self.path) or real(self, *a, **k))
    first = cached_build.load_logs(tmp_path, HOST)
    loads[:] = [p for p in loads if p == store.path]  # the shipped fallback's folder is read alongside
    second = cached_build.load_logs(tmp_path, HOST)
    assert len(loads) == 1 and first[0] is second[0] and first[1] == second[1]
    second[1]["applied"] = ["x"]  # a caller's copy: the cached entry stays as read
    assert "applied" not in cached_build.load_logs(tmp_path, HOST)[1]
    store.append([default_entry(task_of(), run_secs=2e-5)])  # the folder changed: read again
    assert cached_build.load_logs(tmp_path, HOST)[1]["records"] == 2
    assert len([p for p in loads if p == store.path]) == 2
