"""Seeded random models around Winograd convs: ``random_winograd(seed)``, a small float32 ONNX model.

``graphs.random_cnn`` starts from 3-8 channels and reaches at most 16, so few of its convs are ones the Winograd
kernels take (3x3, stride 1, padding 1, at least ``schedules.computes.winograd.MIN_CHANNELS`` input and output
channels filling their channel blocks). These graphs are built of them: a batch of 1 or 2 with 3-8 channels and 1-24
rows and columns (one-row maps, odd edges that cut the last tile, F(2x2) and F(4x4)), a 1x1 conv to 16-72 channels,
then 1-3 3x3 convs of 16-128 output channels (often as many as their input, with channel counts that are and are
not multiples of 16), each with an optional bias, batch norm, residual add in either operand order and one of the
activations the kernels fuse (or none). The same seed gives the same bytes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graphs import OPSET

WIDTHS = (16, 16, 20, 24, 32, 40, 48, 64, 72)  # the 1x1 conv's output channels
OUT_WIDTHS = (16, 24, 32, 48, 56, 64, 96, 128)
ACTIVATIONS = ("Relu", "Sigmoid", "HardSwish", "LeakyRelu", None)


def random_winograd(seed: int) -> onnx.ModelProto:
    """The model of ``seed`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name: str, array) -> str:
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def conv(x: str, cin: int, cout: int, k: int, tag: str, bias: bool) -> str:
        weight = rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)
        inputs = [x, const(f"w{tag}", weight)] + ([const(f"b{tag}", rng.standard_normal(cout) * 0.1)] if bias else [])
        nodes.append(helper.make_node("Conv", inputs, [f"conv{tag}"], kernel_shape=[k, k], pads=[k // 2] * 4))
        return f"conv{tag}"

    batch, height, width = int(rng.choice([1, 1, 1, 2])), int(rng.integers(1, 25)), int(rng.integers(1, 25))
    in_channels, channels = int(rng.integers(3, 9)), int(rng.choice(WIDTHS))
    x = conv("x", in_channels, channels, 1, "0", True)
    for i in range(1, int(rng.integers(2, 5))):
        out = channels if rng.random() < 0.5 else int(rng.choice(OUT_WIDTHS))
        y = conv(x, channels, out, 3, str(i), bool(rng.random() < 0.7))
        if rng.random() < 0.3:
            stats = [const(f"{name}{i}", value) for name, value in (
                ("scale", rng.random(out) + 0.5), ("shift", rng.standard_normal(out) * 0.1),
                ("mean", rng.standard_normal(out) * 0.1), ("var", rng.random(out) + 0.5))]
            nodes.append(helper.make_node("BatchNormalization", [y, *stats], [f"bn{i}"]))
            y = f"bn{i}"
        if out == channels and rng.random() < 0.4:
            nodes.append(helper.make_node("Add", [y, x] if rng.random() < 0.5 else [x, y], [f"add{i}"]))
            y = f"add{i}"
        activation = ACTIVATIONS[int(rng.integers(len(ACTIVATIONS)))]
        if activation is not None:
            nodes.append(helper.make_node(activation, [y], [f"act{i}"]))
            y = f"act{i}"
        x, channels = y, out
    graph = helper.make_graph(
        nodes, f"winograd_{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, in_channels, height, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, channels, height, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
