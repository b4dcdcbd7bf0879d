"""Dynamically quantized models (onnxruntime's ``quantize_dynamic``: DynamicQuantizeLinear feeding ConvInteger /
MatMulInteger with run-time scales and zero points) import, run and match onnxruntime.

DynamicQuantizeLinear is bit-exact (scale, zero point and codes). A ConvInteger / MatMulInteger read as float
runs as a float op on dequantized operands (tvmfuse.frontend.integer_ops): on a few layers the outputs
match to float32 rounding; on a deep network float32 rounding between two quantizations moves an
activation on a rounding tie by one code now and then, and the bounds below state how far that goes.

The models' outputs are checked against exact integer arithmetic (``helpers.exact_integer``), not against
onnxruntime: with full-range int8 weights onnxruntime's own results depend on the CPU (its kernels without
VNNI add products in saturating int16 pairs), so a bound on the distance from it held on Zen 4 and failed on
Zen 3 although tvmfuse computed the same exact sums on both.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse import frontend, zoo
from tvmfuse.frontend.integer_ops import rewrite_integer_ops

from helpers import HOST, ORT_U8S8_EXACT, make_model, ort_run
from helpers.exact_integer import exact, saturating

quantization = pytest.importorskip("onnxruntime.quantization")


def _dynamic(model: onnx.ModelProto, tmp_path, per_channel=False) -> onnx.ModelProto:
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(model, src)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8,
                                  per_channel=per_channel)
    return onnx.load(dst)


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _conv_mlp(seed=0) -> onnx.ModelProto:
    """Conv + Relu -> Conv (stride 2) -> GlobalAveragePool -> Flatten -> MatMul + Add: both integer ops."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype("float32"), n)
             for n, s in (("W0", (16, 3, 3, 3)), ("W1", (32, 16, 3, 3)), ("M", (32, 10)))]
    inits += [numpy_helper.from_array(rng.standard_normal(16).astype("float32"), "B0"),
              numpy_helper.from_array(rng.standard_normal(10).astype("float32"), "B2")]
    nodes = [helper.make_node("Conv", ["x", "W0", "B0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "W1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["c1"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "M"], ["m"]),
             helper.make_node("Add", ["m", "B2"], ["y"])]
    return make_model(nodes, [("x", [1, 3, 16, 16])], [("y", [1, 10])], inits, opset=13)


def _inputs(seed=0, shape=(1, 3, 16, 16)):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype("float32") * scale for scale in (0.5, 1.0, 4.0)]


