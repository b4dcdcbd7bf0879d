"""GELU in every form exporters write, as one epilogue of its conv or dense (issue #18): ONNX ``Gelu`` (opset
20, erf and tanh), the tanh form spelt out (torch's legacy exporter, ``Pow(x, 3)``, onnxruntime's
``FastGelu`` grouping) and the erf form spelt out; each kernel against onnxruntime, the vectorized GELUs
against float64, and spellings whose constants are not GELU's left alone (and still right)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import te

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.computes.activations import gelu, gelu_tanh

from helpers import HOST, make_model, ort_run
from helpers.patterns import composite_calls

BETA, KAPPA = math.sqrt(2.0 / math.pi), 0.044715


def _scalar(name, value):
    return numpy_helper.from_array(np.array(value, dtype="float32"), name)


def _tanh_nodes(spelling: str, kappa: float = KAPPA) -> tuple[list, list]:
    """Nodes from ``c`` to ``y`` for GELU's tanh form, and their initializers."""
    inits = [_scalar("kappa", kappa), _scalar("beta", BETA), _scalar("one", 1.0), _scalar("half", 0.5)]
    mul, add = (lambda a, b, o: helper.make_node("Mul", [a, b], [o])), (lambda a, b, o: helper.make_node("Add", [a, b], [o]))
    if spelling == "torch":  # half * (x * (1 + tanh(beta * (x + kappa * (x * (x * x))))))
        nodes = [mul("c", "c", "sq"), mul("c", "sq", "cube"), mul("kappa", "cube", "kc"), add("c", "kc", "in"),
                 mul("beta", "in", "arg"), helper.make_node("Tanh", ["arg"], ["t"]), add("one", "t", "op"),
                 mul("c", "op", "p"), mul("half", "p", "y")]
    elif spelling == "pow":  # 0.5 * x * (1 + tanh(beta * (x + kappa * x ** 3)))
        inits.append(_scalar("three", 3.0))
        nodes = [helper.make_node("Pow", ["c", "three"], ["cube"]), mul("cube", "kappa", "kc"), add("kc", "c", "in"),
                 mul("in", "beta", "arg"), helper.make_node("Tanh", ["arg"], ["t"]), add("t", "one", "op"),
                 mul("c", "half", "hx"), mul("hx", "op", "y")]
    elif spelling == "fast":  # x * (1 + tanh(beta x + kappa beta x^3)) / 2: onnxruntime's FastGelu grouping
        inits += [_scalar("kb", KAPPA * BETA), _scalar("two", 2.0)]
        nodes = [mul("c", "c", "sq"), mul("sq", "c", "cube"), mul("beta", "c", "bx"), mul("cube", "kb", "kc"),
                 add("bx", "kc", "arg"), helper.make_node("Tanh", ["arg"], ["t"]), add("t", "one", "op"),
                 mul("op", "c", "p"), helper.make_node("Div", ["p", "two"], ["y"])]
    else:
        raise ValueError(spelling)
    return nodes, inits


def _gelu_nodes(form: str) -> tuple[list, list, int]:
    """(nodes from ``c`` to ``y``, initializers, opset)."""
    if form == "op_erf":
        return [helper.make_node("Gelu", ["c"], ["y"])], [], 20
    if form == "op_tanh":
        return [helper.make_node("Gelu", ["c"], ["y"], approximate="tanh")], [], 20
    if form == "erf_spelt":
        inits = [_scalar("sqrt2", math.sqrt(2.0)), _scalar("one", 1.0), _scalar("half", 0.5)]
        return ([helper.make_node("Div", ["c", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["c", "f"], ["g"]),
                 helper.make_node("Mul", ["g", "half"], ["y"])], inits, 17)
    nodes, inits = _tanh_nodes(form.removeprefix("tanh_"))
    return nodes, inits, 17


def _conv_model(form: str, rng, cin=8, cout=16, group=1, hw=(9, 11)):
    w = rng.standard_normal((cout, cin // group, 3, 3)) * 2.0 / np.sqrt(cin // group * 9)
    inits = [_scalar("W", w), _scalar("B", rng.standard_normal(cout) * 0.5)]
    conv = helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group)
    nodes, extra, opset = _gelu_nodes(form)
    model = make_model([conv] + nodes, [("x", [1, cin, *hw])], [("y", None)], inits + extra, opset=opset)
    return model, {"x": rng.standard_normal((1, cin, *hw)).astype("float32")}


def _dense_model(form: str, rng, m=3, k=24, n=40):
    inits = [_scalar("W", rng.standard_normal((k, n)) * 2.0 / np.sqrt(k)), _scalar("B", rng.standard_normal(n) * 0.5)]
    head = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["c"])]
    nodes, extra, opset = _gelu_nodes(form)
    model = make_model(head + nodes, [("x", [m, k])], [("y", None)], inits + extra, opset=opset)
    return model, {"x": rng.standard_normal((m, k)).astype("float32")}


