"""A tuned kernel is accepted only when it computes what the default schedule computes (no tuning run needed)."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tvmfuse.tune import tuner, validate
from tvmfuse.tune.database import LogStore
from tvmfuse.tune.measure import Progress

from helpers import make_model
from helpers.tune import HOST, default_entry, record_lines, task_of


def _conv_without_relu():
    """Same kernel signature as tune_helpers.MODEL's conv+bias+relu, but no relu: a wrong 'tuned' kernel."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32"), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype("float32"), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1])]
    return make_model(nodes, [("x", [1, 3, 16, 16])], [("y", None)], [w, b])


@pytest.fixture(scope="module")
def tasks():
    return task_of(), task_of(_conv_without_relu())


def test_check_accepts_the_default_schedule_and_times_both(tasks):
    good, _ = tasks
    check = validate.check(validate.default_schedule(good.mod, HOST), good.mod, HOST)
    assert check.ok and check.detail == "" and check.tuned_us > 0 and check.default_us > 0


def test_check_rejects_a_kernel_that_computes_something_else(tasks):
    good, wrong = tasks
    check = validate.check(wrong.mod, good.mod, HOST, time_it=False)
    out = [int(d) for d in good.mod["main"].params[-1].ty.shape]  # NCHW[b]c: [1, 8/b, 16, 16, b]
    assert not check.ok and f"argument 3 {out} float32: max abs diff" in check.detail


def test_wrong_candidates_never_reach_the_log(tasks, tmp_path, monkeypatch):
    from tvm.s_tir import meta_schedule as ms

    good, wrong = tasks
    db = ms.database.MemoryDatabase()
    workload_json, record_json = default_entry(good)
    workload = db.commit_workload(good.mod)
    db.commit_tuning_record(ms.database.TuningRecord.from_json(record_json, workload))
    monkeypatch.setattr(tuner, "_schedule_of", lambda record, task: wrong.mod)
    store = LogStore(tmp_path, HOST)
    result = tuner._accept(good, None, db, store, HOST, validate.LocalDevice(), Progress(1, enabled=False))
    assert result.status == "rejected" and record_lines(store.path) == []


def _kernels(mod) -> dict:
    """tvmfuse's kernels of a compiled model's Relax module (before the Relax pipeline schedules them)."""
    import tvm

    return {gv.name_hint: f for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.family" in f.attrs}


@pytest.fixture(scope="module")
def int8_and_fp32_kernels():
    import tvmfuse
    from helpers.quantize import residual_block

    rng = np.random.default_rng(3)
    calib = [{"x": rng.standard_normal((1, 8, 6, 6)).astype("float32")} for _ in range(2)]
    int8 = tvmfuse.quantize(residual_block(from_input=True), calib=calib, method="minmax", target=HOST, logs=False)
    fp32 = tvmfuse.compile("zoo:tiny_convnet", target=HOST, logs=False)
    return _kernels(int8.mod) | _kernels(fp32.mod)


def test_validation_races_the_schedule_compile_gives(int8_and_fp32_kernels):
    """Every kernel, INT8 included, is validated against exactly what ScheduleKernels gives it (the INT8
    kernels were once checked against the generic fused schedule instead of their VNNI/AVX2 rule)."""
    import tvm

    from tvmfuse import targets
    from tvmfuse.passes.schedule import ScheduleKernels
    from tvmfuse.schedules.backend import SCHEDULED_BY

    spec = targets.resolve(HOST)
    families = {str(f.attrs["tvmfuse.family"]) for f in int8_and_fp32_kernels.values()}
    assert {"int8_conv2d", "conv2d_nchwc"} <= families
    for name, func in int8_and_fp32_kernels.items():
        mod = tvm.IRModule({"main": func})
        compiled = ScheduleKernels(spec)(mod)["main"]
        assert not compiled.same_as(func), f"{name}: no default schedule"
        assert str(compiled.attrs[SCHEDULED_BY]) == "tvmfuse.x86"  # the provenance the manifest lists
        tvm.ir.assert_structural_equal(validate.default_schedule(mod, spec)["main"], compiled.without_attr(SCHEDULED_BY))


def test_default_kept_record_replays_the_compile_schedule(int8_and_fp32_kernels):
    """A "default kept" tuning record of a kernel without a template (INT8) replays compile's schedule."""
    import tvm
    from tvm import s_tir

    from tvmfuse import targets

    backend = targets.resolve(HOST).backend()
    func = next(f for f in int8_and_fp32_kernels.values() if str(f.attrs["tvmfuse.family"]) == "int8_conv2d")
    mod = tvm.IRModule({"main": func})
    sch = s_tir.Schedule(mod)
    backend.default_trace(mod).apply_to_schedule(sch, remove_postproc=False)
    tvm.ir.assert_structural_equal(sch.mod["main"], backend.schedule(func))
