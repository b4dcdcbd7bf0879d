"""tvmfuse.tune.shared_form: the form tuning records are shared under. The same INT8 conv quantized with two
calibration tables is two workloads (its zero points and bounds are constants in it) and one shared form; what
describes the structure (shapes, indices, padding conditions, a reduction's initial value, an LLVM intrinsic's
name) stays, so different kernels keep different forms."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

import tvmfuse
from helpers import make_model
from tvmfuse import targets
from tvmfuse.quant.table import CalibrationTable
from tvmfuse.tune.records import kernel_hash
from tvmfuse.tune.shared_form import shared_form, shared_hash
from tvmfuse.tune.tuner import extract_tasks


def _model(channels: int = 32):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, channels, 3, 3)).astype("float32"), "W")
    return make_model([helper.make_node("Conv", ["x", "W"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                       helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
                      [("x", [1, channels, 12, 12])], [("y", None)],
                      [w, numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")])


def _int8_kernel(model, shift: float, tmp_path, channels: int = 32):
    """The model's INT8 conv kernel (unscheduled), calibrated on inputs shifted by ``shift`` (another input zero
    point, so another padding code)."""
    x = np.random.default_rng(1).standard_normal((1, channels, 12, 12)).astype("float32") + shift
    table = tmp_path / f"table{shift}_{channels}.json"
    tvmfuse.quantize(model, calib=[{"x": x}], method="minmax", target="cuda-sm90", table=table, logs=False)
    tasks = extract_tasks(model, targets.resolve("cuda-sm90"), None, "fp32", None, CalibrationTable.load(table))
    (func,) = [t.mod["main"] for t in tasks if t.name.startswith("tvmfuse_int8_conv2d")]
    return func


def test_two_tables_one_shared_form(tmp_path):
    model = _model()
    a, b = _int8_kernel(model, 0.0, tmp_path), _int8_kernel(model, 1.5, tmp_path)
    assert kernel_hash(a) != kernel_hash(b)  # another padding code: two workloads
    assert shared_hash(a) == shared_hash(b)
    other = _int8_kernel(_model(16), 0.0, tmp_path, channels=16)
    assert shared_hash(other) != shared_hash(a)  # another shape stays another kernel


def test_structure_stays(tmp_path):
    func = _int8_kernel(_model(), 0.0, tmp_path)
    text, shared = func.script(), shared_form(func).script()
    assert shared != text
    for kept in ("v_i2 < 13", "1 <= v_i3", "T.grid(1, 8, 14, 14, 4)", "= 0\n"):  # padding test, loops, init
        assert kept in text and kept in shared, kept
    assert "T.float32(6.0)" not in shared or "T.float32(6.0)" not in text
    assert shared_form(shared_form(func)).script() == shared


def test_only_targets_whose_records_are_shared_look_them_up():
    # about 0.3 ms a kernel: x86 compiles, whose records `tvmfuse tune` files exactly, do not pay it
    from tvmfuse.tune.database import LogStore, default_root
    from tvmfuse.tune.lazy_logs import LazyLogs

    assert LazyLogs(LogStore(default_root(), targets.resolve("cuda-sm90"))).shared
    assert not LazyLogs(LogStore(default_root(), targets.resolve("x86-avx512"))).shared
