"""1-D convs (audio front ends, temporal conv stacks) become 2-D convs of height 1 (``frontend/conv1d.py``), so
they take tvmfuse's conv2d kernels instead of TVM's unscheduled conv1d: strides, dilations, padding, groups
and both opset forms of Unsqueeze/Squeeze, checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from helpers import make_model, ort_run
from tvmfuse import frontend

# (in channels, out channels, length, window, stride, dilation, pads, groups)
CASES = [(1, 258, 640, 256, 128, 1, (0, 0), 1), (129, 128, 4, 3, 1, 1, (1, 1), 1), (16, 32, 101, 5, 2, 2, (3, 1), 1),
         (32, 32, 50, 3, 1, 1, (1, 1), 32), (24, 48, 33, 3, 1, 1, (2, 0), 4)]


def conv1d_model(cin, cout, length, window, stride, dilation, pads, groups, opset=17):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // groups, window)) / np.sqrt(cin // groups * window)).astype("float32")
    b = rng.standard_normal(cout).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], strides=[stride], dilations=[dilation], pads=list(pads),
                              group=groups, kernel_shape=[window]),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", [1, cin, length])], [("y", None)],
                      [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")], opset=opset)


@pytest.mark.parametrize("case", CASES, ids=["-".join(str(v) for v in c) for c in CASES])
def test_a_1d_conv_runs_on_the_conv2d_kernels_and_matches_onnxruntime(case):
    model = conv1d_model(*case)
    cm = tvmfuse.compile(model, target="x86-host")
    partitions = {k: v for k, v in cm.manifest()["scheduled_by"].items() if k.startswith("tvmfuse_")}
    assert partitions and all(v == "tvmfuse.x86" for v in partitions.values()), cm.manifest()["scheduled_by"]
    x = {"x": np.random.default_rng(1).standard_normal((1, case[0], case[2])).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset", [11, 17])
def test_both_unsqueeze_forms(opset):
    proto, *_ = frontend.prepare(conv1d_model(4, 8, 16, 3, 1, 1, (1, 1), 1, opset=opset))
    ops = [n.op_type for n in proto.graph.node]
    assert ops == ["Unsqueeze", "Conv", "Squeeze", "Relu"], ops
    conv = proto.graph.node[1]
    attrs = {a.name: list(a.ints) for a in conv.attribute if a.ints}
    assert attrs["kernel_shape"] == [1, 3] and attrs["pads"] == [0, 1, 0, 1]
