"""Collecting ranges by running the FP32 model: tensor keys, known answers, zoo:tiny_convnet, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from helpers import HOST
from helpers import make_model
from tvmfuse import frontend, targets
from tvmfuse.errors import TargetError
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes
from tvmfuse.calibration import calibrate_partitioned, collect_ranges
from tvmfuse.quant.keys import observed_tensors
from tvmfuse.quant.params import activation_params
from tvmfuse.quant.data import CalibrationDataError
from tvmfuse.quant.table import CalibrationError, CalibrationTable

W1 = np.array([[[[1, 0, -1], [2, 0, -2], [1, 0, -1]]], [[[0, 1, 0], [1, -4, 1], [0, 1, 0]]]], np.float32)
B1 = np.array([0.5, -0.25], np.float32)
W2 = (np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3) / 10 - 0.8).astype(np.float32)
B2 = np.array([0.1], np.float32)


def _conv_relu_conv():
    """x (2,1,6,6) -> Conv(W1, B1, pad 1) -> Relu -> Conv(W2, B2) -> y (2,1,4,4): two partitions."""
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["h"]),
             helper.make_node("Conv", ["h", "W2", "B2"], ["y"])]
    inits = [numpy_helper.from_array(a, n) for a, n in [(W1, "W1"), (B1, "B1"), (W2, "W2"), (B2, "B2")]]
    return make_model(nodes, [("x", [2, 1, 6, 6])], [("y", [2, 1, 4, 4])], inits)


def _conv2d(x, w, b, pad):
    """NCHW convolution, stride 1, in float64."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    oh, ow = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow)) + b.reshape(1, -1, 1, 1)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", x[:, :, i:i + oh, j:j + ow], w[:, :, i, j].astype(np.float64))
    return out


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((2, 1, 6, 6)).astype(np.float32) * (k + 1)} for k in range(n)]


def _partitioned(model):
    imported = frontend.import_model(model)
    spec = targets.resolve(HOST)
    record = PassRecord()
    run_graph_passes(imported.mod, spec, spec.tvm_target(), record)
    return record.partitioned


def test_observed_tensor_keys_are_unique_names_in_program_order():
    import tvm
    from tvm import relax

    t = relax.TensorType((1, 4), "float32")
    a, c = relax.Var("a", t), relax.Var("c", t)
    part = relax.Function([a, c], relax.op.add(a, c), t).with_attrs({"Composite": "tvmfuse.test",
                                                                      "Primitive": True})
    gv = tvm.ir.GlobalVar("part")
    # Three bindings named 'lv' (the BlockBuilder would rename them; imported models do have repeats).
    x = relax.Var("x", t)
    first, plain, second = relax.Var("lv", t), relax.Var("lv", t), relax.Var("lv", t)
    const = relax.const(np.ones((1, 4), np.float32))
    bindings = [relax.VarBinding(first, relax.Call(gv, [x, const])),
                relax.VarBinding(plain, relax.op.multiply(first, first)),  # not a partition call
                relax.VarBinding(second, relax.Call(gv, [plain, first]))]
    main = relax.Function([x], relax.SeqExpr([relax.BindingBlock(bindings)], second), t)
    mod = tvm.IRModule({gv: part, "main": main})
    observed = observed_tensors(mod)
    # x (the constant is left out); the first result; the second call's new argument and its result.
    assert [key for key, _ in observed] == ["x", "lv", "lv#1", "lv#2"]
    assert [var for _, var in observed] == [x, first, plain, second]


def test_conv_relu_conv_min_max_is_the_numpy_answer():
    batches = _batches(3)
    table = collect_ranges(_conv_relu_conv(), batches, method="minmax", target=HOST)
    x = np.concatenate([b["x"] for b in batches])
    h = np.maximum(_conv2d(x, W1, B1, 1), 0)
    y = _conv2d(h, W2, B2, 0)
    assert list(table.ranges) == ["x", "lv", "gv"]  # input, conv+relu output, conv output
    assert table["x"] == (float(x.min()), float(x.max()))
    np.testing.assert_allclose(table["lv"], (0.0, h.max()), rtol=1e-5)
    np.testing.assert_allclose(table["gv"], (y.min(), y.max()), rtol=1e-5)
    assert table.method == "minmax" and table.model == "<ModelProto>" and table.options == {}


def test_calibrate_an_already_partitioned_module():
    model, batches = _conv_relu_conv(), _batches(2)
    inputs = frontend.import_model(model).inputs
    partitioned = _partitioned(model)
    table = calibrate_partitioned(partitioned, inputs, batches, "minmax", HOST, source="conv.onnx")
    assert table.ranges == collect_ranges(model, batches, target=HOST).ranges and table.model == "conv.onnx"
    with pytest.raises(CalibrationError, match=r"main takes 1 input\(s\) \['x'\], but 2 input\(s\)"):
        calibrate_partitioned(partitioned, inputs * 2, batches, "minmax", HOST)