FORMS = ["op_erf", "op_tanh", "erf_spelt", "tanh_torch", "tanh_pow", "tanh_fast"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["conv2d", "depthwise_conv2d", "dense"])
def test_every_gelu_form_is_one_kernel_that_matches_onnxruntime(kind, form):
    rng = np.random.default_rng(len(form) * 7 + len(kind))
    if kind == "dense":
        model, feeds = _dense_model(form, rng)
    else:
        model, feeds = _conv_model(form, rng, **({"cin": 16, "group": 16} if kind == "depthwise_conv2d" else {}))
    cm = tvmfuse.compile(model, target=HOST)
    assert dict(composite_calls(cm.record.partitioned)) == {f"tvmfuse.{kind}_gelu": 1}
    np.testing.assert_allclose(cm.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_tanh_spelling_with_other_constants_is_left_alone_and_right():
    """kappa = 0.05 is not GELU: the chain stays as written (no gelu partition) and computes what it says."""
    rng = np.random.default_rng(3)
    nodes, inits = _tanh_nodes("torch", kappa=0.05)
    conv = helper.make_node("Conv", ["x", "W"], ["c"], kernel_shape=[1, 1])
    model = make_model([conv] + nodes, [("x", [1, 4, 5, 5])], [("y", None)],
                       [_scalar("W", rng.standard_normal((8, 4, 1, 1)))] + inits)
    feeds = {"x": rng.standard_normal((1, 4, 5, 5)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    assert dict(composite_calls(cm.record.partitioned)) == {"tvmfuse.conv2d": 1}
    np.testing.assert_allclose(cm.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["op_erf", "op_tanh", "tanh_torch"])
def test_gelu_outside_any_partition_matches_onnxruntime(form):
    """A GELU of a sum of two inputs (no conv or dense to ride on) runs on its own kernel, vectorized."""
    nodes, inits, opset = _gelu_nodes(form)
    model = make_model([helper.make_node("Add", ["a", "b"], ["c"])] + nodes, [("a", [2, 300]), ("b", [2, 300])],
                       [("y", None)], inits, opset=opset)
    rng = np.random.default_rng(11)
    feeds = {n: (rng.standard_normal((2, 300)) * 4).astype("float32") for n in ("a", "b")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def _reference(form: str, x: np.ndarray) -> np.ndarray:
    x = x.astype("float64")
    if form == "erf":
        return 0.5 * x * (1 + np.frompyfunc(math.erf, 1, 1)(x / math.sqrt(2.0)).astype("float64"))
    return 0.5 * x * (1 + np.tanh(BETA * (x + KAPPA * x ** 3)))


@pytest.mark.parametrize("form,fn", [("erf", gelu), ("tanh", gelu_tanh)])
def test_vectorized_gelu_error_against_float64(form, fn):
    """Measured on Zen 4 over 2^20 points in [-12, 12]: at most 1.8e-7 x (1 + |x|) (erf form) and 1.6e-7 x
    (1 + |x|) (tanh form) from the float64 value, about one float32 rounding of the result."""
    x = te.placeholder((1 << 20,), "float32", name="x")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([x, fn(x)]).with_attr("global_symbol", "main")}),
                      target=targets.resolve(HOST).tvm_target())
    values = np.linspace(-12, 12, 1 << 20, dtype="float32")
    out = tvm.runtime.tensor(np.empty_like(values))
    lib["main"](tvm.runtime.tensor(values), out)
    error = np.abs(out.numpy() - _reference(form, values))
    assert (error / (1 + np.abs(values))).max() <= 2.5e-7
