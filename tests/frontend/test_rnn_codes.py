"""An LSTM whose recurrent weight is ``DequantizeLinear`` of integer codes: folded for the rewrite, the codes kept
for the whole-sequence kernel where each gate column has one scale, the float weight otherwise."""

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import frontend
from tvmfuse.frontend import rnn_codes

from helpers import ort_run
from test_rnn import feeds, recurrent_model


def _quantized_r(model, codes_dtype, per_row: bool, zero: int):
    """Replace the model's ``R`` initializer by ``DequantizeLinear(codes, scale, zero)`` of the same shape."""
    graph = model.graph
    r = next(numpy_helper.to_array(t) for t in graph.initializer if t.name == "R")
    dirs, rows, hidden = r.shape
    info = np.iinfo(codes_dtype)
    half = max(info.max - zero, zero - info.min)  # the codes reach the far end of the range
    if per_row:  # a scale per gate row: the codes as [D * 4H, H] rows, dequantized on axis 0, reshaped
        scale = (np.abs(r).max(axis=2).reshape(-1) / half).astype("float32")
        codes = np.clip(np.round(r.reshape(-1, hidden) / scale[:, None]) + zero, info.min, info.max)
        nodes = [helper.make_node("DequantizeLinear", ["R_codes", "R_scale", "R_zero"], ["R_rows"], axis=0),
                 helper.make_node("Reshape", ["R_rows", "R_shape"], ["R"])]
        zeros = np.full(scale.shape, zero, codes_dtype)
        extra = [numpy_helper.from_array(np.array(r.shape, np.int64), "R_shape")]
    else:
        scale = np.float32(np.abs(r).max() / half)
        codes = np.clip(np.round(r / scale) + zero, info.min, info.max)
        nodes = [helper.make_node("DequantizeLinear", ["R_codes", "R_scale", "R_zero"], ["R"])]
        zeros, extra = np.array(zero, codes_dtype), []
    kept = [t for t in graph.initializer if t.name != "R"]
    del graph.initializer[:]
    graph.initializer.extend(kept + extra + [numpy_helper.from_array(codes.astype(codes_dtype), "R_codes"),
                                             numpy_helper.from_array(np.asarray(scale), "R_scale"),
                                             numpy_helper.from_array(zeros, "R_zero")])
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    return model


def _kernel_weight(model):
    prepared = frontend.prepare(model, fused_recurrence=True)[0]
    node = next(n for n in prepared.graph.node if n.op_type == "Recurrence")
    consts = {t.name: numpy_helper.to_array(t) for t in prepared.graph.initializer}
    assert not any(n.op_type == "DequantizeLinear" for n in prepared.graph.node)
    return consts[node.input[1]], len(node.input)


@pytest.mark.parametrize("codes_dtype,per_row,zero,stored", [
    (np.int8, False, 0, np.int8),       # quantize_dynamic's int8 weights
    (np.uint8, True, 119, np.int16),    # uint8 codes around a zero point: codes - 119 needs 16 bits
    (np.uint8, False, 128, np.int8),
])
def test_lstm_reads_codes_and_matches_onnxruntime(codes_dtype, per_row, zero, stored):
    model = _quantized_r(recurrent_model(direction="bidirectional", hidden=8, initial_h=True, initial_c=True),
                         codes_dtype, per_row, zero)
    weight, inputs = _kernel_weight(model)
    assert weight.dtype == stored and inputs == 5
    x = feeds(model)
    got = tvmfuse.compile(model, target="x86-host").run(x)
    for g, want in zip(got, ort_run(model, x)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


def test_scale_along_a_gates_inputs_keeps_the_float_weight():
    """A scale per input column of ``R`` (axis 2) cannot scale a gate column's sum once: float weight."""
    codes = np.arange(2 * 8 * 2, dtype=np.int8).reshape(2, 8, 2)
    scale = np.broadcast_to(np.array([0.5, 0.25], np.float32), codes.shape)
    found = rnn_codes.Codes(codes, np.zeros_like(codes), scale)
    assert found.gate_columns() is None
    per_column = rnn_codes.Codes(codes, np.zeros_like(codes), np.full(codes.shape, 0.5, np.float32))
    rt, column_scale = per_column.gate_columns()
    assert rt.shape == (2, 2, 8) and rt.dtype == np.int8 and np.all(column_scale == 0.5)
    model = _quantized_r(recurrent_model(hidden=8), np.int8, False, 0)
    model.graph.node[0].attribute.extend([helper.make_attribute("axis", 2)])
    scales = next(t for t in model.graph.initializer if t.name == "R_scale")
    scales.CopyFrom(numpy_helper.from_array(np.linspace(0.01, 0.02, 8).astype(np.float32), "R_scale"))
    zeros = next(t for t in model.graph.initializer if t.name == "R_zero")
    zeros.CopyFrom(numpy_helper.from_array(np.zeros(8, np.int8), "R_zero"))
    weight, inputs = _kernel_weight(model)
    assert weight.dtype == np.float32 and inputs < 5
    x = feeds(model)
    np.testing.assert_allclose(tvmfuse.compile(model, target="x86-host").run(x)[0], ort_run(model, x)[0],
                               rtol=1e-5, atol=1e-5)
