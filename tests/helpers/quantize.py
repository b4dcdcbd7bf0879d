"""Tiny hand-built ONNX models for the quantization tests (test_quantize_graph.py, test_quantize_blocked.py,
test_quantize_api.py)."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from helpers import make_model


def random_batches(shape, count, seed, name="x"):
    """``count`` seeded standard-normal batches of input ``name``: calibration data, or inputs to compare on."""
    rng = np.random.default_rng(seed)
    return [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def conv(rng, x, out, c_in, c_out, name, pads=1, stride=1, group=1):
    """A 3x3 Conv node with seeded random weight and bias: ``(node, initializers)``."""
    w = numpy_helper.from_array((rng.standard_normal((c_out, c_in // group, 3, 3)) * 0.2).astype(np.float32),
                                f"{name}.w")
    b = numpy_helper.from_array((rng.standard_normal(c_out) * 0.1).astype(np.float32), f"{name}.b")
    node = helper.make_node("Conv", [x, w.name, b.name], [out], pads=[pads] * 4, strides=[stride] * 2, group=group,
                            name=name)
    return node, [w, b]


def model(layers, inputs, outputs):
    """A float32 model from ``(node, initializers)`` pairs; inputs/outputs as for ``helpers.make_model``."""
    nodes, inits = [], []
    for node, params in layers:
        nodes.append(node)
        inits += params
    return make_model(nodes, inputs, outputs, inits)


def conv_relu_conv():
    """x (1, 3, 8, 8) -> conv+relu (16) -> conv (8): two partitions."""
    rng = np.random.default_rng(0)
    return model([conv(rng, "x", "c1", 3, 16, "conv1"), (helper.make_node("Relu", ["c1"], ["h"]), []),
                   conv(rng, "h", "y", 16, 8, "conv2")], [("x", [1, 3, 8, 8])], [("y", [1, 8, 8, 8])])


def sandwich(activation: str = "Relu", group: int = 1):
    """conv+relu -> conv+``activation`` -> conv; ``group`` 2 gives the middle conv no INT8 kernel."""
    rng = np.random.default_rng(1)
    return model([conv(rng, "x", "c1", 3, 8, "conv1"), (helper.make_node("Relu", ["c1"], ["h1"]), []),
                   conv(rng, "h1", "c2", 8, 8, "conv2", group=group),
                   (helper.make_node(activation, ["c2"], ["h2"]), []),
                   conv(rng, "h2", "y", 8, 4, "conv3")], [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])])


def spelt_hardswish(spelling: str, shift: float = 3.0):
    """conv+relu -> conv + hardswish written out -> conv. ``spelling``: ``"paddle"`` is ``(x * clip(x + 3, 0,
    6)) / 6``, ``"torch"`` is ``x * (clip(x + 3, 0, 6) / 6)``; ``shift`` other than 3 is some other function
    of the same shape (the INT8 epilogue takes its constants as they are)."""
    rng = np.random.default_rng(6)
    consts = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("shift", shift), ("lo", 0.0), ("hi", 6.0), ("six", 6.0))]
    gate = [helper.make_node("Add", ["c2", "shift"], ["t"]), helper.make_node("Clip", ["t", "lo", "hi"], ["g"])]
    if spelling == "paddle":
        gate += [helper.make_node("Mul", ["c2", "g"], ["p"]), helper.make_node("Div", ["p", "six"], ["h2"])]
    else:
        gate += [helper.make_node("Div", ["g", "six"], ["q"]), helper.make_node("Mul", ["c2", "q"], ["h2"])]
    return model([conv(rng, "x", "c1", 3, 8, "conv1"), (helper.make_node("Relu", ["c1"], ["h1"]), []),
                  conv(rng, "h1", "c2", 8, 8, "conv2")] + [(n, []) for n in gate[:-1]] + [(gate[-1], consts),
                  conv(rng, "h2", "y", 8, 4, "conv3")], [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])])


def two_outputs():
    """conv+relu read by a conv and returned as a model output (mixed consumers)."""
    rng = np.random.default_rng(2)
    return model([conv(rng, "x", "c1", 3, 8, "conv1"), (helper.make_node("Relu", ["c1"], ["h"]), []),
                   conv(rng, "h", "y", 8, 4, "conv2")], [("x", [1, 3, 8, 8])],
                  [("h", [1, 8, 8, 8]), ("y", [1, 4, 8, 8])])


def residual_block(from_input: bool):
    """conv+relu -> conv + residual -> relu; the residual is the first conv's output or the model input."""
    rng = np.random.default_rng(3)
    layers = [conv(rng, "x", "c1", 8, 8, "conv1"), (helper.make_node("Relu", ["c1"], ["h"]), []),
              conv(rng, "h", "c2", 8, 8, "conv2"),
              (helper.make_node("Add", ["c2", "x" if from_input else "h"], ["s"]), []),
              (helper.make_node("Relu", ["s"], ["y"]), [])]
    return model(layers, [("x", [1, 8, 6, 6])], [("y", [1, 8, 6, 6])])


