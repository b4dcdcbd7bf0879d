"""Tiny ONNX graphs built in code for tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    """A ModelProto with the given nodes; ``inputs``/``outputs`` are (name, shape) pairs (float32)."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def conv_relu(batch="N", seed: int = 0) -> onnx.ModelProto:
    """x[batch,3,16,16] -> Conv(8, 3x3, pad 1, bias) -> Relu."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype("float32"), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype("float32"), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["c"], ["y"], name="relu0")]
    return make_model(nodes, [("x", [batch, 3, 16, 16])], [("y", None)], [w, b])


def recognizer_head(shape, n: int, rng, bias: bool = True, logits_out: bool = False) -> onnx.ModelProto:
    """A recognizer's CTC head as exporters write it: x[shape] @ W[k, n] (+ B) -> Softmax(-1) (``k`` is
    ``shape[-1]``; W then B drawn from ``rng``); ``logits_out`` also outputs the logits."""
    k = shape[-1]
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32"), "W")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"])]
    logits = "mm"
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype("float32"), "B"))
        nodes.append(helper.make_node("Add", ["mm", "B"], ["logits"]))
        logits = "logits"
    nodes.append(helper.make_node("Softmax", [logits], ["y"], axis=-1))
    outputs = [("y", None)] + ([(logits, None)] if logits_out else [])
    return make_model(nodes, [("x", list(shape))], outputs, inits)


# Tests that run compiled code use the host's own target: CI machines may lack AVX-512.
HOST = "x86-host"


def _ort_u8s8_exact() -> bool:
    from tvmfuse import targets

    return bool({"avx512_vnni", "avx_vnni"} & targets._cpuinfo_flags())


# Whether onnxruntime's uint8 x int8 products (MatMulInteger, QLinearConv, QGemm, ...) are exact on this CPU.
# Without VNNI its kernels add the products in pairs with vpmaddubsw, which saturates at 16 bits once the
# weights use the 8-bit range (its quantization guide's reduce_range: 7-bit weights for such CPUs); its
# answers then differ from the integer result, where tvmfuse's do not. Read from /proc/cpuinfo, not from
# TVMFUSE_HOST_CPU: onnxruntime reads CPUID. (helpers.exact_integer.saturating computes its answers there.)
ORT_U8S8_EXACT = _ort_u8s8_exact()


def ort_run(model, inputs: dict) -> list[np.ndarray]:
    """Reference outputs from onnxruntime's CPU provider."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)
