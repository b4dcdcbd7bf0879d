"""Squeeze-and-excitation's product folded into the conv that reads it (issue #18): ``conv(x * s)`` computed as
``conv(x, W * s)`` inside one kernel, against onnxruntime and under op-check; left as a separate kernel where
the product has another reader or the weight is larger than the map."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse.opcheck import run_checked
from tvmfuse.schedules.computes.channel_scale import SCALED_WEIGHT

from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(9)


def _w(name, shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def se_block(size=8, out_channels=8, kernel=1, second_reader=False, channels=16, stride=1):
    """conv 3->C (relu) -> SE (global mean, 1x1 C->4 relu, 1x1 4->C hard-sigmoid) -> x * gate -> conv."""
    pad = kernel // 2
    inits = [_w("w0", (channels, 3, 3, 3)), _w("b0", (channels,)), _w("w1", (4, channels, 1, 1)), _w("b1", (4,)),
             _w("w2", (channels, 4, 1, 1)), _w("b2", (channels,)), _w("w3", (out_channels, channels, kernel, kernel)),
             _w("b3", (out_channels,))]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["a0"]),
             helper.make_node("GlobalAveragePool", ["a0"], ["m"]),
             helper.make_node("Conv", ["m", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"]),
             helper.make_node("HardSigmoid", ["c2"], ["gate"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["a0", "gate"], ["p"]),
             helper.make_node("Conv", ["p", "w3", "b3"], ["y" if not second_reader else "c3"],
                              pads=[pad] * 4, strides=[stride] * 2)]
    outputs = [("y", None)]
    if second_reader:  # the product is also the model's second output
        nodes.append(helper.make_node("Relu", ["c3"], ["y"]))
        nodes.append(helper.make_node("Identity", ["p"], ["p_out"]))
        outputs.append(("p_out", None))
    return make_model(nodes, [("x", [1, 3, size, size])], outputs, inits, opset=13)


def _scripts(cm) -> dict:
    return {gv.name_hint: cm.lowered[gv].script() for gv in cm.lowered.functions
            if isinstance(cm.lowered[gv], tvm.tirx.PrimFunc)}


def _check(model, size):
    cm = tvmfuse.compile(model, target=HOST)
    x = {"x": RNG.standard_normal((1, 3, size, size)).astype(np.float32)}
    for got, want in zip(cm.run(x), ort_run(model, x)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return cm, x


@pytest.mark.parametrize("kernel,size,channels,stride", [(1, 8, 16, 1), (3, 16, 16, 1), (3, 16, 24, 2)],
                         ids=["1x1", "3x3", "24_channels_stride_2"])
def test_the_product_becomes_the_consuming_convs_weight_scale(kernel, size, channels, stride):
    """24 channels: blocks of 8 on a 16-lane target (a whole vector does not divide them)."""
    model = se_block(size=size, kernel=kernel, channels=channels, stride=stride)
    cm, x = _check(model, size)
    scripts = _scripts(cm)
    scaled = [name for name, text in scripts.items() if SCALED_WEIGHT in text]
    assert len(scaled) == 1 and "multiply" in str(cm.lowered[scaled[0]].attrs["tvmfuse.ops"])
    assert not any(name.startswith("multiply") or "_multiply" in name for name in scripts), sorted(scripts)
    _, checks = run_checked(cm, x)  # the kernel against its partition function, prologue included
    assert any(c.kernel == scaled[0] for c in checks)


@pytest.mark.parametrize("model,size", [(se_block(second_reader=True), 8), (se_block(size=8, kernel=3), 8)],
                         ids=["product_read_twice", "weight_larger_than_map"])
def test_the_product_stays_a_kernel_where_folding_does_not_pay(model, size):
    """Read twice, the product is computed anyway; a 3x3 conv to 8 channels scales 72 weights per input
    channel against 64 map values, so the product stays a kernel of its own there too."""
    cm, _ = _check(model, size)
    scripts = _scripts(cm)
    assert not any(SCALED_WEIGHT in text for text in scripts.values())
    assert any("multiply" in name for name in scripts), sorted(scripts)
