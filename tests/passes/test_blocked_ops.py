"""Ops carried in the blocked layout between blocked kernels (LowerPartitions): a channel Concat, a channel
Split at block boundaries, Resize and elementwise ops (squeeze-and-excitation's ``x * scale``, adds,
activations) run on NCHW[b]c, so no ``to_plain`` / ``to_blocked`` pair surrounds them; every model still
matches onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

import tvmfuse
from tvmfuse import targets
from tvmfuse.zoo import layers as L
from tvmfuse.zoo.builder import GraphBuilder

from helpers import HOST, ort_run
from helpers.layout import transforms

SPEC = targets.resolve(HOST)


def _net(seed=0):
    return GraphBuilder(seed=seed, input_shape=(1, 3, 12, 12), input_name="x")


def _conv(g, x, cout, k=3, stride=1, act="Relu"):
    y = g.conv(x, cout, k, stride=stride, bias=True)
    if act == "HardSigmoid":
        return L.hardsigmoid(g, y)
    return y if act is None else L.unary(g, act, y)


def _matches(model):
    x = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _stem_concat(second_channels=16):
    """PP-OCRv6's stem: a conv and a max-pool of the same map, concatenated, then a conv."""
    g = _net()
    a = _conv(g, "x", 16)
    cat = L.concat(g, [g.max_pool(a, 3, 1, pad=1), _conv(g, a, second_channels)], axis=1)
    _conv(g, cat, 16, stride=2)
    return g.build("stem_concat")


def test_concat_with_a_part_of_no_whole_blocks_stays_plain():
    model = _stem_concat(second_channels=12)  # 12 channels: no 8- or 16-channel block divides them
    assert transforms(model, SPEC)["to_plain"] >= 2
    _matches(model)


def _squeeze_excite(gate="HardSigmoid", scale_first=False):
    """x -> conv -> [mean -> 1x1 conv -> relu -> 1x1 conv -> gate] * x -> conv (+ the SE input, residual)."""
    g = _net(1)
    x = _conv(g, "x", 32)
    scale = _conv(g, _conv(g, g.global_avg_pool(x), 8, k=1), 32, k=1, act=gate)
    excited = L.binary(g, "Mul", *((scale, x) if scale_first else (x, scale)))  # torchvision's MobileNetV3: scale first
    out = g.add(_conv(g, excited, 32, act=None), excited)
    L.binary(g, "Mul", out, L.scalar(g, "half", 0.5))
    return g.build("squeeze_excite")


@pytest.mark.parametrize("gate,scale_first", [("HardSigmoid", False), ("Sigmoid", False), ("HardSigmoid", True)])
def test_squeeze_excitation_product_is_computed_blocked(gate, scale_first):
    model = _squeeze_excite(gate, scale_first)
    # before: to_plain of x for the product, to_blocked of the product for the residual
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 1, "nchwc": 4}
    _matches(model)


def test_elementwise_of_a_non_channel_broadcast_stays_plain():
    g = _net(2)
    row = g._const("row", np.random.default_rng(3).standard_normal((1, 1, 1, 12)).astype("float32"))  # along W
    _conv(g, L.binary(g, "Mul", _conv(g, "x", 16), row), 16)
    model = g.build("row_broadcast")
    assert transforms(model, SPEC)["to_plain"] == 2  # the product and the output: the Mul ran plain
    _matches(model)


def test_activation_and_add_between_blocked_kernels():
    g = _net(4)
    a = _conv(g, "x", 16, act=None)
    _conv(g, L.unary(g, "Sigmoid", g.add(a, _conv(g, a, 16, act=None))), 16)
    model = g.build("add_sigmoid")
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 1, "nchwc": 3}
    _matches(model)


def _c2f(sizes=(16, 16)):
    """YOLOv8's C2f: a conv's output split in channels, a conv on the second part, everything concatenated
    and mixed by a 1x1 conv."""
    g = _net()
    a = _conv(g, "x", sum(sizes))
    parts = L.split(g, a, list(sizes), axis=1, name="split")
    b = _conv(g, parts[-1], sizes[-1])
    _conv(g, L.concat(g, parts + [b], axis=1), 16, k=1)
    return g.build("c2f")


@pytest.mark.parametrize("make", [_stem_concat, _c2f], ids=["concat", "split_and_concat"])
def test_channel_concat_and_split_of_blocked_maps_stay_blocked(make):
    model = make()
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 1, "nchwc": 3}  # only the output's
    _matches(model)


def test_split_inside_a_block_stays_plain():
    model = _c2f((8, 24))  # 8 channels: inside a 16-channel block (and AVX2's 8: the 24 part is 3 blocks)
    counts = transforms(model, SPEC)
    if SPEC.vector_bits() >= 512:
        assert counts["to_plain"] >= 2
    _matches(model)


@pytest.mark.parametrize("mode,ctm", [("nearest", "asymmetric"), ("linear", "half_pixel"),
                                      ("linear", "align_corners")])
def test_resize_of_a_blocked_map_stays_blocked(mode, ctm):
    """A detector neck's upsampling between convs: resized in the blocked layout, every method per channel."""
    g = _net()
    a = _conv(g, "x", 16)
    up = L.resize(g, a, "up", mode, ctm, scales=[1, 1, 2, 2])
    _conv(g, L.concat(g, [up, _conv(g, up, 16)], axis=1), 16, k=1)
    model = g.build("neck")
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 1, "nchwc": 3}
    _matches(model)
