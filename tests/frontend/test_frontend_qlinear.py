"""The rewrite of QLinearConv, QLinearMatMul and ConvInteger (tvmfuse.frontend.qlinear), and MatMulInteger.

Structure: the op counts and the canonical QDQ form after the rewrite. Numbers: ConvInteger/MatMulInteger
exact on a reduction float32 cannot hold; QLinearConv/QLinearMatMul against onnxruntime and against the
spec's exact integer accumulation, with the share of exactly equal outputs printed (``-s``).

onnxruntime is the reference only for uint8 weights: on a CPU without VNNI its u8 x s8 kernels sum pairs
of products in int16 with saturation (vpmaddubsw), so full-range int8 weights differ from the spec there
by tens of units (7-bit weights agree). Full-range int8 weights are checked against numpy instead.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse import frontend
from tvmfuse.errors import UnsupportedOpError
from tvmfuse.frontend.qlinear import rewrite_quantized_ops

from helpers import HOST, ort_run

QCONV_INPUTS = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]


def _model(node, inputs, inits, out_dtype, opset=13) -> onnx.ModelProto:
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(node.output[0], out_dtype, None)],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def qlinear_conv(c=8, m=4, hw=6, k=3, per_channel=True, bias=True, group=1, w_dtype="uint8", seed=0, **attrs):
    """A QLinearConv model with realistic random parameters (outputs spread over most of uint8) and its input."""
    rng = np.random.default_rng(seed)
    lo, hi, zp = (0, 256, 128) if w_dtype == "uint8" else (-128, 128, 0)
    w_scale = rng.uniform(0.002, 0.01, m) if per_channel else np.array(0.005)
    # std of (x - 128) * (w - zp) for uniform 8-bit values is about 74 * 74; 6 std over the 256 codes.
    reduction = c // group * k * k
    y_scale = 6 * 74 * 74 * np.sqrt(reduction) * 0.02 * float(np.mean(w_scale)) / 255
    inits = {"xs": np.float32(0.02), "xz": np.uint8(128),
             "w": rng.integers(lo, hi, (m, c // group, k, k)).astype(w_dtype),
             "ws": w_scale.astype(np.float32), "wz": np.full(w_scale.shape, zp, w_dtype),
             "ys": np.float32(y_scale), "yz": np.uint8(128)}
    inputs = list(QCONV_INPUTS)
    if bias:
        inits["B"] = rng.integers(-5000, 5000, m).astype(np.int32)
        inputs.append("B")
    pads = attrs.pop("pads", [k // 2] * 4)  # None: no pads attribute (auto_pad)
    if pads is not None:
        attrs["pads"] = pads
    node = helper.make_node("QLinearConv", inputs, ["y"], name="qc", group=group, **attrs)
    model = _model(node, [("x", TensorProto.UINT8, [1, c, hw, hw])], inits, TensorProto.UINT8)
    return model, rng.integers(0, 256, (1, c, hw, hw)).astype(np.uint8)


def qlinear_matmul(k=16, n=8, per_column=False, seed=0, a_shape=(2, 4)):
    rng = np.random.default_rng(seed)
    b_scale = rng.uniform(0.002, 0.01, n) if per_column else np.array(0.005)
    inits = {"as": np.float32(0.02), "az": np.uint8(128), "b": rng.integers(0, 256, (k, n)).astype(np.uint8),
             "bs": b_scale.astype(np.float32), "bz": np.full(b_scale.shape, 128, np.uint8),
             "ys": np.float32(6 * 74 * 74 * np.sqrt(k) * 0.02 * float(np.mean(b_scale)) / 255), "yz": np.uint8(128)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"], name="qmm")
    model = _model(node, [("a", TensorProto.UINT8, [*a_shape, k])], inits, TensorProto.UINT8)
    return model, rng.integers(0, 256, (*a_shape, k)).astype(np.uint8)


def conv_integer(x_zp, w_zp, c=4, m=3, w_dtype="int8", seed=0):
    rng = np.random.default_rng(seed)
    inits = {"w": rng.integers(-128, 128, (m, c, 3, 3)).astype(w_dtype)}
    inputs = ["x", "w", "", ""]
    if x_zp is not None:
        inits["xz"], inputs[2] = np.uint8(x_zp), "xz"
    if w_zp is not None:
        inits["wz"], inputs[3] = np.asarray(w_zp, w_dtype), "wz"
    while not inputs[-1]:  # absent optional inputs: trailing ones are left out
        inputs.pop()
    node = helper.make_node("ConvInteger", inputs, ["y"], name="ci", pads=[1, 1, 1, 1])
    return _model(node, [("x", TensorProto.UINT8, [1, c, 5, 5])], inits, TensorProto.INT32, opset=10)


def _rewrite(model: onnx.ModelProto):
    """Rewrite a copy (the rewrite edits in place; the tests read the original's parameters)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return rewrite_quantized_ops(copy)


def _check_valid(model: onnx.ModelProto) -> None:
    """The rewritten graph is valid ONNX: every node type-checks against its schema."""
    for node in model.graph.node:
        onnx.checker.check_node(node, onnx.checker.DEFAULT_CONTEXT)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def _ops(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _init(model, name) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def _conv_int64(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """Exact integer NCHW conv (stride 1, group 1) accumulated in int64."""
    x = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[2]
    oh, ow = x.shape[2] - k + 1, x.shape[3] - k + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow), np.int64)
    for i in range(k):
        for j in range(k):
            out += np.einsum("nchw,mc->nmhw", x[:, :, i:i + oh, j:j + ow], w[:, :, i, j].astype(np.int64))
    return out


def _agreement(got: np.ndarray, ref: np.ndarray, what: str) -> tuple[int, float]:
    diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
    share = float(np.mean(diff == 0))
    print(f"\n{what}: {share:.5%} of {diff.size} outputs equal, max abs diff {diff.max()}")
    return int(diff.max()), share


# --- structure ---------------------------------------------------------------------------------------


def test_qlinear_conv_becomes_canonical_qdq():
    model, _ = qlinear_conv(per_channel=True, bias=True)
    out, count = _rewrite(model)
    assert count == 1
    assert _ops(out) == {"DequantizeLinear": 3, "Conv": 1, "QuantizeLinear": 1}
    dq = {n.input[0]: n for n in out.graph.node if n.op_type == "DequantizeLinear"}
    conv = next(n for n in out.graph.node if n.op_type == "Conv")
    quant = next(n for n in out.graph.node if n.op_type == "QuantizeLinear")
    assert list(conv.input) == [dq["x"].output[0], dq["w"].output[0], dq["B"].output[0]]
    assert conv.name == "qc" and _attrs(conv)["pads"] == [1, 1, 1, 1] and _attrs(conv)["group"] == 1
    assert quant.input[0] == conv.output[0] and quant.output[0] == "y"
    # Per-channel weight and bias along axis 0; the activation is per-tensor (no axis attribute).
    assert _attrs(dq["w"]) == {"axis": 0} and _attrs(dq["B"]) == {"axis": 0} and _attrs(dq["x"]) == {}
    np.testing.assert_array_equal(_init(out, dq["B"].input[1]), _init(model, "ws") * np.float32(0.02))
    assert not np.any(_init(out, dq["B"].input[2])) and _init(out, dq["B"].input[2]).dtype == np.int32
    # The old scales and zero points are gone; the weight and bias stay as they were.
    names = {t.name for t in out.graph.initializer}
    assert {"w", "B"} <= names and not {"xs", "xz", "ws", "wz", "ys", "yz"} & names
    _check_valid(out)


def test_qlinear_conv_per_tensor_without_bias():
    model, _ = qlinear_conv(per_channel=False, bias=False)
    out, _ = _rewrite(model)
    assert _ops(out) == {"DequantizeLinear": 2, "Conv": 1, "QuantizeLinear": 1}
    assert all(not n.attribute for n in out.graph.node if n.op_type == "DequantizeLinear")
    assert all(_init(out, n.input[1]).shape == () for n in out.graph.node if n.op_type != "Conv")


def test_qlinear_matmul_becomes_qdq_with_per_column_weight():
    model, _ = qlinear_matmul(per_column=True)
    out, count = _rewrite(model)
    assert count == 1 and _ops(out) == {"DequantizeLinear": 2, "MatMul": 1, "QuantizeLinear": 1}
    dq_b = next(n for n in out.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "b")
    assert _attrs(dq_b) == {"axis": 1} and _init(out, dq_b.input[1]).shape == (8,)
    _check_valid(out)


@pytest.mark.parametrize("x_zp, w_zp, subs", [(7, 3, 2), (None, None, 0), (0, 0, 0), (0, [1, 0, 2], 1)])
def test_conv_integer_becomes_int32_conv(x_zp, w_zp, subs):
    out, count = _rewrite(conv_integer(x_zp, w_zp))
    assert count == 1 and (_ops(out)["Cast"], _ops(out)["Sub"], _ops(out)["Conv"], len(out.graph.node)) == \
        (2, subs, 1, 3 + subs)
    assert all(_attrs(n)["to"] == TensorProto.INT32 for n in out.graph.node if n.op_type == "Cast")
    if isinstance(w_zp, list):  # per output channel: broadcast over [M, C, kh, kw]
        sub = next(n for n in out.graph.node if n.op_type == "Sub")
        assert _init(out, sub.input[1]).shape == (3, 1, 1, 1) and _init(out, sub.input[1]).dtype == np.int32


def test_matmul_integer_is_left_to_tvm():
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    model = _model(node, [("a", TensorProto.UINT8, [2, 3])], {"b": np.ones((3, 2), np.uint8)}, TensorProto.INT32, 10)
    assert rewrite_quantized_ops(model)[1] == 0 and _ops(model) == {"MatMulInteger": 1}


def test_check_ops_accepts_the_rewritten_ops():
    model, _ = qlinear_conv()
    frontend.check_ops(model, "m.onnx")
    frontend.check_ops(conv_integer(1, 2), "m.onnx")


# --- exact integer ops ---------------------------------------------------------------------------------


@pytest.mark.parametrize("x_zp, w_zp", [(0, 0), (3, [-2, 0, 5, 1])])
def test_conv_integer_exact_on_a_large_reduction(x_zp, w_zp):
    # K = 512 * 3 * 3 = 4608 products of up to 255 * 128: sums far beyond float32's 2**24 integers.
    rng = np.random.default_rng(1)
    c, m = 512, 4
    w = np.where(rng.random((m, c, 3, 3)) < 0.8, -128, rng.integers(-128, 128, (m, c, 3, 3))).astype(np.int8)
    x = np.where(rng.random((1, c, 4, 4)) < 0.8, 255, rng.integers(0, 256, (1, c, 4, 4))).astype(np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], name="ci", pads=[1, 1, 1, 1])
    model = _model(node, [("x", TensorProto.UINT8, list(x.shape))],
                   {"w": w, "xz": np.uint8(x_zp), "wz": np.asarray(w_zp, np.int8)}, TensorProto.INT32, opset=10)
    got = tvmfuse.compile(model, target=HOST).run({"x": x})[0]
    ref = _conv_int64(x.astype(np.int64) - x_zp, w.astype(np.int64) - np.reshape(w_zp, (-1, 1, 1, 1)), 1)
    assert np.abs(ref).max() > 2 ** 26
    assert np.any(ref.astype(np.float32).astype(np.int64) != ref), "float32 would have been exact here"
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, ref)


