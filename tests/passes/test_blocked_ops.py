"""Ops carried in the blocked layout between blocked kernels (LowerPartitions): a channel Concat and
elementwise ops (squeeze-and-excitation's ``x * scale``, adds, activations) run on NCHW[b]c, so no
``to_plain`` / ``to_blocked`` pair surrounds them; every model still matches onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import targets

from helpers import HOST, make_model, ort_run
from helpers.layout import transforms

SPEC = targets.resolve(HOST)


class _Net:
    """A tiny ONNX graph builder: convs with seeded weights and whatever nodes a test adds."""

    def __init__(self, seed=0):
        self.rng, self.nodes, self.inits = np.random.default_rng(seed), [], []

    def conv(self, src, cin, cout, k=3, stride=1, act="Relu"):
        name = f"c{len(self.nodes)}"
        w = (self.rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype("float32")
        b = self.rng.standard_normal(cout).astype("float32") * 0.1
        self.inits += [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]
        self.nodes.append(helper.make_node("Conv", [src, f"{name}.w", f"{name}.b"], [name], kernel_shape=[k, k],
                                           pads=[k // 2] * 4, strides=[stride, stride]))
        if act is None:
            return name
        return self.op(act, name)

    def op(self, op_type, *inputs, **attrs):
        out = f"{op_type.lower()}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value, "float32"), name))
        return name

    def model(self, out, c_in=3, hw=12):
        self.nodes.append(helper.make_node("Identity", [out], ["y"]))
        return make_model(self.nodes, [("x", [1, c_in, hw, hw])], [("y", None)], self.inits)


def _matches(model, hw=12, c_in=3):
    x = np.random.default_rng(1).standard_normal((1, c_in, hw, hw)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _stem_concat(second_channels=16):
    """PP-OCRv6's stem: a conv and a max-pool of the same map, concatenated, then a conv."""
    n = _Net()
    a = n.conv("x", 3, 16)
    b = n.conv(a, 16, second_channels)
    p = n.op("MaxPool", a, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    cat = n.op("Concat", p, b, axis=1)
    return n.model(n.conv(cat, 16 + second_channels, 16, stride=2))


def test_channel_concat_of_blocked_maps_stays_blocked():
    model = _stem_concat()
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 1, "nchwc": 3}  # only the output's
    _matches(model)


def test_concat_with_a_part_of_no_whole_blocks_stays_plain():
    model = _stem_concat(second_channels=12)  # 12 channels: no 8- or 16-channel block divides them
    assert transforms(model, SPEC)["to_plain"] >= 2
    _matches(model)


def _squeeze_excite(gate="HardSigmoid", scale_first=False):
    """x -> conv -> [mean -> 1x1 conv -> relu -> 1x1 conv -> gate] * x -> conv (+ the SE input, residual)."""
    n = _Net(1)
    x = n.conv("x", 3, 32)
    pooled = n.op("GlobalAveragePool", x)
    scale = n.conv(n.conv(pooled, 32, 8, k=1), 8, 32, k=1, act=gate)
    excited = n.op("Mul", *((scale, x) if scale_first else (x, scale)))  # torchvision's MobileNetV3: scale first
    out = n.op("Add", n.conv(excited, 32, 32, act=None), excited)
    return n.model(n.op("Mul", out, n.const("half", 0.5)))


@pytest.mark.parametrize("gate,scale_first", [("HardSigmoid", False), ("Sigmoid", False), ("HardSigmoid", True)])
def test_squeeze_excitation_product_is_computed_blocked(gate, scale_first):
    model = _squeeze_excite(gate, scale_first)
    # before: to_plain of x for the product, to_blocked of the product for the residual
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 1, "nchwc": 4}
    _matches(model)


def test_elementwise_of_a_non_channel_broadcast_stays_plain():
    n = _Net(2)
    x = n.conv("x", 3, 16)
    row = n.const("row", np.random.default_rng(3).standard_normal((1, 1, 1, 12)))  # broadcast along W
    model = n.model(n.conv(n.op("Mul", x, row), 16, 16))
    assert transforms(model, SPEC)["to_plain"] == 2  # the product and the output: the Mul ran plain
    _matches(model)


def test_activation_and_add_between_blocked_kernels():
    n = _Net(4)
    a = n.conv("x", 3, 16, act=None)
    b = n.conv(a, 16, 16, act=None)
    s = n.op("Sigmoid", n.op("Add", a, b))
    model = n.model(n.conv(s, 16, 16))
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 1, "nchwc": 3}
    _matches(model)