def grouped_conv_sigmoid():
    """grouped conv + sigmoid: one partition, a conv the INT8 kernels do not have."""
    rng = np.random.default_rng(4)
    return model([conv(rng, "x", "c", 4, 4, "conv", group=2), (helper.make_node("Sigmoid", ["c"], ["y"]), [])],
                 [("x", [1, 4, 6, 6])], [("y", [1, 4, 6, 6])])


def conv_silu_conv(silu_output: bool = False):
    """conv + SiLU (``x * sigmoid(x)``, as YOLO exports it) -> conv: the SiLU has no INT8 epilogue.
    ``silu_output``: the SiLU's result is also a model output (an FP32 reader beside the INT8 conv)."""
    rng = np.random.default_rng(5)
    outputs = [("y", [1, 8, 8, 8])] + ([("h", [1, 16, 8, 8])] if silu_output else [])
    return model([conv(rng, "x", "c1", 3, 16, "conv1"), (helper.make_node("Sigmoid", ["c1"], ["s"]), []),
                  (helper.make_node("Mul", ["c1", "s"], ["h"]), []), conv(rng, "h", "y", 16, 8, "conv2")],
                 [("x", [1, 3, 8, 8])], outputs)


def depthwise_s2(channels=96, size=16):
    """conv+relu (8 -> channels) -> depthwise 3x3 stride 2 + relu -> conv (16): MobileNetV2's stride-2 step.

    At 96 channels LLVM turns part of the INT8 depthwise kernel into ``vpdpwssd`` (an AVX-VNNI instruction
    when the target allows it).
    """
    rng = np.random.default_rng(0)
    return model([conv(rng, "x", "c1", 8, channels, "conv1"), (helper.make_node("Relu", ["c1"], ["h"]), []),
                  conv(rng, "h", "c2", channels, channels, "dw", stride=2, group=channels),
                  (helper.make_node("Relu", ["c2"], ["h2"]), []), conv(rng, "h2", "y", channels, 16, "conv2")],
                 [("x", [1, 8, size, size])], [("y", [1, 16, size // 2, size // 2])])


def conv_pool_conv(pads=1, pool_is_output=False, channels=16, stride=2):
    """conv+relu (3 -> ``channels``) -> MaxPool 3x3 stride 2 (ResNet's stem pool) -> conv (8); or no last conv
    and the pool's result is the model output. 24 channels: ShuffleNetV2's stem, one and a half NCHW16c blocks."""
    rng = np.random.default_rng(4)
    pool = helper.make_node("MaxPool", ["h"], ["p"], kernel_shape=[3, 3], strides=[stride] * 2, pads=[pads] * 4)
    size = (16 + 2 * pads - 3) // stride + 1
    layers = [conv(rng, "x", "c1", 3, channels, "conv1"), (helper.make_node("Relu", ["c1"], ["h"]), []), (pool, [])]
    if pool_is_output:
        return model(layers, [("x", [1, 3, 16, 16])], [("p", [1, channels, size, size])])
    return model(layers + [conv(rng, "p", "y", channels, 8, "conv2")], [("x", [1, 3, 16, 16])],
                 [("y", [1, 8, size, size])])


def inverted_residual(channels=24, size=10):
    """MobileNetV2's block on 24 channels (one and a half NCHW16c blocks): conv+relu6 -> depthwise stride 1 +
    relu6 -> conv + residual add -> conv. Every INT8 kernel reads and writes the padded NCHW16c layout."""
    rng = np.random.default_rng(6)
    relu6 = [numpy_helper.from_array(np.float32(v), n) for v, n in ((0.0, "lo"), (6.0, "hi"))]
    layers = [conv(rng, "x", "c1", 8, channels, "expand"),
              (helper.make_node("Clip", ["c1", "lo", "hi"], ["h1"]), relu6),
              conv(rng, "h1", "c2", channels, channels, "dw", group=channels),
              (helper.make_node("Clip", ["c2", "lo", "hi"], ["h2"]), []),
              conv(rng, "h2", "c3", channels, channels, "project"), (helper.make_node("Add", ["c3", "h1"], ["s"]), []),
              conv(rng, "s", "y", channels, 8, "head")]
    return model(layers, [("x", [1, 8, size, size])], [("y", [1, 8, size, size])])


def squeeze_excite(channels=24, size=8, gate_output=False):
    """MobileNetV3's squeeze-and-excitation: conv+relu (8 -> channels) -> depthwise + relu -> ReduceMean over
    H, W -> conv+relu (channels / 4) -> conv + HardSigmoid (the gate) -> Mul(x, gate) -> conv (8). With
    ``gate_output`` the gate is a model output too (an FP32 reader of the product's other operand's
    producer is not: the product is read only by the last conv)."""
    rng = np.random.default_rng(9)

    def pointwise(x, out, c_in, c_out, name):
        w = numpy_helper.from_array((rng.standard_normal((c_out, c_in, 1, 1)) * 0.3).astype(np.float32), f"{name}.w")
        b = numpy_helper.from_array((rng.standard_normal(c_out) * 0.1).astype(np.float32), f"{name}.b")
        return helper.make_node("Conv", [x, w.name, b.name], [out], name=name), [w, b]

    squeeze = max(channels // 4, 4)
    layers = [conv(rng, "x", "c1", 8, channels, "expand"), (helper.make_node("Relu", ["c1"], ["h1"]), []),
              conv(rng, "h1", "c2", channels, channels, "dw", group=channels),
              (helper.make_node("Relu", ["c2"], ["h2"]), []),
              (helper.make_node("ReduceMean", ["h2"], ["m"], axes=[2, 3], keepdims=1), []),
              pointwise("m", "f1", channels, squeeze, "fc1"), (helper.make_node("Relu", ["f1"], ["r1"]), []),
              pointwise("r1", "f2", squeeze, channels, "fc2"),
              (helper.make_node("HardSigmoid", ["f2"], ["g"], alpha=1 / 6, beta=0.5), []),
              (helper.make_node("Mul", ["h2", "g"], ["s"]), []), pointwise("s", "y", channels, 8, "project")]
    outputs = [("y", [1, 8, size, size])] + ([("g", [1, channels, 1, 1])] if gate_output else [])
    return model(layers, [("x", [1, 8, size, size])], outputs)


def stem_concat(channels=16, size=12):
    """PP-HGNet's stem block: conv+relu (3 -> ``channels``), then a conv branch (conv+relu to ``channels`` / 2,
    conv+relu back to ``channels``) and a MaxPool 2x2 stride 1 (padded right and bottom) of the first conv,
    concatenated along the channels -> conv (8). 16 channels: whole NCHW16c blocks; 12: not."""
    rng = np.random.default_rng(11)
    half = max(channels // 2, 4)
    pool = helper.make_node("MaxPool", ["h"], ["p"], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1])
    layers = [conv(rng, "x", "c1", 3, channels, "stem"), (helper.make_node("Relu", ["c1"], ["h"]), []),
              conv(rng, "h", "c2", channels, half, "branch1"), (helper.make_node("Relu", ["c2"], ["h2"]), []),
              conv(rng, "h2", "c3", half, channels, "branch2"), (helper.make_node("Relu", ["c3"], ["h3"]), []),
              (pool, []), (helper.make_node("Concat", ["p", "h3"], ["cat"], axis=1), []),
              conv(rng, "cat", "y", 2 * channels, 8, "fuse")]
    return model(layers, [("x", [1, 3, size, size])], [("y", [1, 8, size, size])])


def depthwise_5x5(channels=24, size=(3, 20)):
    """conv+relu (8 -> ``channels``) -> depthwise 5x5 (padding 2) + relu -> conv (8), on a map of 3 rows: the
    PP-OCR classifiers' rows, where 2 of a kernel's 5 rows read padding for most output rows."""
    rng = np.random.default_rng(12)
    w = numpy_helper.from_array((rng.standard_normal((channels, 1, 5, 5)) * 0.3).astype(np.float32), "dw.w")
    dw = helper.make_node("Conv", ["h", "dw.w"], ["c2"], group=channels, pads=[2] * 4, kernel_shape=[5, 5])
    h, w_ = size
    return model([conv(rng, "x", "c1", 8, channels, "conv1"), (helper.make_node("Relu", ["c1"], ["h"]), []),
                  (dw, [w]), (helper.make_node("Relu", ["c2"], ["h2"]), []),
                  conv(rng, "h2", "y", channels, 8, "conv2")],
                 [("x", [1, 8, h, w_])], [("y", [1, 8, h, w_])])