def test_matmul_integer_exact_on_a_large_reduction():
    rng = np.random.default_rng(2)
    k = 4608
    a = np.where(rng.random((8, k)) < 0.8, 255, rng.integers(0, 256, (8, k))).astype(np.uint8)
    b = np.where(rng.random((k, 16)) < 0.8, -128, rng.integers(-128, 128, (k, 16))).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    model = _model(node, [("a", TensorProto.UINT8, [8, k])], {"b": b, "az": np.uint8(1), "bz": np.int8(-1)},
                   TensorProto.INT32, opset=10)
    got = tvmfuse.compile(model, target=HOST).run({"a": a})[0]
    ref = (a.astype(np.int64) - 1) @ (b.astype(np.int64) + 1)
    assert np.any(ref.astype(np.float32).astype(np.int64) != ref)
    np.testing.assert_array_equal(got, ref)


# --- QDQ numerics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(c=64, m=64, hw=28, per_channel=True, bias=True),
    dict(c=64, m=64, hw=28, per_channel=False, bias=False),
    dict(c=32, m=32, hw=28, group=32, per_channel=True, bias=True),
    dict(c=16, m=24, hw=15, strides=[2, 2], pads=None, auto_pad="SAME_UPPER"),
], ids=["per_channel_bias", "per_tensor", "depthwise", "stride2_same_upper"])
def test_qlinear_conv_matches_onnxruntime(kwargs):
    model, x = qlinear_conv(**kwargs)
    got = tvmfuse.compile(model, target=HOST).run({"x": x})[0]
    ref = ort_run(model, {"x": x})[0]
    assert got.dtype == ref.dtype == np.uint8 and got.shape == ref.shape
    worst, share = _agreement(got, ref, f"QLinearConv {kwargs} vs onnxruntime")
    assert worst <= 1 and share >= 0.99


