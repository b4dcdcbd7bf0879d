"""NCHW convs (channel counts without a block) whose rows have no good divisor compute whole vectors, then
crop (``anchors.whole_vector_rows``): when it applies, and that the numbers match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse.schedules.computes import anchors
from tvmfuse.schedules.common import row_vector

from tvmfuse import targets

from helpers import HOST, make_model, ort_run

LANES = 16  # the rule's arithmetic, written out for AVX-512's 16 lanes
HOST_LANES = targets.resolve(HOST).vector_bits() // 32  # what the compiled models below use


@pytest.mark.parametrize("width, short, wide", [
    (321, 3, 336),   # 3 x 107: 3-pixel vectors -> 21 whole ones
    (53, 1, 64),     # prime: 1-pixel vectors -> 4 whole ones, 21% more pixels
    (7, 7, None),    # 16 pixels for 7 would more than double the work
    (13, 13, None),  # 13-pixel vectors are not short
    (320, 16, None),  # already whole vectors
    (97, 1, 112),    # prime: 15 more pixels, within a quarter
])
def test_which_rows_are_computed_in_whole_vectors(width, short, wide):
    assert row_vector(width, LANES) == short
    assert anchors.whole_vector_rows(width, LANES) == wide


def _conv_model(c_in, c_out, hw, k, stride, pads):
    rng = np.random.default_rng(c_in + c_out + hw)
    w = numpy_helper.from_array((rng.standard_normal((c_out, c_in, k, k)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(c_out).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[stride, stride],
                              pads=pads),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", [1, c_in, hw, hw])], [("y", None)], [w, b])


@pytest.mark.parametrize("c_in, c_out, hw, k, stride, pads", [
    (24, 12, 322, 2, 1, [0, 0, 0, 0]),    # PP-OCRv6 det's head shape on a 321-wide row
    (8, 12, 53, 3, 1, [1, 1, 1, 1]),      # a prime 53-wide row, padded
    (8, 20, 105, 3, 2, [1, 1, 1, 1]),     # stride 2 onto a 53-wide row
])
def test_whole_vector_rows_match_onnxruntime(c_in, c_out, hw, k, stride, pads, monkeypatch):
    seen = []
    real = anchors._conv2d_packed

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(args[-1] if len(args) > 6 else kwargs.get("wide"))
        return out

    monkeypatch.setattr(anchors, "_conv2d_packed", spy)
    model = _conv_model(c_in, c_out, hw, k, stride, pads)
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    x = {"x": np.random.default_rng(7).standard_normal((1, c_in, hw, hw)).astype(np.float32)}
    got = cm.run(x)[0]
    np.testing.assert_allclose(got, ort_run(model, x)[0], rtol=1e-4, atol=1e-4)
    out_w = (hw + pads[1] + pads[3] - k) // stride + 1
    expected = anchors.whole_vector_rows(out_w, HOST_LANES)
    assert expected is not None and seen == [expected]  # these shapes take the whole-vector path