def _run(compiled, name, x):
    return np.asarray(compiled.run({name: x})[0])


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamically_quantized_convs_and_matmul_match_onnxruntime(tmp_path, per_channel):
    model = _dynamic(_conv_mlp(), tmp_path, per_channel)
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= set(_ops(model))
    compiled = tvmfuse.compile(model, target=HOST)
    for x in _inputs():
        want = exact(model, {"x": x})[0]
        np.testing.assert_allclose(_run(compiled, "x", x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        if ORT_U8S8_EXACT:
            np.testing.assert_allclose(ort_run(model, {"x": x})[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_onnxruntime_without_vnni_saturates_where_tvmfuse_is_exact(tmp_path):
    """The Zen 3 failure reproduced: with the third input the saturating sums (onnxruntime on AVX2) move an
    output by 0.26 while tvmfuse matches the exact sums; on the first, 1.2356 (exact, and tvmfuse) against
    1.2121 (what onnxruntime printed on a Zen 3)."""
    model = _dynamic(_conv_mlp(), tmp_path, per_channel=True)
    compiled = tvmfuse.compile(model, target=HOST)
    x = _inputs()[2]
    want, clipped = exact(model, {"x": x})[0], saturating(model, {"x": x})[0]
    assert np.abs(clipped - want).max() > 0.1
    np.testing.assert_allclose(_run(compiled, "x", x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_integer_ops_become_float_ops_on_dequantized_operands(tmp_path):
    model = _dynamic(_conv_mlp(), tmp_path)
    proto, *_ = frontend.prepare(model)
    ops = _ops(proto)
    assert not {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} & set(ops)
    assert ops["Conv"] == 2 and ops["MatMul"] == 1 and ops["QuantizeLinear"] == 3
    # The x_scale * w_scale multiply of each result moved onto the operands: one Mul per dequantized input.
    assert ops["Mul"] == 3
    assert all(numpy_helper.to_array(t).dtype == np.float32 for t in proto.graph.initializer
               if t.name.endswith("_f32"))


def _dql_model(shape=(1, 8, 20, 20)) -> onnx.ModelProto:
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])]
    graph = helper.make_graph(nodes, "dql", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, shape),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("z", TensorProto.UINT8, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("case", ["normal", "shifted", "positive", "negative", "constant", "zeros", "ties"])
def test_dynamic_quantize_linear_is_bit_exact(case):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 8, 20, 20)).astype("float32") * 3
    x = {"normal": x, "shifted": x + 2.1, "positive": np.abs(x), "negative": -np.abs(x) - 0.5,
         "constant": np.full_like(x, 0.75), "zeros": np.zeros_like(x),
         # exact multiples of half a step: x / scale lands on .5, where rounding half to even matters
         "ties": (np.arange(x.size).reshape(x.shape) % 511 - 255).astype("float32") / 2}[case]
    model = _dql_model()
    compiled = tvmfuse.compile(model, target=HOST)
    got = [np.asarray(t) for t in compiled.run({"x": x})]
    want = ort_run(model, {"x": x})
    assert got[1] == want[1] and got[2] == want[2]  # scale (1 for an empty range) and zero point
    np.testing.assert_array_equal(got[0], want[0])


def _integer_conv_model(cast: bool) -> onnx.ModelProto:
    """ConvInteger on a run-time zero point, its int32 result the output (cast=False) or cast to float."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "w")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz"], ["acc"], name="ci", pads=[1] * 4)]
    out_type = TensorProto.INT32
    if cast:
        nodes.append(helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT))
        out_type = TensorProto.FLOAT
    out = "y" if cast else "acc"
    graph = helper.make_graph(nodes, "ci", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                              [helper.make_tensor_value_info(out, out_type, [1, 8, 9, 9])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("cast", [False, True])
def test_conv_integer_with_a_run_time_zero_point_is_exact(cast):
    # int32 output: the exact int32 conv (qlinear); cast to float: a float conv of integers whose sums stay
    # below 2**24 (K = 36), so exact as well.
    model = _integer_conv_model(cast)
    proto, *_ = frontend.prepare(model)
    assert ("Conv" in _ops(proto)) and ("Cast" in _ops(proto))
    compiled = tvmfuse.compile(model, target=HOST)
    for x in _inputs(shape=(1, 4, 9, 9)):
        np.testing.assert_array_equal(_run(compiled, "x", x), exact(model, {"x": x})[0])


def _int32_bias_model() -> onnx.ModelProto:
    """ConvInteger, then its bias quantized at run time and added in int32 before the cast, then the scale:
    how ddddocr's ``common_old.onnx`` (a dynamically quantized CRNN in a PyPI wheel) spells every conv."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "w"),
             numpy_helper.from_array(np.float32(0.02), "ws"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([1, 8, 1, 1], np.int64), "bshape")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Div", ["b", "s"], ["bd"]),
             helper.make_node("Floor", ["bd"], ["bf"]),
             helper.make_node("Cast", ["bf"], ["bi"], to=TensorProto.INT32),
             helper.make_node("Reshape", ["bi", "bshape"], ["br"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz"], ["acc"], name="ci", pads=[1] * 4),
             helper.make_node("Add", ["acc", "br"], ["accb"], name="bias"),
             helper.make_node("Cast", ["accb"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    graph = helper.make_graph(nodes, "ci", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 9])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_an_int32_bias_added_before_the_cast_runs_as_a_float_add_and_is_exact():
    # ConvInteger -> Add(int32 bias) -> Cast: a float conv and a float add of the bias's integer values (its
    # Floor, without the float -> int32 -> float round trip), exact for sums below 2**24 (K = 36).
    model = _int32_bias_model()
    rewritten, *_ = frontend.prepare(model)
    ops = _ops(rewritten)
    assert ops["ConvInteger"] == 0 and ops["Conv"] == 1
    readers = {name for n in rewritten.graph.node for name in n.input}
    assert "bi" not in readers and "br" not in readers  # the int32 bias is no longer read
    compiled = tvmfuse.compile(model, target=HOST)
    for x in _inputs(shape=(1, 4, 9, 9)):
        np.testing.assert_array_equal(_run(compiled, "x", x), exact(model, {"x": x})[0])


def test_integer_op_read_as_int32_is_left_to_the_exact_rewrite():
    model = _integer_conv_model(cast=False)
    _, replaced = rewrite_integer_ops(model)
    assert replaced == 0 and _ops(model)["ConvInteger"] == 1


def test_matmul_integer_with_a_per_row_zero_point_stays_integer():
    rng = np.random.default_rng(3)
    b = numpy_helper.from_array(rng.integers(-127, 128, (6, 5)).astype(np.int8), "b")
    az = numpy_helper.from_array(np.array([3, 7, 120, 0], np.uint8), "az")
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "az"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "mi", [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])], [b, az])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    assert rewrite_integer_ops(onnx.ModelProto.FromString(model.SerializeToString()))[1] == 0
    a = rng.integers(0, 256, (4, 6)).astype(np.uint8)
    compiled = tvmfuse.compile(model, target=HOST)
    # onnxruntime refuses a per-row zero point; the spec's integer arithmetic is the reference.
    want = ((a.astype(np.int64) - np.array([3, 7, 120, 0])[:, None]) @ numpy_helper.to_array(b)).astype(np.float32)
    np.testing.assert_array_equal(_run(compiled, "a", a), want)


def test_dynamically_quantized_mobilenet_v2_agrees_with_onnxruntime(tmp_path):
    # 52 quantized convs deep: rounding of the float ops between quantizations (BatchNormalization, the
    # scale multiply) moves 1-3 codes of ~400,000 per layer, and the moves add up. The reference is exact
    # integer arithmetic with numpy's float ops between. Measured (x86-host on a Zen 4, and the same as an AVX2
    # CPU with TVMFUSE_HOST_CPU=znver3): tvmfuse 0.9-1.1% relative L2 from it, onnxruntime with VNNI 0.9-1.1%,
    # quantization itself 3.3-3.7% from the float model. On a Zen 3 onnxruntime's saturating int16 pairs put
    # it 3.1% from tvmfuse, which is why onnxruntime is not the reference here.
    float_model = zoo.get("mobilenet_v2")
    model = _dynamic(float_model, tmp_path)
    assert _ops(model)["ConvInteger"] == 52
    compiled = tvmfuse.compile(model, target=HOST)
    rng = np.random.default_rng(0)
    norm = np.linalg.norm
    x = rng.standard_normal((1, 3, 224, 224)).astype("float32")
    want, got = exact(model, {"input": x})[0], _run(compiled, "input", x)
    unquantized = ort_run(float_model, {"input": x})[0]
    quantization_error = norm(want - unquantized)
    assert norm(got - want) <= min(0.02 * norm(want), 0.5 * quantization_error)
    assert norm(got - unquantized) <= 1.1 * quantization_error  # no less accurate than the exact integer model
    assert got.argmax() == want.argmax()


def _optimized_by_onnxruntime(model: onnx.ModelProto, tmp_path) -> onnx.ModelProto:
    import onnxruntime as ort

    src, dst = tmp_path / "dynamic_plain.onnx", tmp_path / "dynamic_optimized.onnx"
    onnx.save(model, src)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return onnx.load(dst)


def test_onnxruntimes_fused_dynamic_matmul_ops_match_exact_integers(tmp_path):
    # onnxruntime's optimizer fuses quantize_dynamic's MatMul chain into com.microsoft.DynamicQuantizeMatMul /
    # MatMulIntegerToFloat; tvmfuse spells them back (frontend/qlinear_contrib.py) and runs the float form.
    dynamic = _dynamic(_conv_mlp(), tmp_path)
    optimized = _optimized_by_onnxruntime(dynamic, tmp_path)
    fused = {n.op_type for n in optimized.graph.node if n.domain == "com.microsoft"}
    assert fused & {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"}, fused
    compiled = tvmfuse.compile(optimized, target=HOST)
    for x in _inputs():
        want = exact(dynamic, {"x": x})[0]
        np.testing.assert_allclose(_run(compiled, "x", x), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
