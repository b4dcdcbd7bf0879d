"""Paddle's learnable affine blocks (``x * s + t`` before and after an activation, PP-LCNetV3): the scale and
shift before the activation fold into the conv (FoldScaleShift), the one after it is an epilogue of the
conv's kernel (``*_affine`` pattern entries; INT8 kernels take a single scale and shift after a hardswish)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import patterns
from tvmfuse.passes.partition import Partition
from tvmfuse.patterns.builders import AFFINE
from tvmfuse.schedules.families import ACTIVATIONS
from tvmfuse.passes.kernel_names import kind

from helpers import HOST, make_model, ort_run
from helpers.patterns import _assert_well_formed, _canonical, _op_names, composite_calls, outside_ops

RNG = np.random.default_rng(3)


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def lab_block(cin=8, cout=16, group=1, k=3, pre=True, post=True, act="HardSwish", shapes=((1,), (1,)),
              scale_first=True, extra_use=False):
    """conv + bias [-> Mul(s0) -> Add(t0)] -> act [-> Mul(s1) -> Add(t1)], Paddle's operand order
    (``Mul(scale, x)``, ``Add(x, shift)``) or the other one."""
    inits = [_const("W", RNG.standard_normal((cout, cin // group, k, k)) * 0.3),
             _const("B", RNG.standard_normal((1, cout, 1, 1))),
             _const("s0", RNG.uniform(0.5, 1.5, shapes[0])), _const("t0", RNG.uniform(-0.5, 0.5, shapes[1])),
             _const("s1", RNG.uniform(0.5, 1.5, shapes[0])), _const("t1", RNG.uniform(-0.5, 0.5, shapes[1]))]
    nodes = [helper.make_node("Conv", ["x", "W"], ["c0"], pads=[k // 2] * 4, group=group),
             helper.make_node("Add", ["c0", "B"], ["c"])]
    x = "c"

    def affine(x, s, t, tag):
        mul = [s, x] if scale_first else [x, s]
        nodes.extend([helper.make_node("Mul", mul, [f"{tag}m"]), helper.make_node("Add", [f"{tag}m", t], [f"{tag}a"])])
        return f"{tag}a"

    if pre:
        x = affine(x, "s0", "t0", "pre")
    nodes.append(helper.make_node(act, [x], ["h"]))
    x = "h"
    if post:
        x = affine(x, "s1", "t1", "post")
    outputs = [("y", None)] + ([("side", None)] if extra_use else [])
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    if extra_use:
        nodes.append(helper.make_node("Identity", ["prem"], ["side"]))
    return make_model(nodes, [("x", [1, cin, 9, 9])], outputs, inits)


def _inputs(model):
    shape = [int(d.dim_value) for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": (np.random.default_rng(5).standard_normal(shape) * 2).astype("float32")}


# ------------------------------------------------------------------------------------------ FoldScaleShift

PLAIN = _op_names(_canonical(lab_block(pre=False, post=False))["main"])  # conv + bias + hardswish


@pytest.mark.parametrize("shapes", [((1,), (1,)), ((1, 16, 1, 1), (16, 1, 1)), ((), (1, 1, 1, 1))],
                         ids=["one-element", "per-channel", "scalar"])
@pytest.mark.parametrize("scale_first", [True, False])
def test_scale_and_shift_fold_into_the_conv(shapes, scale_first):
    mod = _canonical(lab_block(post=False, shapes=shapes, scale_first=scale_first))
    _assert_well_formed(mod)
    assert _op_names(mod["main"]) == PLAIN  # conv, its bias, the hardswish


def test_scale_alone_folds():
    model = lab_block(post=False)
    shift = next(n for n in model.graph.node if n.op_type == "Add" and n.input[1] == "t0")
    model.graph.node.remove(shift)
    next(n for n in model.graph.node if n.op_type == "HardSwish").input[0] = "prem"
    assert _op_names(_canonical(model)["main"]) == PLAIN


def test_channel_vector_is_not_per_channel():
    """A ``(C,)`` constant broadcasts along W: it is not one value per output channel and stays."""
    model = lab_block(cout=9, post=False, shapes=((9,), (1,)))
    assert _op_names(_canonical(model)["main"]) != PLAIN
    x = _inputs(model)
    np.testing.assert_allclose(tvmfuse.compile(model, target=HOST).run(x)[0], ort_run(model, x)[0],
                               rtol=1e-5, atol=1e-5)


def test_intermediate_read_elsewhere_is_not_folded_twice():
    """The scaled value is also a graph output: the shift stays an add after it (folding it too would leave
    the conv computed twice), the scale still folds."""
    model = lab_block(post=False, extra_use=True)
    ops = _op_names(_canonical(model)["main"])
    assert ops[:3] == ["relax.nn.conv2d", "relax.add", "relax.add"] and ops.count("relax.nn.conv2d") == 1, ops
    x = _inputs(model)
    for ours, ref in zip(tvmfuse.compile(model, target=HOST).run(x), ort_run(model, x)):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- the affine epilogue

def test_table_puts_each_affine_entry_before_its_activation():
    names, int8_names = patterns.names(), patterns.names(int8=True)
    int8_affine = [n for n in int8_names if n.endswith("_" + AFFINE)]
    assert int8_affine and all(n.endswith("_hardswish_" + AFFINE) for n in int8_affine)
    assert set(int8_names) < set(names)
    for name in int8_affine:  # before the hardswish alone, as in the FP32 table
        assert int8_names.index(name) + 1 == int8_names.index(name.removesuffix("_" + AFFINE))
    for family in ("depthwise_conv2d", "conv2d", "dense"):
        for act in ACTIVATIONS:
            plain = patterns.entry_name(family, False, act)
            assert names.index(plain) == names.index(patterns.entry_name(family, False, act, True)) + 1
    assert patterns.entry_name("conv2d", False, "hardswish", True) == "tvmfuse.conv2d_hardswish_affine"


@pytest.mark.parametrize("group,act,composite", [
    (1, "HardSwish", "tvmfuse.conv2d_hardswish_affine"),
    (8, "HardSwish", "tvmfuse.depthwise_conv2d_hardswish_affine"),
    (1, "Relu", "tvmfuse.conv2d_relu_affine"),
    (8, "Sigmoid", "tvmfuse.depthwise_conv2d_sigmoid_affine"),
])
@pytest.mark.parametrize("scale_first", [True, False])
def test_learnable_affine_block_is_one_kernel(group, act, composite, scale_first):
    model = lab_block(cin=8, cout=8 if group > 1 else 16, group=group, act=act, scale_first=scale_first)
    part = Partition()(_canonical(model))
    _assert_well_formed(part)
    assert dict(composite_calls(part)) == {composite: 1}
    assert outside_ops(part) == []
    x = _inputs(model)
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)
    kernels = {kind(gv.name_hint) for gv in cm.lowered.functions if isinstance(cm.lowered[gv], tvm.tirx.PrimFunc)}
    assert kernels - {"to_blocked", "to_plain"} == {"tvmfuse_" + composite.removeprefix("tvmfuse.")}


@pytest.mark.parametrize("group", [1, 8])
def test_int8_table_takes_a_scalar_affine_after_a_hardswish(group):
    part = Partition(int8=True)(_canonical(lab_block(cout=8 if group > 1 else 16, group=group)))
    name = "tvmfuse.depthwise_conv2d_hardswish_affine" if group > 1 else "tvmfuse.conv2d_hardswish_affine"
    assert dict(composite_calls(part)) == {name: 1}
    assert outside_ops(part) == []


@pytest.mark.parametrize("act,shapes,why", [
    ("HardSwish", ((1, 16, 1, 1), (1,)), "is not one value"),  # per-channel: no INT8 epilogue takes it
    ("Relu", ((1,), (1,)), None),  # only a hardswish's epilogue takes one
])
def test_int8_table_leaves_other_affines_outside(act, shapes, why):
    rejections: dict = {}
    part = Partition(rejections, int8=True)(_canonical(lab_block(act=act, shapes=shapes, pre=False)))
    assert dict(composite_calls(part)) == {f"tvmfuse.conv2d_{act.lower()}": 1}
    assert outside_ops(part) == ["relax.multiply", "relax.add"]
    assert why is None or any(why in reason for reason in rejections.values()), rejections


def test_widening_broadcast_is_refused():
    """A shift that widens the output (a (2, 1, 1, 1) constant after a batch-1 conv) is refused with the
    reason recorded; the model still compiles and agrees."""
    model = lab_block(pre=False, shapes=((1,), (2, 1, 1, 1)))
    rejections: dict = {}
    part = Partition(rejections)(_canonical(model))
    assert "tvmfuse.conv2d_hardswish_affine" not in dict(composite_calls(part))
    assert any("does not broadcast into the conv or dense output" in why for why in rejections.values()), rejections
    x = _inputs(model)
    np.testing.assert_allclose(tvmfuse.compile(model, target=HOST).run(x)[0], ort_run(model, x)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group,scale_first", [(1, True), (8, False)])
def test_quantized_learnable_affine_blocks_compile_and_agree(group, scale_first):
    """The conv + hardswish + scale and shift is one INT8 kernel writing the codes its INT8 reader (a 1x1 conv)
    takes: no table of output codes and no float op after it; the result stays near FP32."""
    model = lab_block(cin=8, cout=8 if group > 1 else 16, group=group, scale_first=scale_first)
    channels = 8 if group > 1 else 16
    identity = next(n for n in model.graph.node if n.op_type == "Identity")
    identity.CopyFrom(helper.make_node("Conv", [identity.input[0], "W2"], ["y"]))
    model.graph.initializer.append(_const("W2", RNG.standard_normal((4, channels, 1, 1)) * 0.3))
    x = _inputs(model)
    calib = [{"x": np.random.default_rng(i).standard_normal((1, 8, 9, 9)).astype("float32") * 2} for i in range(4)]
    cm = tvmfuse.quantize(model, calib, method="minmax", target=HOST)
    funcs = {gv.name_hint: cm.lowered[gv] for gv in cm.lowered.functions
             if isinstance(cm.lowered[gv], tvm.tirx.PrimFunc)}
    affine = [f for name, f in funcs.items() if "int8" in name and name.rsplit("_", 1)[0].endswith("hardswish_affine")]
    assert len(affine) == 1, sorted(funcs)
    assert str(affine[0].params[-1].ty.dtype) == "uint8"  # codes for the next INT8 kernel
    assert not any(str(p.name).startswith("table") for p in affine[0].params)
    ref = ort_run(model, x)[0]
    assert np.abs(cm.run(x)[0] - ref).max() < 0.1 * np.abs(ref).max()