def test_qlinear_conv_int8_weights_match_exact_integer_reference():
    model, x = qlinear_conv(c=128, m=64, hw=14, w_dtype="int8", per_channel=True, bias=True, seed=3)
    got = tvmfuse.compile(model, target=HOST).run({"x": x})[0]
    w, ws, bias = _init(model, "w"), _init(model, "ws").astype(np.float64), _init(model, "B")
    acc = _conv_int64(x.astype(np.int64) - 128, w, 1) + bias.reshape(1, -1, 1, 1)
    real = acc * (0.02 * ws.reshape(1, -1, 1, 1) / float(_init(model, "ys")))
    ref = np.clip(np.rint(real) + 128, 0, 255)
    assert 0.001 < np.mean((ref == 0) | (ref == 255)) < 0.05  # a realistic spread, few saturated outputs
    worst, share = _agreement(got, ref, "QLinearConv int8 weights vs exact int64 accumulation")
    assert worst <= 1 and share >= 0.99


@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_matches_onnxruntime(per_column):
    model, a = qlinear_matmul(k=256, n=96, per_column=per_column, a_shape=(2, 64))
    got = tvmfuse.compile(model, target=HOST).run({"a": a})[0]
    worst, share = _agreement(got, ort_run(model, {"a": a})[0], f"QLinearMatMul per_column={per_column}")
    assert worst <= 1 and share >= 0.99


