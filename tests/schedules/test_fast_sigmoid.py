"""Sigmoid (SiLU epilogues, sigmoid gates, detection heads) is fast_exp-based on x86 and Erf is fast_erf: no
scalar expf or erff call per element; the sigmoid is as accurate as TVM's (8.9e-8 absolute error against
float64). ``x ** 2`` is a multiply."""

from __future__ import annotations

import numpy as np
import tvm
from onnx import helper, numpy_helper
from tvm import te

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.computes.activations import fast_sigmoid

from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(3)


def test_fast_sigmoid_error_against_float64():
    x = te.placeholder((1 << 16,), "float32", name="x")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([x, fast_sigmoid(x)]).with_attr(
        "global_symbol", "main")}), target=targets.resolve(HOST).tvm_target())
    a = np.concatenate([np.linspace(-100, 100, 1 << 15), RNG.standard_normal(1 << 15) * 4]).astype("float32")
    out = tvm.runtime.tensor(np.zeros_like(a))
    lib["main"](tvm.runtime.tensor(a), out)
    want = 1 / (1 + np.exp(-a.astype(np.float64)))
    got = out.numpy()
    assert np.abs(got - want).max() <= 1.2e-7
    normal = want > 1e-30  # float32 cannot hold the smaller ones relative to themselves
    assert (np.abs(got - want)[normal] / want[normal]).max() <= 1e-5
    assert np.all((got >= 0) & (got <= 1))


def _silu_and_gate():
    """Conv + SiLU (an epilogue), then a sigmoid gate outside every partition."""
    w = numpy_helper.from_array((RNG.standard_normal((16, 8, 3, 3)) / 6).astype("float32"), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["silu"]),
             helper.make_node("ReduceMean", ["silu"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Sigmoid", ["m"], ["g"]), helper.make_node("Mul", ["silu", "g"], ["y"])]
    return make_model(nodes, [("x", [1, 8, 12, 12])], [("y", None)], [w], opset=13)


def test_silu_epilogue_and_sigmoid_gate_match_onnxruntime_without_expf():
    model = _silu_and_gate()
    x = {"x": (RNG.standard_normal((1, 8, 12, 12)) * 3).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-6)
    text = cm.lowered.script()
    assert "T.sigmoid(" not in text and "T.exp(" not in text  # both are fast_exp polynomials now


def test_erf_outside_partitions_is_the_fast_erf_polynomial():
    """A GELU that no partition takes (ConvNeXt's, behind a reshape): fast_erf, not a scalar erff per element."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Div", ["t", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["t", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    consts = [numpy_helper.from_array(np.array(v, "float32"), n) for n, v in
              [("sqrt2", np.sqrt(2)), ("one", 1.0), ("half", 0.5)]]
    model = make_model(nodes, [("x", [1, 16, 8, 8])], [("y", None)], consts)
    x = {"x": (RNG.standard_normal((1, 16, 8, 8)) * 3).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=2e-6)
    assert "T.erf(" not in cm.lowered.script()


def test_square_is_a_multiply_and_exact_other_powers_stay_tvms():
    """A spelt-out LayerNorm's variance, ``Pow(x - mean, 2)``: a vector multiply, not libm's powf per element,
    bit-exact against onnxruntime on negative bases; a cube keeps TVM's power."""
    for exponent, kernel in ((2.0, "square"), (3.0, "power")):
        nodes = [helper.make_node("Pow", ["x", "e"], ["y"])]
        model = make_model(nodes, [("x", [4, 40])], [("y", None)],
                           [numpy_helper.from_array(np.array(exponent, "float32"), "e")])
        x = {"x": (RNG.standard_normal((4, 40)) * 3).astype("float32")}
        cm = tvmfuse.compile(model, target=HOST)
        names = [gv.name_hint for gv in cm.lowered.functions]
        assert any(n.startswith(kernel) for n in names), names
        got, want = cm.run(x)[0], ort_run(model, x)[0]
        if kernel == "square":
            np.testing.assert_array_equal(got, want)
            assert "T.pow(" not in cm.lowered.script()
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6)
