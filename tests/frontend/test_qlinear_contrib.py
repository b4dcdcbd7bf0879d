"""onnxruntime's quantized contrib operators (``quantize_static`` in its QOperator format) in QDQ form
(``frontend/qlinear_contrib.py``): a small CNN quantized by onnxruntime compiles onto tvmfuse's INT8 kernels
and matches onnxruntime's own run of it, and each operator's options match alone."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse import frontend
from helpers import ORT_U8S8_EXACT, make_model, ort_run
from helpers.qdq import ort_quantize, output_scale

MS = "com.microsoft"
RNG = np.random.default_rng(0)
W_MAX = 127 if ORT_U8S8_EXACT else 63  # weights onnxruntime, the reference here, multiplies exactly


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _cnn():
    w = lambda name, shape: _init(name, (RNG.standard_normal(shape) * 0.3).astype("float32"))  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c2", "r1"], ["a2"]),
             helper.make_node("Sigmoid", ["a2"], ["s2"]), helper.make_node("Mul", ["a2", "s2"], ["m2"]),
             helper.make_node("LeakyRelu", ["m2"], ["l2"], alpha=0.1),
             helper.make_node("AveragePool", ["l2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p2", "W3", "B3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["c3", "p2"], ["cat"], axis=1),
             helper.make_node("GlobalAveragePool", ["cat"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "M", "MB"], ["y"], transB=1)]
    inits = [w("W1", (8, 4, 3, 3)), w("B1", (8,)), w("W2", (8, 8, 3, 3)), w("B2", (8,)), w("W3", (8, 8, 3, 3)),
             w("B3", (8,)), w("M", (10, 16)), w("MB", (10,))]
    return make_model(nodes, [("x", [1, 4, 8, 8])], [("y", None)], inits, opset=13)


def test_a_cnn_quantized_by_onnxruntime_in_qoperator_format(tmp_path):
    quantized = ort_quantize(_cnn(), tmp_path, fmt="qoperator", reduce_range=not ORT_U8S8_EXACT)
    ops = collections.Counter(n.op_type for n in quantized.graph.node if n.domain == MS)
    assert set(ops) == {"QLinearAdd", "QLinearSigmoid", "QLinearMul", "QLinearLeakyRelu", "QLinearAveragePool",
                        "QLinearConcat", "QLinearGlobalAveragePool", "QGemm"}, ops
    cm = tvmfuse.compile(quantized, target="x86-host")
    kernels = [k for k in cm.manifest()["scheduled_by"] if k.startswith("tvmfuse_int8")]
    assert len(kernels) == 4, kernels  # the three convs and the QGemm on INT8 kernels
    x = {"x": RNG.standard_normal((1, 4, 8, 8)).astype("float32")}
    got, want = cm.run(x)[0], ort_run(quantized, x)[0]
    assert np.abs(got - want).max() <= output_scale(quantized) + 1e-6  # at most one output code apart


def _codes(shape, dtype=np.uint8):
    return RNG.integers(0, 256, shape).astype(dtype)


def _check(nodes, inputs: dict, inits, tol_codes: float = 1.0, y_scale: float = 0.05, out=TensorProto.UINT8):
    """Run the one-op model on uint8 ``inputs`` (name -> codes): at most ``tol_codes`` output codes apart."""
    graph = helper.make_graph(nodes, "one_op",
                              [helper.make_tensor_value_info(k, TensorProto.UINT8, list(v.shape)) for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", out, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)],
                              ir_version=9)
    got, want = tvmfuse.compile(model, target="x86-host").run(inputs)[0], ort_run(model, inputs)[0]
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    assert diff.max() <= tol_codes * (1.0 if got.dtype == np.uint8 else y_scale) + 1e-6, diff.max()


@pytest.mark.parametrize("channels_last", [0, 1])
def test_global_average_pool_in_either_layout(channels_last):
    shape = (1, 5, 5, 8) if channels_last else (1, 8, 5, 5)
    nodes = [helper.make_node("QLinearGlobalAveragePool", ["x", "s", "z", "ys", "yz"], ["y"], domain=MS,
                              channels_last=channels_last)]
    inits = [_init("s", np.float32(0.1)), _init("z", np.uint8(120)), _init("ys", np.float32(0.05)), _init("yz", np.uint8(128))]
    _check(nodes, {"x": _codes(shape)}, inits)


def test_concat_of_inputs_at_different_scales():
    nodes = [helper.make_node("QLinearConcat", ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], ["y"], domain=MS, axis=1)]
    inits = [_init("ys", np.float32(0.08)), _init("yz", np.uint8(100)), _init("as", np.float32(0.05)),
             _init("az", np.uint8(128)), _init("bs", np.float32(0.11)), _init("bz", np.uint8(90))]
    _check(nodes, {"a": _codes((1, 3, 4, 4)), "b": _codes((1, 5, 4, 4))}, inits)


@pytest.mark.parametrize("quantized_output", [True, False])
def test_qgemm_per_column_weights_with_bias(quantized_output):
    k, n = 16, 6
    names = ["a", "as", "az", "b", "bs", "bz", "c"] + (["ys", "yz"] if quantized_output else [])
    nodes = [helper.make_node("QGemm", names, ["y"], domain=MS, transB=1, alpha=1.0)]
    inits = [_init("as", np.float32(0.04)), _init("az", np.uint8(128)),
             _init("b", RNG.integers(-W_MAX, W_MAX + 1, (n, k)).astype(np.int8)),
             _init("bs", RNG.uniform(0.005, 0.02, n).astype(np.float32)), _init("bz", np.zeros(n, np.int8)),
             _init("c", RNG.integers(-2000, 2000, n).astype(np.int32))]
    if quantized_output:
        inits += [_init("ys", np.float32(0.5)), _init("yz", np.uint8(128))]
    _check(nodes, {"a": _codes((2, k))}, inits, y_scale=0.5 if quantized_output else 1e-4,
           out=TensorProto.UINT8 if quantized_output else TensorProto.FLOAT)


def test_matmul_integer_to_float():
    k, n = 24, 5
    a = _codes((3, k))
    b = RNG.integers(-127, 128, (k, n)).astype(np.int8)
    a_s, b_s, a_z, bias = np.float32(0.03), RNG.uniform(0.01, 0.02, n).astype(np.float32), np.uint8(120), \
        RNG.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMulIntegerToFloat", ["a", "b", "as", "bs", "az", "", "bias"], ["y"], domain=MS)]
    inits = [_init("b", b), _init("as", a_s), _init("bs", b_s), _init("az", a_z), _init("bias", bias)]
    graph = helper.make_graph(nodes, "one_op", [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)],
                              ir_version=9)
    want = (a.astype(np.float64) - 120) @ b.astype(np.float64) * (np.float64(a_s) * b_s) + bias
    got = tvmfuse.compile(model, target="x86-host").run({"a": a})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    if ORT_U8S8_EXACT:  # else its pair sums saturate on these 8-bit weights
        np.testing.assert_allclose(ort_run(model, {"a": a})[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_quantize_lstm(tmp_path, direction, per_channel):
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    steps, inputs, hidden, dirs = 6, 10, 8, 2 if direction == "bidirectional" else 1
    w = (RNG.standard_normal((dirs, 4 * hidden, inputs)) * 0.3).astype("float32")
    r = (RNG.standard_normal((dirs, 4 * hidden, hidden)) * 0.3).astype("float32")
    b = (RNG.standard_normal((dirs, 8 * hidden)) * 0.1).astype("float32")
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=hidden, direction=direction)
    graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, inputs])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_init("W", w), _init("R", r), _init("B", b)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["LSTM"], per_channel=per_channel, reduce_range=not ORT_U8S8_EXACT)
    quantized = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in quantized.graph.node] == ["DynamicQuantizeLSTM"]
    x = {"x": RNG.standard_normal((steps, 1, inputs)).astype("float32")}
    # The recurrent weight reaches the whole-sequence kernel as its int8 codes, the float copy gone; the input
    # projection is an INT8 MatMul on W's codes.
    prepared = frontend.prepare(quantized, fused_recurrence=True, int8_weights="vnni")[0]
    assert [n.op_type for n in prepared.graph.node].count("IntegerMatMul") == 1
    kernel = next(n for n in prepared.graph.node if n.op_type == "Recurrence")
    consts = {t.name: numpy_helper.to_array(t) for t in prepared.graph.initializer}
    assert consts[kernel.input[1]].dtype == np.int8 and consts[kernel.input[4]].shape == (dirs, 4 * hidden)
    assert not any(n.op_type == "DequantizeLinear" for n in prepared.graph.node)
    got = tvmfuse.compile(quantized, target="x86-host").run(x)[0]
    # The same LSTM on the dequantized weights, in float: what the rewrite computes.
    inits = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}

    def dequantized(name):
        q, s, z = (inits[f"{name}_quantized"].astype(np.float32), inits[f"{name}_scale"],
                   inits[f"{name}_zero_point"].astype(np.float32))
        shape = (dirs, 1, -1) if s.ndim == 2 else (dirs, 1, 1)
        return ((q - z.reshape(shape)) * s.reshape(shape)).transpose(0, 2, 1).astype("float32")

    graph.initializer[0].CopyFrom(_init("W", dequantized("W")))
    graph.initializer[1].CopyFrom(_init("R", dequantized("R")))
    float_twin = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    # The input projection reads x quantized at run time, as the operator defines it (DynamicQuantizeLinear).
    lo, hi = min(0.0, float(x["x"].min())), max(0.0, float(x["x"].max()))
    scale = np.float32((hi - lo) / 255)
    zero = np.clip(np.rint(-lo / scale), 0, 255)
    codes = np.clip(np.rint(x["x"] / scale) + zero, 0, 255)
    x_dq = {"x": ((codes - zero) * scale).astype("float32")}
    np.testing.assert_allclose(got, ort_run(float_twin, x_dq)[0], rtol=1e-5, atol=1e-5)
    # onnxruntime also quantizes h at each step: within 2% of the output's range of it.
    want = ort_run(quantized, x)[0]
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()
