"""A tuned kernel is accepted only when it computes what the default schedule computes (no tuning run needed)."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tvmfuse.tune import tuner, validate
from tvmfuse.tune.database import LogStore
from tvmfuse.tune.measure import Progress

try:
    from .helpers import make_model
    from .tune_helpers import HOST, default_entry, record_lines, task_of
except ImportError:
    from helpers import make_model
    from tune_helpers import HOST, default_entry, record_lines, task_of


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
