"""A float weight's channel whose bias would not fit an int32 code gets a wider weight scale, and the conv stays
INT8 (passes/int8/kernels.py: ``_bias_fitted``). PP-OCRv4's recognizers have such channels: near-zero weights
(scales of 1e-10 to 1e-42) under a bias of about 1; their convs stayed FP32 ("folded bias overflows int32")."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse.passes.int8 import kernels
from tvmfuse.quant.params import bias_params, weight_params


def test_only_the_channels_that_overflow_are_widened():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.1
    w[1] *= 1e-12  # a dead channel
    bias = np.array([0.5, 1.5, -0.3, 2.0])
    params = weight_params(w, limit=127)
    s_x = 0.002
    fitted = kernels._bias_fitted(params, bias, s_x)
    old, new = np.asarray(params.scale), np.asarray(fitted.scale)
    assert new[1] > old[1] and np.array_equal(np.delete(new, 1), np.delete(old, 1))
    codes = bias_params(s_x, fitted).quantize(bias)
    assert np.abs(codes.astype(np.int64)).max() <= kernels.BIAS_CODE_LIMIT
    assert (np.abs(fitted.quantize(w)) <= 127).all()
    assert kernels._bias_fitted(fitted, bias, s_x) is fitted  # nothing left to widen


def _dead_channel_conv() -> tuple:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2
    w[5] = 1e-14  # a channel of near-zero weights under a real bias
    b = rng.standard_normal(16).astype(np.float32) * 0.1
    b[5] = 1.2
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "dead", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return model, [{"x": rng.random((1, 8, 10, 10)).astype(np.float32)} for _ in range(2)]


def test_a_conv_with_a_dead_channel_runs_int8_close_to_fp32():
    model, calib = _dead_channel_conv()
    q = tvmfuse.quantize(model, calib=calib, method="minmax")
    assert q.quantization["int8_partitions"] == 1 and not q.quantization["fp32_reasons"]
    fp = tvmfuse.compile(model)
    x = calib[0]
    ref, got = fp.run(x)[0], q.run(x)[0]
    np.testing.assert_allclose(got[0, 5], 1.2, atol=0.02)  # relu(bias): the dead channel's output
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
