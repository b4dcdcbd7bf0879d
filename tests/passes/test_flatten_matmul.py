"""FlattenMatmul: N-D activation x constant 2-D weight runs as the dense family (with its bias), exactly as
onnxruntime computes it; what it must leave alone stays as it was."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(7)


def _model(x_shape, k, n, bias_shape=(None,), act=True, weight_const=True):
    bias_shape = (n,) if bias_shape == (None,) else bias_shape
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    inits = [numpy_helper.from_array(w, "W")] if weight_const else []
    inputs = [("x", list(x_shape))] + ([] if weight_const else [("W", [k, n])])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"])]
    out = "m"
    if bias_shape is not None:
        inits.append(numpy_helper.from_array(RNG.standard_normal(bias_shape).astype("float32"), "B"))
        nodes.append(helper.make_node("Add", ["m", "B"], ["y"]))
        out = "y"
    if act:
        nodes.append(helper.make_node("Relu", [out], ["z"]))
        out = "z"
    return make_model(nodes, inputs, [(out, None)], inits), w


def _kernels(cm) -> list[str]:
    return sorted(gv.name_hint for gv in cm.lowered.functions if gv.name_hint != "main")


def _check(model, feeds):
    cm = tvmfuse.compile(model, target=HOST)
    for got, want in zip(cm.run(feeds), ort_run(model, feeds)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return cm


@pytest.mark.parametrize("x_shape", [(1, 40, 24), (2, 5, 24), (2, 3, 4, 24)])
def test_nd_activation_times_constant_weight_is_a_dense_with_its_bias(x_shape):
    model, _ = _model(x_shape, 24, 37)
    cm = _check(model, {"x": RNG.standard_normal(x_shape).astype("float32")})
    kernels = _kernels(cm)
    assert any(k.startswith("tvmfuse_dense") for k in kernels), kernels
    assert not any("matmul" in k or k.startswith("add") or "fused_add" in k for k in kernels), kernels
    assert any(k.startswith("tvmfuse_dense_relu") for k in kernels), kernels  # the Relu after the reshape too


def _gelu_after(x_shape, k, n, scale_shape=None):
    """MatMul + bias + GELU (erf form, as exporters spell it), then a constant scale of ``scale_shape``."""
    model, _ = _model(x_shape, k, n, act=False)
    g = model.graph
    consts = {"sqrt2": np.float32(np.sqrt(2.0)), "one": np.float32(1.0), "half": np.float32(0.5)}
    g.initializer.extend(numpy_helper.from_array(np.array(v), name) for name, v in consts.items())
    g.node.extend([helper.make_node("Div", ["y", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                   helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["y", "p"], ["q"]),
                   helper.make_node("Mul", ["q", "half"], ["z"])])
    out = "z"
    if scale_shape is not None:
        g.initializer.append(numpy_helper.from_array(RNG.standard_normal(scale_shape).astype("float32"), "S"))
        g.node.append(helper.make_node("Mul", ["z", "S"], ["s"]))
        out = "s"
    g.output[0].name = out
    return model


def test_gelu_after_a_flattened_product_joins_the_dense():
    """ConvNeXt's expansion: Linear on [1, H, W, C] then GELU; the reshape back sinks below the GELU."""
    model = _gelu_after((1, 4, 5, 24), 24, 64)
    cm = _check(model, {"x": RNG.standard_normal((1, 4, 5, 24)).astype("float32")})
    kernels = _kernels(cm)
    assert any(k.startswith("tvmfuse_dense_gelu") for k in kernels), kernels
    assert not any("erf" in k for k in kernels), kernels


@pytest.mark.parametrize("scale_shape", [(64,), (1, 1, 64), (4, 1, 1)])
def test_constants_after_the_product_sink_only_when_they_vary_along_columns(scale_shape):
    model = _gelu_after((1, 4, 5, 24), 24, 64, scale_shape)
    _check(model, {"x": RNG.standard_normal((1, 4, 5, 24)).astype("float32")})


def test_an_activation_operand_stops_the_sink_but_stays_right():
    model, _ = _model((1, 5, 24), 24, 37, act=False)
    g = model.graph
    g.input.append(helper.make_tensor_value_info("g", 1, [1, 5, 37]))
    g.node.append(helper.make_node("Mul", ["y", "g"], ["z"]))
    g.output[0].name = "z"
    feeds = {"x": RNG.standard_normal((1, 5, 24)).astype("float32"),
             "g": RNG.standard_normal((1, 5, 37)).astype("float32")}
    _check(model, feeds)


def test_bias_that_varies_along_rows_stays_outside_but_is_right():
    model, _ = _model((1, 5, 24), 24, 37, bias_shape=(5, 37), act=False)
    cm = _check(model, {"x": RNG.standard_normal((1, 5, 24)).astype("float32")})
    assert any(k.startswith("tvmfuse_dense") for k in _kernels(cm))


def test_two_activations_are_left_to_the_default_path():
    model, _ = _model((1, 5, 24), 24, 37, bias_shape=None, act=False, weight_const=False)
    feeds = {"x": RNG.standard_normal((1, 5, 24)).astype("float32"), "W": RNG.standard_normal((24, 37)).astype("float32")}
    cm = _check(model, feeds)
    assert not any(k.startswith("tvmfuse_dense") for k in _kernels(cm))


def test_a_2d_dense_is_unchanged():
    model, _ = _model((3, 24), 24, 37)
    cm = _check(model, {"x": RNG.standard_normal((3, 24)).astype("float32")})
    assert any(k.startswith("tvmfuse_dense") for k in _kernels(cm))
    assert not any(k.startswith("reshape") for k in _kernels(cm))