@pytest.mark.parametrize("method, options", [("percentile", {"percentile": 99.0}), ("entropy", {})])
def test_histogram_methods_from_an_npz_file_stay_inside_min_max(tmp_path, method, options):
    batches = _batches(4, seed=1)
    np.savez(tmp_path / "calib.npz", x=np.concatenate([b["x"] for b in batches]))
    model = _conv_relu_conv()
    minmax = collect_ranges(model, batches, method="minmax", target=HOST)
    table = collect_ranges(model, tmp_path / "calib.npz", method=method, target=HOST, **options)
    assert list(table.ranges) == list(minmax.ranges) and table.method == method
    for key, (lo, hi) in table.ranges.items():
        mlo, mhi = minmax[key]
        assert mlo <= lo <= 0 <= hi <= mhi
    assert table["lv"][0] == 0.0  # a ReLU output
    if method == "percentile":  # 1 % of 128 outputs is cut
        assert table["gv"][1] < minmax["gv"][1]
    for key, value in options.items():
        assert table.options[key] == value


@pytest.fixture(scope="module")
def tiny_data():
    rng = np.random.default_rng(3)
    return [{"input": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(3)]


def test_tiny_convnet_every_partition_tensor_is_observed(tiny_data, tiny_compiled, tmp_path):
    import tvm
    from tvm import relax

    from tvmfuse.passes.partition import is_partition

    table = collect_ranges("zoo:tiny_convnet", tiny_data, method="minmax", target=HOST)
    partitioned = _partitioned("zoo:tiny_convnet")
    observed = observed_tensors(partitioned)
    keys = [key for key, _ in observed]
    assert list(table.ranges) == keys and len(set(keys)) == len(keys)
    assert keys == [key for key, _ in observed_tensors(_partitioned("zoo:tiny_convnet"))]  # deterministic
    calls = [b for block in partitioned["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar)
             and is_partition(partitioned[b.value.op])]
    wanted = []
    for b in calls:
        wanted += [a for a in b.value.args if isinstance(a, relax.Var) and a not in wanted] + [b.var]
    assert len(calls) >= 5 and [var for _, var in observed] == wanted
    x = np.concatenate([b["input"] for b in tiny_data])
    assert table["input"] == (float(x.min()), float(x.max()))
    # The model's output is the last partition's result: its range is what the compiled model returns.
    outs = np.concatenate([tiny_compiled.run(b)[0] for b in tiny_data])
    np.testing.assert_allclose(table[keys[-1]], (outs.min(), outs.max()), rtol=1e-4, atol=1e-6)
    for lo, hi in table.ranges.values():  # every range makes u8 activation parameters
        assert activation_params(lo, hi).scale > 0
    # The table is reusable: saved, loaded, and keyed as a pass on the same module recomputes.
    assert CalibrationTable.load(table.save(tmp_path / "t.json")) == table


def test_model_without_partitions_gives_an_empty_table():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 4])], [("y", [1, 4])])
    table = collect_ranges(model, [{"x": np.ones((1, 4), np.float32)}], method="entropy", target=HOST)
    assert len(table) == 0 and table.method == "entropy"


# ---- bad input ----

def test_wrong_input_name():
    with pytest.raises(CalibrationDataError, match=r"calibration batch 0: unknown input name\(s\) \['images'\]; "
                                                   r"no data for input\(s\) \['x'\]"):
        collect_ranges(_conv_relu_conv(), [{"images": np.zeros((2, 1, 6, 6), np.float32)}], target=HOST)


def test_wrong_shape_and_dtype_name_the_batch():
    good = _batches(1)[0]
    with pytest.raises(CalibrationDataError, match=r"calibration batch 1: input 'x' expects shape \(2, 1, 6, 6\), "
                                                   r"got \(1, 1, 6, 6\)"):
        collect_ranges(_conv_relu_conv(), [good, {"x": good["x"][:1]}], target=HOST)
    with pytest.raises(CalibrationDataError, match="calibration batch 0: input 'x' expects dtype float32, got int32"):
        collect_ranges(_conv_relu_conv(), [{"x": good["x"].astype(np.int32)}], target=HOST)


def test_empty_calibration_set():
    with pytest.raises(CalibrationError, match="empty calibration set"):
        collect_ranges(_conv_relu_conv(), [], target=HOST)


def test_non_finite_activation_names_the_tensor():
    batch = _batches(1)[0]
    batch["x"][0, 0, 0, 0] = np.inf
    with pytest.raises(CalibrationError, match="tensor 'x', calibration batch 0: 1 of 72 observed values"):
        collect_ranges(_conv_relu_conv(), [batch], target=HOST)


def test_unknown_method_fails_before_compiling():
    with pytest.raises(CalibrationError, match="unknown calibration method 'mse'; known methods: minmax"):
        collect_ranges("does-not-exist.onnx", [], method="mse", target=HOST)


def test_targets_that_cannot_run_here():
    with pytest.raises(TargetError, match="code for target .cuda-sm80. does not run on this CPU"):
        collect_ranges(_conv_relu_conv(), _batches(1), target="cuda-sm80")
    avx512 = targets.resolve("x86-avx512")
    if avx512.backend().runs_on_this_cpu():
        pytest.skip("this CPU runs x86-avx512 code")
    with pytest.raises(TargetError, match="this CPU lacks .*'x86-avx512'"):
        collect_ranges(_conv_relu_conv(), _batches(1), target="x86-avx512")
