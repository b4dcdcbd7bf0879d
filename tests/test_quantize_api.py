"""tvmfuse.quantize and `tvmfuse quantize`: INT8 vs FP32 numbers, export and load, the CLI with and without a
saved table, bad calibration input, and accuracy on real data (digits).

Tolerance for INT8 vs FP32 on random-weight models: the largest absolute difference of any output element is
at most 3 % of the FP32 output's range (max - min). zoo:tiny_convnet is checked on fresh inputs drawn like the
calibration data; the residual block on the calibration inputs themselves, because with random weights a
fresh input can drive an inner activation past its calibrated range (clipped: up to 8 % seen), which is the
calibration set's coverage, not the kernels' arithmetic.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import tvmfuse
from tvmfuse import cli
from tvmfuse.passes.int8.quantize import QuantizeWarning
from tvmfuse.quant.data import CalibrationDataError
from tvmfuse.quant.table import CalibrationError
from tvmfuse.schedules.computes import int8, int8_ref

from helpers import HOST
from helpers.quantize import (conv_pool_conv, conv_relu_conv, conv_silu_conv, depthwise_5x5, depthwise_s2,
                              grouped_conv_sigmoid,
                              inverted_residual, random_batches, residual_block, spelt_hardswish, squeeze_excite,
                              stem_concat, two_outputs)

TOLERANCE = 0.03  # of the FP32 output range


def _relative_error(int8_model, fp32_model, batches):
    worst = 0.0
    for batch in batches:
        got, want = int8_model.run(batch)[0], fp32_model.run(batch)[0]
        worst = max(worst, float(np.abs(got - want).max() / (want.max() - want.min())))
    return worst


@pytest.fixture(scope="module")
def tiny_int8():
    calib = random_batches((1, 3, 32, 32), 8, seed=0, name="input")
    return tvmfuse.quantize("zoo:tiny_convnet", calib=calib, method="entropy", target=HOST)


def test_tiny_convnet_int8_is_close_to_fp32(tiny_int8, tiny_compiled):
    q = tiny_int8.quantization
    assert (q["int8_partitions"], q["fp32_partitions"], q["method"], q["calibrated"]) == (7, 0, "entropy", True)
    assert q["fp32_reasons"] == []
    assert _relative_error(tiny_int8, tiny_compiled, random_batches((1, 3, 32, 32), 4, 9, "input")) < TOLERANCE


def test_export_and_load_run_the_int8_model(tiny_int8, tmp_path):
    path = tiny_int8.export(tmp_path / "tiny_int8.so")
    manifest = json.loads(path.with_suffix(".json").read_text())
    assert manifest["quantization"]["int8_partitions"] == 7 and manifest["quantization"]["table"] is None
    assert any(k.startswith("tvmfuse_int8_depthwise_conv2d") for k in manifest["kernels"])
    loaded = tvmfuse.load(path)
    batch = random_batches((1, 3, 32, 32), 1, 5, "input")[0]
    np.testing.assert_array_equal(loaded.run(batch)[0], tiny_int8.run(batch)[0])


@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_residual_block_int8_is_close_to_fp32(method):
    model = residual_block(from_input=False)
    calib = random_batches((1, 8, 6, 6), 8, 1)
    cm = tvmfuse.quantize(model, calib=calib, method=method, target=HOST, percentile=99.995)
    assert cm.quantization["int8_partitions"] == 2
    assert cm.quantization["options"] == ({"percentile": 99.995, "num_bins": 2048} if method == "percentile" else {})
    assert _relative_error(cm, tvmfuse.compile(model, target=HOST), calib) < TOLERANCE
    # The INT8 kernels got their x86 schedule (vectorized register tiles; too small to run in parallel), not
    # TVM's scalar default.
    kernels = [f for gv, f in cm.lowered.functions_items()
               if getattr(f, "attrs", None) and str(f.attrs.get("tvmfuse.family", "")).startswith("int8_")]
    assert len(kernels) == 2 and all("T.vectorized" in f.script() for f in kernels)


@pytest.mark.parametrize("spelling", ["paddle", "torch"])
def test_hardswish_int8_is_close_to_fp32(spelling):
    model = spelt_hardswish(spelling)
    calib = random_batches((1, 3, 8, 8), 8, 3)
    cm = tvmfuse.quantize(model, calib=calib, method="minmax", target=HOST)
    assert (cm.quantization["int8_partitions"], cm.quantization["fp32_partitions"]) == (3, 0)
    assert _relative_error(cm, tvmfuse.compile(model, target=HOST), calib) < TOLERANCE


@pytest.mark.parametrize("channels,output", [(16, False), (24, False), (24, True)])
def test_max_pool_of_uint8_codes_is_close_to_fp32(channels, output):
    """Between INT8 kernels, and as the model output (the pooled codes dequantized)."""
    model = conv_pool_conv(channels=channels, pool_is_output=output)
    calib = random_batches((1, 3, 16, 16), 8, 2)
    cm = tvmfuse.quantize(model, calib=calib, method="minmax", target=HOST)
    assert cm.quantization["uint8_pools"] == 1 and cm.quantization["quantize_ops"] == 1
    assert _relative_error(cm, tvmfuse.compile(model, target=HOST), calib) < TOLERANCE


def test_residual_block_is_bit_exact_against_the_numpy_int8_reference(tmp_path):
    """The kernels' constants (quantized weights, folded biases, multipliers) and borders, composed in numpy:
    quantize the input, conv+relu to uint8, conv + uint8 residual + relu to float32."""
    from onnx import numpy_helper

    from tvmfuse import targets
    from tvmfuse.passes.int8.kernels import weight_limit
    from tvmfuse.quant.params import activation_params, bias_params, weight_params
    from tvmfuse.quant.table import CalibrationTable
    from tvmfuse.schedules import families

    model = residual_block(from_input=False)
    limit = weight_limit(families.CONV2D.int8, targets.resolve(HOST).backend().int8_weights)  # 7-bit without VNNI
    cm = tvmfuse.quantize(model, calib=random_batches((1, 8, 6, 6), 4, 1), method="minmax", target=HOST,
                          table=tmp_path / "t.json")
    ranges = CalibrationTable.load(tmp_path / "t.json").ranges
    assert list(ranges) == ["x", "lv", "gv"]  # model input, conv1+relu output, block output
    px, ph = activation_params(*ranges["x"]), activation_params(*ranges["lv"])
    w = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    def conv(codes, p_in, name, multiplier_scale, epilogue, residual=None):
        wp = weight_params(w[f"{name}.w"], limit=limit)
        bias = bias_params(p_in.scale, wp).quantize(w[f"{name}.b"])
        m = int8_ref.requant_multiplier(p_in.scale, wp.scale, multiplier_scale)
        return int8_ref.conv2d_ref(codes, wp.quantize(w[f"{name}.w"]), bias, m, residual, padding=1,
                                   input_zero_point=p_in.zero_point, epilogue=epilogue)

    for batch in random_batches((1, 8, 6, 6), 3, 8):
        h = conv(px.quantize(batch["x"]), px, "conv1", ph.scale, int8.Epilogue.make("uint8", ph.zero_point,
                                                                                       ph.scale, "relu"))
        y = conv(h, ph, "conv2", None, int8.Epilogue.make("float32", activation="relu",
                                                          residual=int8.Residual(ph.zero_point, ph.scale)), h)
        np.testing.assert_array_equal(cm.run(batch)[0], y)


@pytest.mark.parametrize("name, model, shape", [
    ("inverted_residual", inverted_residual(), (1, 8, 10, 10)),
    ("depthwise_s2_40ch", depthwise_s2(channels=40, size=14), (1, 8, 14, 14)),
    ("two_outputs", two_outputs(), (1, 3, 8, 8)),
    ("stem_concat", stem_concat(16), (1, 3, 12, 12)),
    ("depthwise_5x5", depthwise_5x5(), (1, 8, 3, 20)),  # without VNNI: the float form, padding rows skipped
])
def test_nchw16c_codes_give_the_same_integers_as_nchw(name, model, shape, tmp_path):
    """The blocked layout moves the codes, not the arithmetic: every output equals the NCHW build's, bit for
    bit (padded channels included, which never reach an output)."""
    calib = random_batches(shape, 4, 2)
    nchw = tvmfuse.quantize(model, calib=calib, method="minmax", target=HOST, table=tmp_path / "t.json",
                            layout="nchw")
    blocked = tvmfuse.quantize(model, table=tmp_path / "t.json", target=HOST)
    assert nchw.quantization["blocked_outputs"] == 0 and blocked.quantization["blocked_outputs"] >= 1
    for batch in random_batches(shape, 2, 7):
        for got, want in zip(blocked.run(batch), nchw.run(batch)):
            np.testing.assert_array_equal(got, want)


def test_nothing_quantizable_compiles_exactly_as_fp32():
    model = grouped_conv_sigmoid()
    batches = random_batches((1, 4, 6, 6), 2, 6)
    with pytest.warns(QuantizeWarning, match=r"grouped conv2d \(groups=2\) has no INT8 kernel"):
        cm = tvmfuse.quantize(model, calib=batches, method="minmax", target=HOST)
    assert cm.quantization["int8_partitions"] == 0 and cm.quantization["quantize_ops"] == 0
    np.testing.assert_array_equal(cm.run(batches[0])[0], tvmfuse.compile(model, target=HOST).run(batches[0])[0])


@pytest.mark.parametrize("silu_output", [False, True], ids=["silu_inside", "silu_also_an_output"])
def test_conv_silu_quantizes_the_conv_and_stays_near_fp32(silu_output):
    """YOLO's conv + SiLU: both convs INT8, the SiLU the first one's output table, near the FP32 result; the
    SiLU's result as a model output too (dequantized from the table's codes) is near FP32 as well."""
    model = conv_silu_conv(silu_output)
    batches = random_batches((1, 3, 8, 8), 4, 9)
    cm = tvmfuse.quantize(model, calib=batches, method="minmax", target=HOST)
    q = cm.quantization
    assert (q["int8_partitions"], q["fp32_partitions"], q["table_outputs"]) == (2, 0, 1)
    fp32 = tvmfuse.compile(model, target=HOST)
    for batch in batches[:2]:
        for got, want in zip(cm.run(batch), fp32.run(batch)):
            assert np.abs(got - want).max() <= 0.03 * np.abs(want).max()


@pytest.mark.parametrize("model, shape, seed, counts", [
    (squeeze_excite(), (1, 8, 8, 8), 11, {"uint8_means": 1, "uint8_gates": 1}),
    (squeeze_excite(gate_output=True), (1, 8, 8, 8), 11, {"uint8_means": 1, "uint8_gates": 1}),
    (stem_concat(16), (1, 3, 12, 12), 13, {"uint8_concats": 1, "uint8_pools": 1}),
    (stem_concat(12), (1, 3, 12, 12), 13, {"uint8_concats": 1, "uint8_pools": 1}),
], ids=["se", "se-gate-output", "concat-blocks", "concat-nchw"])
def test_ops_on_codes_stay_close_to_fp32(model, shape, seed, counts):
    """The SE block's mean and gate, and PP-HGNet's stem max-pool and concat (the conv branch's codes
    requantized to the concat's parameters in its kernel), run on uint8 codes (no float tensor between the
    INT8 kernels): end to end within the INT8 tolerance of the FP32 build."""
    batches = random_batches(shape, 4, seed)
    cm = tvmfuse.quantize(model, calib=batches, method="minmax", target=HOST)
    assert {k: cm.quantization[k] for k in counts} == counts
    fp32 = tvmfuse.compile(model, target=HOST)
    for batch in batches[:2]:
        for got, want in zip(cm.run(batch), fp32.run(batch)):
            assert np.abs(got - want).max() <= TOLERANCE * (want.max() - want.min())


# ---- the command line ----

def test_cli_calibrates_writes_the_table_then_reuses_it(tmp_path, capsys):
    model = tmp_path / "crc.onnx"
    model.write_bytes(conv_relu_conv().SerializeToString())
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32))
    table, first, second = tmp_path / "table.json", tmp_path / "a.so", tmp_path / "b.so"
    assert cli.main(["quantize", str(model), "--calib", str(tmp_path / "calib.npz"), "--method", "minmax",
                     "--target", HOST, "-o", str(first), "--table", str(table)]) == 0
    out = capsys.readouterr().out
    assert "2 INT8 partition(s) (" in out and "-bit weights), 0 FP32, 1 quantize / 0 dequantize op(s)" in out
    assert f"table {table}" in out
    assert json.loads(table.read_text())["method"] == "minmax"
    assert cli.main(["quantize", str(model), "--table", str(table), "--target", HOST, "-o", str(second), "-q"]) == 0
    manifests = [json.loads(p.with_suffix(".json").read_text())["quantization"] for p in (first, second)]
    assert manifests[0]["calibrated"] and manifests[0]["calibration_batches"] == 4
    assert not manifests[1]["calibrated"] and manifests[1]["table"] == str(table)
    batch = random_batches((1, 3, 8, 8), 1, 7)[0]
    np.testing.assert_array_equal(tvmfuse.load(first).run(batch)[0], tvmfuse.load(second).run(batch)[0])


@pytest.mark.parametrize("argv, message", [
    ([], "quantize needs --calib DATA or --table TABLE"),
    (["--table", "missing.json"], "calibration table not found: missing.json"),
    (["--calib", "c.npz", "--method", "mse"], "unknown calibration method 'mse'"),
    (["--calib", "c.npz", "--percentile", "99"], "--percentile applies to --method percentile, not entropy"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(["quantize", "zoo:tiny_convnet", "-o", "x.so", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tvmfuse quantize: error: ") and message in err and err.count("\n") == 1


# ---- bad calibration input: each a clear error naming the problem ----

def test_wrong_input_names(tmp_path):
    np.savez(tmp_path / "c.npz", images=np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(CalibrationDataError, match=r"c.npz: unknown input name\(s\) \['images'\]; no data for "
                                                   r"input\(s\) \['x'\]; the model's inputs are 'x' \(1, 3, 8, 8\)"):
        tvmfuse.quantize(conv_relu_conv(), calib=tmp_path / "c.npz", target=HOST)


def test_wrong_shapes_and_dtypes():
    with pytest.raises(CalibrationDataError, match=r"calibration batch 1: input 'x' expects shape \(1, 3, 8, 8\), "
                                                   r"got \(1, 3, 4, 4\)"):
        tvmfuse.quantize(conv_relu_conv(), calib=[{"x": np.zeros((1, 3, 8, 8), np.float32)},
                                                  {"x": np.zeros((1, 3, 4, 4), np.float32)}], target=HOST)
    with pytest.raises(CalibrationDataError, match="calibration batch 0: input 'x' expects dtype float32, got int32"):
        tvmfuse.quantize(conv_relu_conv(), calib={"x": np.zeros((1, 3, 8, 8), np.int32)}, target=HOST)


def test_empty_calibration_sets(tmp_path):
    with pytest.raises(CalibrationDataError, match="empty calibration set: no batches were given"):
        tvmfuse.quantize(conv_relu_conv(), calib=[], target=HOST)
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 3, 8, 8), np.float32))
    with pytest.raises(CalibrationDataError, match=r"empty.npz: empty calibration set \(0 samples for input 'x'\)"):
        tvmfuse.quantize(conv_relu_conv(), calib=tmp_path / "empty.npz", target=HOST)
    (tmp_path / "none").mkdir()
    with pytest.raises(CalibrationDataError, match=r"none: empty calibration set \(no .npy files"):
        tvmfuse.quantize(conv_relu_conv(), calib=tmp_path / "none", target=HOST)


def test_corrupt_tables(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "tvmfuse-calibration", "ranges": {')
    with pytest.raises(CalibrationError, match=r"bad.json: calibration table is not valid JSON"):
        tvmfuse.quantize(conv_relu_conv(), table=bad, target=HOST)
    bad.write_text(json.dumps({"format": "tvmfuse-calibration", "format_version": 1, "method": "minmax",
                               "options": {}, "model": "m", "tvmfuse_version": "0", "ranges": {"x": [3, -3]}}))
    with pytest.raises(CalibrationError, match=r"bad.json: range of tensor 'x' has lo > hi: \[3.0, -3.0\]"):
        tvmfuse.quantize(conv_relu_conv(), table=bad, target=HOST)


def test_a_table_object_and_calibration_data_are_exclusive():
    from tvmfuse.quant.table import CalibrationTable

    with pytest.raises(CalibrationError, match="both calibration data and a CalibrationTable"):
        tvmfuse.quantize(conv_relu_conv(), calib=[], table=CalibrationTable({}, "minmax"), target=HOST)


# ---- accuracy on real data ----

def test_digits_int8_accuracy_loses_at_most_half_a_point():
    """A CNN trained here on scikit-learn's digits; the best calibration method loses <= 0.5 points."""
    pytest.importorskip("sklearn")
    from helpers import digits_cnn

    split = digits_cnn.load_split(seed=0)
    model = digits_cnn.to_onnx(digits_cnn.train(split.x_train, split.y_train, seed=0))
    fp32 = digits_cnn.model_accuracy(tvmfuse.compile(model, target=HOST, logs=False), split.x_test, split.y_test)
    assert fp32 > 90
    calib = digits_cnn.batches(split.x_train)[:5]
    losses = {}
    for method in ("minmax", "entropy", "percentile"):
        cm = tvmfuse.quantize(model, calib=calib, method=method, target=HOST, logs=False)
        assert cm.quantization["int8_partitions"] == 3  # both convs and the dense head
        losses[method] = fp32 - digits_cnn.model_accuracy(cm, split.x_test, split.y_test)
    assert min(losses.values()) <= 0.5, losses
