"""Add-to-output legality (OneFlow's FuseAddToOutput rules) and the other refused or re-tried matches."""


from __future__ import annotations

import numpy as np
import tvm
from onnx import helper
from tvm import relax

import tvmfuse
from tvmfuse.passes.lower import LowerPartitions
from tvmfuse.patterns import checks

from helpers import HOST, ort_run
from helpers import make_model

RNG = np.random.default_rng(11)


from helpers.patterns import *  # noqa: F401,F403  (graph builders and pass drivers)


# ----------------------------------------------------------------------------------- rejected matches

def test_reject_conv_output_with_two_consumers():
    """(a) conv -> add(residual) -> relu and conv -> sigmoid: the conv output must stay visible outside."""
    c = 5
    model = make_model([_conv(["x", "W", "B"], "c"), helper.make_node("Add", ["c", "r"], ["a"]),
                        helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Sigmoid", ["c"], ["s"])],
                       [("x", [1, c, 7, 7]), ("r", [1, c, 7, 7])], [("y", None), ("s", None)],
                       [_w("W", (c, c, 3, 3)), _w("B", c)])
    part, rejections = _partition(_canonical(model))
    _assert_well_formed(part)
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d": 1}
    assert _op_names(_composite_named(part, "tvmfuse.conv2d")) == ["relax.nn.conv2d", "relax.add"]
    assert outside_ops(part) == ["relax.add", "relax.nn.relu", "relax.sigmoid"]
    assert any("used outside" in r for r in rejections.values()), rejections
    feeds = {"x": RNG.standard_normal((1, c, 7, 7)).astype("float32"),
             "r": RNG.standard_normal((1, c, 7, 7)).astype("float32")}
    outs, refs = tvmfuse.compile(model, target=HOST).run(feeds), ort_run(model, feeds)
    for o, r in zip(outs, refs):
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4)


def test_reject_broadcast_residual():
    """(b)+(e) the other add operand is (1,C,1,1) computed at run time: a broadcast, not add-to-output."""
    c = 5
    model = make_model([_conv(["x", "W", "B"], "c"), helper.make_node("GlobalAveragePool", ["x"], ["p"]),
                        helper.make_node("Add", ["c", "p"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                       [("x", [1, c, 7, 7])], [("y", None)], [_w("W", (c, c, 3, 3)), _w("B", c)])
    part, rejections = _partition(_canonical(model))
    _assert_well_formed(part)
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d": 1}
    assert outside_ops(part) == ["relax.mean", "relax.add", "relax.nn.relu"]
    assert len(rejections) == 1 and "broadcast" in next(iter(rejections.values())), rejections


def test_two_residual_adds_fuse_only_one():
    """(c) conv + add(r1) + add(r2): the first add joins the partition, the second stays outside."""
    c = 5
    model = make_model([_conv(["x", "W", "B"], "c"), helper.make_node("Add", ["c", "r1"], ["a1"]),
                        helper.make_node("Add", ["a1", "r2"], ["a2"]), helper.make_node("Relu", ["a2"], ["y"])],
                       [("x", [1, c, 7, 7]), ("r1", [1, c, 7, 7]), ("r2", [1, c, 7, 7])], [("y", None)],
                       [_w("W", (c, c, 3, 3)), _w("B", c)])
    mod = _canonical(model)
    part, _ = _partition(mod)
    _assert_well_formed(part)
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d_add": 1}
    fn = _composite_named(part, "tvmfuse.conv2d_add")
    assert _op_names(fn) == ["relax.nn.conv2d", "relax.add", "relax.add"]  # bias, then the r1 residual
    assert outside_ops(part) == ["relax.add", "relax.nn.relu"]
    call = next(b.value for b in _bindings(part["main"]) if isinstance(b.value.op, tvm.ir.GlobalVar))
    r1, r2 = part["main"].params[1], part["main"].params[2]
    assert any(a.same_as(r1) for a in call.args) and not any(a.same_as(r2) for a in call.args)


def test_ancestors_detects_dependence_on_conv():
    """(d) the cycle rule's helper: a var computed from the conv has the conv among its ancestors."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(RNG.standard_normal((3, 3, 3, 3)).astype("float32")),
                                              padding=1))
            derived = bb.emit(relax.op.nn.relu(conv))
            derived2 = bb.emit(relax.op.sigmoid(derived))
            independent = bb.emit(relax.op.sigmoid(x))
            out = bb.emit_output(relax.op.add(derived2, independent))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    bindings = {b.var: b.value for b in _bindings(func)}
    assert conv in checks._ancestors(derived2, bindings)
    assert derived in checks._ancestors(derived2, bindings)
    assert conv in checks._ancestors(out, bindings)
    assert conv not in checks._ancestors(independent, bindings)
    assert x in checks._ancestors(independent, bindings)


def test_constant_residual_is_a_bias_not_a_residual():
    """conv (no bias) + add(const): the bias entries take it, no residual partition."""
    model = make_model([_conv(["x", "W"], "c"), helper.make_node("Add", ["c", "k"], ["a"]),
                        helper.make_node("Relu", ["a"], ["y"])],
                       [("x", [1, 4, 6, 6])], [("y", None)], [_w("W", (4, 4, 3, 3)), _w("k", (1, 4, 1, 1))])
    part, _ = _partition(_canonical(model))
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d_relu": 1}


def _two_conv_residual(order):
    """x -> convA -> a -> convB -> b; y = Add(order): both add operands are conv outputs, a has two users."""
    c = 4
    return make_model([_conv(["x", "WA", "BA"], "a", k=1, pad=0), _conv(["a", "WB", "BB"], "b"),
                       helper.make_node("Add", list(order), ["y"])],
                      [("x", [1, c, 5, 5])], [("y", None)],
                      [_w("WA", (c, c, 1, 1)), _w("BA", c), _w("WB", (c, c, 3, 3)), _w("BB", c)])


def test_residual_of_two_convs_fused_when_fusable_conv_first():
    part, _ = _partition(_canonical(_two_conv_residual(("b", "a"))))
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d": 1, "tvmfuse.conv2d_add": 1}


def test_residual_of_two_convs_fused_when_fusable_conv_second():
    part, _ = _partition(_canonical(_two_conv_residual(("a", "b"))))
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d": 1, "tvmfuse.conv2d_add": 1}


def test_intermediate_returned_by_function_is_not_fused():
    """conv -> add(bias) -> relu where the bias-add result is also a function output (no tuple binding)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, relax.const(RNG.standard_normal((4, 3, 3, 3)).astype("float32")),
                                              padding=1))
            biased = bb.emit_output(relax.op.add(conv, relax.const(RNG.standard_normal((1, 4, 1, 1)).astype("float32"))))
            act = bb.emit_output(relax.op.nn.relu(biased))
        bb.emit_func_output(relax.Tuple([biased, act]))
    part, _ = _partition(bb.get())
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d": 1}
    assert outside_ops(part) == ["relax.nn.relu"]
    _assert_well_formed(LowerPartitions()(part))


def test_no_rejection_recorded_for_fused_hardswish():
    part, rejections = _partition(_canonical(_g_conv(_act("HardSwish"))))
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d_hardswish": 1}
    assert rejections == {}


