"""TallConvToWide: a conv over a one-pixel-wide map (jax2tf's 1-D convs, Magika) runs along the width, matching
onnxruntime; the forms it must leave alone keep their shape."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(5)


def _tall(c=16, o=32, h=40, k=5, stride=1, dilation=1, pads=(2, 0, 2, 0), groups=1, bn=True, width=1, kw=1):
    """``x [1, c, h, width] -> Conv(k x kw window) [-> BatchNormalization] -> Relu``."""
    inits = [numpy_helper.from_array(RNG.standard_normal((o, c // groups, k, kw)).astype("float32") / c, "W"),
             numpy_helper.from_array(RNG.standard_normal(o).astype("float32"), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[k, kw], strides=[stride, 1],
                              dilations=[dilation, 1], pads=list(pads), group=groups)]
    last = "c"
    if bn:
        inits += [numpy_helper.from_array(RNG.uniform(0.5, 1.5, o).astype("float32"), n) for n in ("g", "v")]
        inits += [numpy_helper.from_array(RNG.standard_normal(o).astype("float32"), n) for n in ("b", "m")]
        nodes.append(helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]))
        last = "n"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    return make_model(nodes, [("x", [1, c, h, width])], [("y", None)], inits)


def _conv_maps(cm) -> list[tuple[int, int]]:
    """(height, width) of the input of every conv kernel."""
    maps = []
    for fn, _ in cm.record.kernels.values():
        for block in fn.body.blocks:
            for b in block.bindings:
                if getattr(getattr(b.value, "op", None), "name", "") == "relax.nn.conv2d":
                    shape = [int(d) for d in b.value.args[0].ty.shape]
                    maps.append((shape[2], shape[3]))
    return maps


@pytest.mark.parametrize("kwargs", [
    {},
    {"stride": 2, "pads": (1, 0, 2, 0)},
    {"dilation": 2, "pads": (4, 0, 4, 0), "bn": False},
    {"groups": 16, "o": 16, "k": 3, "pads": (1, 0, 1, 0)},  # depthwise
], ids=["same", "strided", "dilated", "depthwise"])
def test_tall_conv_runs_along_the_width_and_matches_onnxruntime(kwargs):
    model = _tall(**kwargs)
    x = {"x": RNG.standard_normal((1, 16, 40, 1)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    (got,), (want,) = cm.run(x), ort_run(model, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert _conv_maps(cm) == [(1, 40)]


@pytest.mark.parametrize("kwargs", [
    {"width": 3, "kw": 1, "pads": (2, 0, 2, 0)},  # a real 2-D map
    {"width": 1, "kw": 3, "pads": (2, 1, 2, 1)},  # padded along the width: three output columns
], ids=["wide-map", "width-padded"])
def test_other_convs_keep_their_shape(kwargs):
    model = _tall(**kwargs)
    width = kwargs["width"]
    x = {"x": RNG.standard_normal((1, 16, 40, width)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    (got,), (want,) = cm.run(x), ort_run(model, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert _conv_maps(cm) == [(40, width)]
