"""``MatMulInteger`` with a constant weight on tvmfuse's INT8 dense kernel (frontend/integer_matmul.py): the integer
op's result bit for bit (so the whole dynamically quantized MatMul equals onnxruntime's), uint8 and int8 weights,
the row and column terms of both zero points, every input rank; VNNI on an AVX-512 target, int16 pairs on this
CPU's AVX2 pass (a host_cpu module)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse import frontend
from tvmfuse.frontend import integer_matmul
from tvmfuse.schedules.computes import int8, int8_ref

from helpers import HOST, ort_run

RNG = np.random.default_rng(7)


def _integer_model(x_shape, w: np.ndarray, x_zero: int | None, w_zero):
    """``Cast(MatMulInteger(x, w, x_zero, w_zero))``: the integer op's own result, as float32."""
    names = ["x", "w", "xz" if x_zero is not None else "", "wz" if w_zero is not None else ""]
    while names[-1] == "":
        names.pop()
    inits = [numpy_helper.from_array(w, "w")]
    if x_zero is not None:
        inits.append(numpy_helper.from_array(np.array(x_zero, np.uint8), "xz"))
    if w_zero is not None:
        inits.append(numpy_helper.from_array(np.asarray(w_zero, w.dtype), "wz"))
    nodes = [helper.make_node("MatMulInteger", names, ["acc"]),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "mmi", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x_shape))],
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
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=getattr(QuantType, weight_type))
    x = {"x": RNG.standard_normal((3, 4, k)).astype(np.float32)}
    got = tvmfuse.compile(str(tmp_path / "q.onnx"), target=HOST).run(x)[0]
    np.testing.assert_array_equal(got, ort_run(onnx.load(tmp_path / "q.onnx"), x)[0])


def test_which_matmuls_are_taken():
    """A per-column weight zero point stays on the float path; a target without INT8 kernels (CUDA's packing is
    its own) keeps every MatMulInteger as it was."""
    w = RNG.integers(0, 256, (16, 16)).astype(np.uint8)
    per_column = _integer_model((2, 16), w, 3, np.arange(16, dtype=np.uint8))
    assert integer_matmul.rewrite_integer_matmuls(per_column, "vnni")[1] == 0
    for packing, taken in (("vnni", 1), ("avxvnni", 1), ("pairs", 1), ("signed", 0), ("", 0)):
        model = _integer_model((2, 16), w, 3, 5)
        assert integer_matmul.rewrite_integer_matmuls(model, packing)[1] == taken, packing
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
