"""``MatMulInteger`` and ``ConvInteger`` with a constant weight on tvmfuse's INT8 dense and conv2d kernels
(frontend/integer_matmul.py, integer_conv.py): the integer op's result bit for bit (so a dynamically quantized
MatMul or Conv equals onnxruntime's), uint8 and int8 weights, the row (window) and column terms of both zero
points, padding with the run-time zero point, the conv's int32 bias absorbed, every input rank; VNNI on an
AVX-512 target, int16 pairs on this CPU's AVX2 pass (a host_cpu module)."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse import frontend, targets
from tvmfuse.frontend import integer_conv, integer_kernels, integer_matmul
from tvmfuse.schedules.computes import int8, int8_ref

from helpers import HOST, ORT_U8S8_EXACT, ort_run

RNG = np.random.default_rng(7)


def _integer_model(x_shape, w: np.ndarray, x_zero: int | None, w_zero, op: str = "MatMulInteger",
                   bias: np.ndarray | None = None, **attrs):
    """``Cast(op(x, w, x_zero, w_zero) [+ bias])``: the integer op's own result, as float32."""
    names = ["x", "w", "xz" if x_zero is not None else "", "wz" if w_zero is not None else ""]
    while names[-1] == "":
        names.pop()
    inits = [numpy_helper.from_array(w, "w")]
    if x_zero is not None:
        inits.append(numpy_helper.from_array(np.array(x_zero, np.uint8), "xz"))
    if w_zero is not None:
        inits.append(numpy_helper.from_array(np.asarray(w_zero, w.dtype), "wz"))
    nodes, out = [helper.make_node(op, names, ["acc"], **attrs)], "acc"
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "b"))
        nodes.append(helper.make_node("Add", ["acc", "b"], ["biased"]))
        out = "biased"
    nodes.append(helper.make_node("Cast", [out], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)


CASES = {  # x shape, weight dtype, x zero point, weight zero point
    "uint8_weights": ((5, 70), np.uint8, 131, 119),        # codes - 119 span [-119, 136]: the row term
    "int8_weights": ((2, 3, 64), np.int8, 7, None),        # quantize_dynamic's default: no row term
    "int8_with_zero": ((4, 33), np.int8, None, -3),
    "vector": ((40,), np.uint8, 255, 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_integer_result_is_exact(case):
    shape, dtype, x_zero, w_zero = CASES[case]
    info = np.iinfo(dtype)
    w = RNG.integers(info.min, info.max + 1, (shape[-1], 37)).astype(dtype)
    w[0, :3] = info.min  # the extremes: -128 stays exact in vpdpbusd and the pair step
    w[1, :3] = info.max
    model = _integer_model(shape, w, x_zero, w_zero)
    x = RNG.integers(0, 256, shape).astype(np.uint8)
    x.reshape(-1)[:4] = (0, 255, 255, 0)
    cm = tvmfuse.compile(model, target=HOST)
    assert any(gv.name_hint.startswith("tvmfuse_integer_matmul") for gv, _ in cm.lowered.functions_items())
    want = (x.astype(np.int64) - (x_zero or 0)) @ (w.astype(np.int64) - (w_zero or 0))
    np.testing.assert_array_equal(cm.run({"x": x})[0], want.astype(np.float32))
    if ORT_U8S8_EXACT or dtype == np.uint8:  # else its pair sums of int8 weights saturate (helpers)
        np.testing.assert_array_equal(ort_run(model, {"x": x})[0], want.astype(np.float32))


@pytest.mark.parametrize("weight_type", ["QUInt8", "QInt8"])
def test_dynamically_quantized_matmul_equals_onnxruntime(tmp_path, weight_type):
    """quantize_dynamic's chain (DynamicQuantizeLinear, MatMulInteger, Cast, Mul by both scales): the same
    integers, the same float ops after them, so the same bits as onnxruntime."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    k, n = 96, 50
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(RNG.standard_normal((k, n)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=getattr(QuantType, weight_type),
                     reduce_range=weight_type == "QInt8" and not ORT_U8S8_EXACT)  # what it multiplies exactly
    x = {"x": RNG.standard_normal((3, 4, k)).astype(np.float32)}
    got = tvmfuse.compile(str(tmp_path / "q.onnx"), target=HOST).run(x)[0]
    np.testing.assert_array_equal(got, ort_run(onnx.load(tmp_path / "q.onnx"), x)[0])


def test_which_matmuls_are_taken():
    """A per-column weight zero point stays on the float path; a target without INT8 kernels (CUDA's packing is
    its own) keeps every MatMulInteger as it was."""
    w = RNG.integers(0, 256, (16, 16)).astype(np.uint8)
    per_column = _integer_model((2, 16), w, 3, np.arange(16, dtype=np.uint8))
    assert integer_kernels.rewrite_integer_kernels(per_column, "vnni")[1] == 0
    for packing, taken in (("vnni", 1), ("avxvnni", 1), ("pairs", 1), ("signed", 0), ("", 0)):
        model = _integer_model((2, 16), w, 3, 5)
        assert integer_kernels.rewrite_integer_kernels(model, packing)[1] == taken, packing
    prepared = frontend.prepare(_integer_model((2, 16), w, 3, 5), int8_weights="pairs")[0]
    node = next(n for n in prepared.graph.node if n.op_type == integer_matmul.OP_TYPE)
    packed = next(numpy_helper.to_array(t) for t in prepared.graph.initializer if t.name == node.input[2])
    # full-range codes without VNNI: int16 pairs, and the kernel is not marked for the vpmaddubsw step
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert packed.dtype == np.int16 and attrs["exact_pairs"] == 0
    assert "w" not in {t.name for t in prepared.graph.initializer}


def test_avx512_target_runs_the_matmul_on_vnni():
    # Compiled only (this CPU may lack AVX-512 VNNI): the dense kernel multiplies with vpdpbusd.
    w = RNG.integers(-128, 128, (64, 32)).astype(np.int8)
    cm = tvmfuse.compile(_integer_model((8, 64), w, 100, None), target="x86-avx512")
    assert "vpdpbusd" in cm.kernel_source("asm")


def test_int32_epilogue_is_the_accumulator_plus_bias():
    with pytest.raises(int8.Int8KernelError, match="int32 output"):
        int8.Epilogue(out_dtype="int32", zero_point=3)
    acc = np.array([[2 ** 30, -5]], np.int64)
    assert int8_ref.requantize(acc, None, int8.Epilogue(out_dtype="int32")).tolist() == [[2 ** 30, -5]]


def _conv_model(x_shape, w: np.ndarray, x_zero: int | None, w_zero, bias: np.ndarray | None = None, **attrs):
    """``Cast(ConvInteger(x, w, x_zero, w_zero) [+ bias])``."""
    return _integer_model(x_shape, w, x_zero, w_zero, "ConvInteger", bias, **attrs)


CONV_CASES = {  # weight dtype, x zero point, weight zero point, bias, conv attributes
    "uint8_weights": (np.uint8, 131, 119, False, {"pads": [1, 1, 1, 1]}),           # the window term
    "int8_strided_bias": (np.int8, 7, None, True, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "uint8_128_uneven_pads": (np.uint8, 0, 128, True, {"pads": [0, 1, 2, 1], "strides": [1, 2]}),
    "dilated": (np.uint8, 255, 3, False, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    "no_zero_points": (np.int8, None, None, False, {}),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_integer_conv_is_exact(case):
    dtype, x_zero, w_zero, with_bias, attrs = CONV_CASES[case]
    info = np.iinfo(dtype)
    w = RNG.integers(info.min, info.max + 1, (20, 6, 3, 3)).astype(dtype)
    w[0, 0, 0, :2] = (info.min, info.max)
    bias = RNG.integers(-5000, 5000, (1, 20, 1, 1)).astype(np.int32) if with_bias else None
    model = _conv_model((1, 6, 11, 13), w, x_zero, w_zero, bias, **attrs)
    x = RNG.integers(0, 256, (1, 6, 11, 13)).astype(np.uint8)
    cm = tvmfuse.compile(model, target=HOST)
    kernels = {gv.name_hint for gv, _ in cm.lowered.functions_items()}
    assert any(k.startswith("tvmfuse_integer_conv") for k in kernels)
    assert any(k.startswith("tvmfuse_window_sums") for k in kernels) == (dtype == np.uint8 and w_zero != 128)
    np.testing.assert_array_equal(cm.run({"x": x})[0], ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("shape,absorbed", [((1, 20, 1, 1), True), ((20, 1, 1), True), ((1,), True),
                                            ((13,), False), ((1, 20, 11, 13), False)])
def test_int32_bias_of_any_broadcast(shape, absorbed):
    """A per-channel or single int32 bias goes into the kernel's bias; one that broadcasts otherwise (along the
    width, or a whole map) stays an Add after it."""
    w = RNG.integers(-128, 128, (20, 6, 3, 3)).astype(np.int8)
    bias = RNG.integers(-5000, 5000, shape).astype(np.int32)
    model = _conv_model((1, 6, 11, 13), w, 7, None, bias, pads=[1, 1, 1, 1])
    prepared = frontend.prepare(model, int8_weights="vnni")[0]
    assert ("Add" not in [n.op_type for n in prepared.graph.node]) == absorbed
    x = {"x": RNG.integers(0, 256, (1, 6, 11, 13)).astype(np.uint8)}
    np.testing.assert_array_equal(tvmfuse.compile(model, target=HOST).run(x)[0], ort_run(model, x)[0])


def test_window_sums_against_numpy():
    shape, kernel, strides, pads, dilations = (2, 5, 9, 8), (3, 2), (2, 1), (1, 0, 2, 1), (1, 2)
    func, out_shape = integer_conv.window_sums(shape, kernel, strides, pads, dilations)
    lib = tvm.compile(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}),
                      target=targets.resolve(HOST).tvm_target())
    x = RNG.integers(0, 256, shape).astype(np.uint8)
    za = np.array([77], np.uint8)
    out = tvm.runtime.tensor(np.zeros(out_shape, np.int32))
    lib["k"](tvm.runtime.tensor(x), tvm.runtime.tensor(za), out)
    padded = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=77)
    want = np.zeros(out_shape, np.int64)
    for ky in range(kernel[0]):
        for kx in range(kernel[1]):
            window = padded[:, :, ky * dilations[0]:, kx * dilations[1]:][:, :, ::strides[0], ::strides[1]]
            want += window[:, :, :out_shape[1], :out_shape[2]].sum(axis=1)
    np.testing.assert_array_equal(out.numpy(), want)


def test_dynamically_quantized_conv_equals_onnxruntime(tmp_path):
    """quantize_dynamic on a Conv model (uint8 weights, the window term) and a grouped conv, which stays on the
    float path: the INT8 conv's result is onnxruntime's bit for bit."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1], group=4)]
    inits = [numpy_helper.from_array(RNG.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "b1"),
             numpy_helper.from_array(RNG.standard_normal((8, 2, 3, 3)).astype(np.float32), "w2")]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QUInt8,
                     op_types_to_quantize=["Conv"])
    x = {"x": RNG.standard_normal((1, 3, 12, 10)).astype(np.float32)}
    cm = tvmfuse.compile(str(tmp_path / "q.onnx"), target=HOST)
    names = [gv.name_hint for gv, _ in cm.lowered.functions_items()]
    assert sum(n.startswith("tvmfuse_integer_conv") for n in names) == 1, names
    np.testing.assert_allclose(cm.run(x)[0], ort_run(onnx.load(tmp_path / "q.onnx"), x)[0], rtol=1e-6, atol=1e-5)


def test_avx512_target_runs_the_conv_on_vnni():
    w = RNG.integers(0, 256, (32, 16, 3, 3)).astype(np.uint8)
    cm = tvmfuse.compile(_conv_model((1, 16, 8, 8), w, 9, 100, pads=[1, 1, 1, 1]), target="x86-avx512")
    assert "vpdpbusd" in cm.kernel_source("asm")


def test_bias_rounded_at_run_time_is_cast_plainly():
    """ddddocr's form: the int32 bias is ``Reshape(Cast(to=int32)(Floor(b / s)))`` with ``s`` known at run time.
    The kernel takes the floored floats and converts them itself; TVM's spelling of the ONNX Cast (its
    out-of-range cases in int64, 0.4 s of LLVM a layer) is not built."""
    w = RNG.integers(0, 256, (16, 4, 3, 3)).astype(np.uint8)
    model = _conv_model((1, 4, 9, 9), w, 100, 120, pads=[1, 1, 1, 1])
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1]))
    graph.initializer.extend([numpy_helper.from_array(RNG.uniform(-50, 50, 16).astype(np.float32), "b_real"),
                              numpy_helper.from_array(np.array([1, 16, 1, 1], np.int64), "b_shape")])
    bias = [helper.make_node("Div", ["b_real", "s"], ["b_div"]), helper.make_node("Floor", ["b_div"], ["b_floor"]),
            helper.make_node("Cast", ["b_floor"], ["b_int"], to=TensorProto.INT32),
            helper.make_node("Reshape", ["b_int", "b_shape"], ["b"]),
            helper.make_node("Add", ["acc", "b"], ["biased"])]
    cast = graph.node[1]
    cast.input[0] = "biased"
    nodes = [graph.node[0]] + bias + [cast]
    del graph.node[:]
    graph.node.extend(nodes)
    feeds = {"x": RNG.integers(0, 256, (1, 4, 9, 9)).astype(np.uint8), "s": np.array([0.03], np.float32)}
    cm = tvmfuse.compile(model, target=HOST)
    assert not any("isfinite" in gv.name_hint for gv, _ in cm.lowered.functions_items())
    np.testing.assert_array_equal(cm.run(feeds)[0], ort_run(model, feeds)[0])