def test_qlinear_matmul_of_two_activations():
    # Only scales and zero points need to be constants: b may be computed at run time (attention-like).
    model, a = qlinear_matmul(k=32, n=16)
    b = next(t for t in model.graph.initializer if t.name == "b")
    b_value = numpy_helper.to_array(b)
    model.graph.initializer.remove(b)
    model.graph.input.append(helper.make_tensor_value_info("b", TensorProto.UINT8, list(b_value.shape)))
    feeds = {"a": a, "b": b_value}
    worst, share = _agreement(tvmfuse.compile(model, target=HOST).run(feeds)[0], ort_run(model, feeds)[0],
                              "QLinearMatMul with b as an input")
    assert worst <= 1 and share >= 0.99


def test_opset10_per_channel_weights():
    # Opset 10-12 DequantizeLinear has no axis attribute; TVM's importer reads the one the rewrite sets.
    model, x = qlinear_conv(c=32, m=16, hw=10, per_channel=True, bias=True)
    model.opset_import[0].version = 10
    worst, share = _agreement(tvmfuse.compile(model, target=HOST).run({"x": x})[0], ort_run(model, {"x": x})[0],
                              "QLinearConv opset 10 per-channel vs onnxruntime")
    assert worst <= 1 and share >= 0.99


def test_scales_from_constant_nodes_are_folded_first():
    model, x = qlinear_conv(per_channel=False)
    scale = next(t for t in model.graph.initializer if t.name == "ys")
    model.graph.initializer.remove(scale)
    model.graph.node.insert(0, helper.make_node("Constant", [], ["ys"], value=scale))
    got = tvmfuse.compile(model, target=HOST).run({"x": x})[0]
    np.testing.assert_array_equal(got, ort_run(model, {"x": x})[0])


def test_onnxruntime_quantized_model_matches(tmp_path):
    """A conv net quantized by onnxruntime in its QOperator format: QLinearConv, QLinearMatMul, Q/DQ."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from helpers import make_model

    rng = np.random.default_rng(4)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("MatMul", ["f", "w3"], ["y"])]
    inits = [weight("w1", 16, 8, 3, 3), weight("b1", 16), weight("w2", 32, 16, 3, 3), weight("b2", 32),
             weight("w3", 32 * 8 * 8, 10)]
    onnx.save(make_model(nodes, [("x", [1, 8, 16, 16])], [("y", [1, 10])], inits, opset=13), tmp_path / "f.onnx")
    samples = [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(9)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples[:8])

        def get_next(self):
            return next(self.it, None)

    # reduce_range: 7-bit weights, which onnxruntime's AVX2 u8 x s8 kernels compute without saturating.
    quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", Reader(), quant_format=QuantFormat.QOperator,
                    per_channel=True, reduce_range=True, weight_type=QuantType.QInt8)
    quantized = onnx.load(tmp_path / "q.onnx")
    assert _ops(quantized)["QLinearConv"] == 2 and _ops(quantized)["QLinearMatMul"] == 1
    got = tvmfuse.compile(quantized, target=HOST).run(samples[8])[0]
    ref = ort_run(quantized, samples[8])[0]
    step = float(np.abs(ref).max()) / 127  # one quantization step of the output, roughly
    assert np.abs(got - ref).max() <= step


# --- errors ----------------------------------------------------------------------------------------


def test_runtime_scale_is_rejected_with_node_and_input():
    model, _ = qlinear_conv()
    xs = next(t for t in model.graph.initializer if t.name == "xs")
    model.graph.initializer.remove(xs)
    model.graph.input.append(helper.make_tensor_value_info("xs", TensorProto.FLOAT, []))
    with pytest.raises(UnsupportedOpError, match="QLinearConv node 'qc': x_scale 'xs' is computed at run time"):
        tvmfuse.compile(model, target=HOST)


def test_per_row_a_scale_is_rejected():
    model, _ = qlinear_matmul()
    scale = next(t for t in model.graph.initializer if t.name == "as")
    scale.CopyFrom(numpy_helper.from_array(np.full(2, 0.02, np.float32), "as"))
    with pytest.raises(UnsupportedOpError, match=r"QLinearMatMul node 'qmm': a_scale has shape \(2,\)"):
        rewrite_quantized_ops(model, "m.onnx")


def test_weight_scale_length_must_match_output_channels():
    model, _ = qlinear_conv(m=4)
    for name, dtype in (("ws", np.float32), ("wz", np.uint8)):
        t = next(t for t in model.graph.initializer if t.name == name)
        t.CopyFrom(numpy_helper.from_array(np.ones(3, dtype), name))
    with pytest.raises(UnsupportedOpError, match=r"m.onnx: QLinearConv node 'qc': w_scale has 3 values but w 'w' "
                                                 r"has shape \(4, 8, 3, 3\)"):
        rewrite_quantized_ops(model, "m.onnx")


def test_conv_integer_zero_point_shapes_are_checked():
    model = conv_integer(1, None)
    t = next(t for t in model.graph.initializer if t.name == "xz")
    t.CopyFrom(numpy_helper.from_array(np.ones(4, np.uint8), "xz"))
    with pytest.raises(UnsupportedOpError, match=r"ConvInteger node 'ci': x_zero_point has shape \(4,\)"):
        rewrite_quantized_ops(model)
    with pytest.raises(UnsupportedOpError, match=r"w_zero_point has 2 values but w 'w' has shape \(3, 4, 3, 3\)"):
        rewrite_quantized_ops(conv_integer(0, [1, 2]))
