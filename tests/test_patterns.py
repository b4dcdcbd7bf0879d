"""The fusion pattern table, Partition and LowerPartitions.

Habits (DESIGN): every pass has a before/expected test, a no-match test, a rejected-match test and a
well-formedness check. Graphs are small ONNX models imported and canonicalized like ``tvmfuse.compile`` does.
"""

from __future__ import annotations

import collections
import functools

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

import tvmfuse
from tvmfuse import frontend, patterns, targets, zoo
from tvmfuse.passes.lower import OPAQUE, LowerPartitions
from tvmfuse.passes.partition import Partition, composites
from tvmfuse.passes.pipeline import canonicalize_passes
from tvmfuse.patterns import checks

from conftest import HOST, ort_run
from helpers import make_model

RNG = np.random.default_rng(11)


# ---------------------------------------------------------------------------------------------- helpers

def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype="float32"), name)


def _w(name, shape):
    return _init(name, RNG.standard_normal(shape))


def _canonical(model) -> tvm.IRModule:
    mod = frontend.import_model(model).mod
    return tvm.transform.Sequential(canonicalize_passes())(mod)


def _partition(mod: tvm.IRModule):
    rejections: dict = {}
    return Partition(rejections)(mod), rejections


def _assert_well_formed(mod: tvm.IRModule) -> None:
    assert relax.analysis.check_well_formed(mod), mod.script(show_meta=False)


def _bindings(func: relax.Function):
    for block in func.body.blocks:
        yield from block.bindings


def _op_names(func: relax.Function) -> list[str]:
    """Relax op names bound in ``func`` (``call:<Composite>`` for a partition call), in order."""
    out = []
    for b in _bindings(func):
        v = b.value
        if isinstance(v, relax.Call):
            out.append(v.op.name if isinstance(v.op, tvm.ir.Op) else f"call:{v.op.name_hint}")
    return out


def composite_calls(mod: tvm.IRModule) -> collections.Counter:
    """How many times each partition (by ``Composite`` name) is called from ``main``.

    ``composites(mod)`` holds one function per distinct body (FuseOpsByPattern shares identical ones), so
    uses are counted at the call sites; every callee must be one of ``composites(mod)``.
    """
    comps = composites(mod)
    counts = collections.Counter()
    for b in _bindings(mod["main"]):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar):
            assert v.op.name_hint in comps
            counts[str(comps[v.op.name_hint].attrs["Composite"])] += 1
    return counts


def outside_ops(mod: tvm.IRModule) -> list[str]:
    """Relax ops of ``main`` that stayed outside partitions."""
    return [n for n in _op_names(mod["main"]) if not n.startswith("call:")]


def _composite_named(mod: tvm.IRModule, name: str) -> relax.Function:
    found = [f for f in composites(mod).values() if str(f.attrs["Composite"]) == name]
    assert len(found) == 1, [str(f.attrs["Composite"]) for f in composites(mod).values()]
    return found[0]


def _conv(inputs, out, k=3, pad=1, stride=1, group=1, name=None):
    return helper.make_node("Conv", inputs, [out], kernel_shape=[k, k], pads=[pad] * 4, strides=[stride] * 2,
                            group=group, **({"name": name} if name else {}))


def _relu6(inp, out):
    return helper.make_node("Clip", [inp, "c0", "c6"], [out])


_CLIP_INITS = [_init("c0", np.array(0.0)), _init("c6", np.array(6.0))]


def _bn(inp, out, c, prefix="bn"):
    names = [f"{prefix}_{n}" for n in ("g", "b", "m", "v")]
    inits = [_w(names[0], c), _w(names[1], c), _w(names[2], c), _init(names[3], RNG.random(c) + 0.5)]
    return helper.make_node("BatchNormalization", [inp, *names], [out]), inits


# --------------------------------------------------------------------------------------- priority order

EXPECTED_ORDER = [
    "tvmfuse.depthwise_conv2d_add_relu",
    "tvmfuse.depthwise_conv2d_add",
    "tvmfuse.depthwise_conv2d_relu",
    "tvmfuse.depthwise_conv2d_clip",
    "tvmfuse.depthwise_conv2d_hardswish",
    "tvmfuse.depthwise_conv2d_leakyrelu",
    "tvmfuse.depthwise_conv2d_sigmoid",
    "tvmfuse.depthwise_conv2d",
    "tvmfuse.conv2d_add_relu",
    "tvmfuse.conv2d_add",
    "tvmfuse.conv2d_relu",
    "tvmfuse.conv2d_clip",
    "tvmfuse.conv2d_hardswish",
    "tvmfuse.conv2d_leakyrelu",
    "tvmfuse.conv2d_sigmoid",
    "tvmfuse.conv2d",
    "tvmfuse.dense_relu",
    "tvmfuse.dense_clip",
    "tvmfuse.dense_hardswish",
    "tvmfuse.dense_leakyrelu",
    "tvmfuse.dense_sigmoid",
    "tvmfuse.dense",
]


def test_priority_order_pinned():
    assert patterns.names() == EXPECTED_ORDER


def test_table_follows_names():
    table = patterns.table()
    # first appearance: an entry may be split into several FusionPatterns (e.g. one per operand order)
    assert list(dict.fromkeys(p.name for p in table)) == EXPECTED_ORDER
    assert all(p.check is not None for p in table)


def test_entry_name():
    assert patterns.entry_name("conv2d", True, "relu") == "tvmfuse.conv2d_add_relu"
    assert patterns.entry_name("depthwise_conv2d", False, None) == "tvmfuse.depthwise_conv2d"
    assert patterns.entry_name("dense", False, "clip") == "tvmfuse.dense_clip"


# ---------------------------------------------------------------------------------- graph conversions

def _g_conv(act_nodes, act_inits=(), cin=3, cout=8, hw=8, group=1, bias=True, k=3):
    inputs = ["x", "W"] + (["B"] if bias else [])
    inits = [_w("W", (cout, cin // group, k, k))] + ([_w("B", cout)] if bias else [])
    nodes = [_conv(inputs, "c", k=k, pad=k // 2, group=group)] + act_nodes
    return make_model(nodes, [("x", [1, cin, hw, hw])], [("y", None)], inits + list(act_inits))


def _g_conv_bn_relu6(cin=3, cout=8, group=1):
    bn, bn_inits = _bn("c", "n", cout)
    nodes = [_conv(["x", "W"], "c", group=group), bn, _relu6("n", "y")]
    return make_model(nodes, [("x", [1, cin, 8, 8])], [("y", None)],
                      [_w("W", (cout, cin // group, 3, 3))] + bn_inits + _CLIP_INITS)


def _g_residual(order, act, c=5, group=1):
    nodes = [_conv(["x", "W", "B"], "c", group=group), helper.make_node("Add", list(order), ["a" if act else "y"])]
    if act:
        nodes.append(helper.make_node(act, ["a"], ["y"]))
    return make_model(nodes, [("x", [1, c, 7, 7]), ("r", [1, c, 7, 7])], [("y", None)],
                      [_w("W", (c, c // group, 3, 3)), _w("B", c)])


def _g_gemm_relu(n=7):
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["y"])]
    return make_model(nodes, [("x", [2, 10])], [("y", None)], [_w("W", (n, 10)), _w("B", n)])


def _g_matmul(act_nodes=(), act_inits=(), out="y"):
    nodes = [helper.make_node("MatMul", ["x", "W"], [out])] + list(act_nodes)
    return make_model(nodes, [("x", [3, 10])], [("y", None)], [_w("W", (10, 6))] + list(act_inits))


def _act(op, **attrs):
    return [helper.make_node(op, ["c"], ["y"], **attrs)]


# (id, model factory, expected partition calls, ops expected to stay outside partitions)
CONVERSIONS = [
    ("conv_bias_relu", lambda: _g_conv(_act("Relu")), {"tvmfuse.conv2d_relu": 1}, []),
    ("conv_nobias_relu", lambda: _g_conv(_act("Relu"), bias=False), {"tvmfuse.conv2d_relu": 1}, []),
    ("conv_bias", lambda: _g_conv(_act("Identity")), {"tvmfuse.conv2d": 1}, []),
    ("conv_bn_relu6", lambda: _g_conv_bn_relu6(), {"tvmfuse.conv2d_clip": 1}, []),
    ("conv_hardswish", lambda: _g_conv(_act("HardSwish")), {"tvmfuse.conv2d_hardswish": 1}, []),
    ("conv_leakyrelu", lambda: _g_conv(_act("LeakyRelu", alpha=0.2)), {"tvmfuse.conv2d_leakyrelu": 1}, []),
    ("conv_sigmoid", lambda: _g_conv(_act("Sigmoid")), {"tvmfuse.conv2d_sigmoid": 1}, []),
    ("dw_relu6", lambda: _g_conv([_relu6("c", "y")], _CLIP_INITS, cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_clip": 1}, []),
    ("dw_bn_relu6", lambda: _g_conv_bn_relu6(cin=8, cout=8, group=8), {"tvmfuse.depthwise_conv2d_clip": 1}, []),
    ("dw_mult2_relu", lambda: _g_conv(_act("Relu"), cin=4, cout=8, group=4), {"tvmfuse.depthwise_conv2d_relu": 1}, []),
    ("dw_hardswish", lambda: _g_conv(_act("HardSwish"), cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_hardswish": 1}, []),
    ("dw_leakyrelu", lambda: _g_conv(_act("LeakyRelu"), cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_leakyrelu": 1}, []),
    ("dw_sigmoid", lambda: _g_conv(_act("Sigmoid"), cin=8, cout=8, group=8), {"tvmfuse.depthwise_conv2d_sigmoid": 1}, []),
    ("dw_alone", lambda: _g_conv(_act("Identity"), cin=8, cout=8, group=8), {"tvmfuse.depthwise_conv2d": 1}, []),
    ("grouped_2_of_8_relu", lambda: _g_conv(_act("Relu"), cin=8, cout=8, group=2), {"tvmfuse.conv2d_relu": 1}, []),
    ("residual_conv_first_relu", lambda: _g_residual(("c", "r"), "Relu"), {"tvmfuse.conv2d_add_relu": 1}, []),
    ("residual_conv_second_relu", lambda: _g_residual(("r", "c"), "Relu"), {"tvmfuse.conv2d_add_relu": 1}, []),
    ("residual_no_act", lambda: _g_residual(("c", "r"), None), {"tvmfuse.conv2d_add": 1}, []),
    ("residual_then_sigmoid", lambda: _g_residual(("c", "r"), "Sigmoid"), {"tvmfuse.conv2d_add": 1},
     ["relax.sigmoid"]),
    ("dw_residual_relu", lambda: _g_residual(("r", "c"), "Relu", group=5), {"tvmfuse.depthwise_conv2d_add_relu": 1}, []),
    ("gemm_transB_bias_relu", lambda: _g_gemm_relu(), {"tvmfuse.dense_relu": 1}, []),
    ("matmul_const", lambda: _g_matmul(), {"tvmfuse.dense": 1}, []),
    ("matmul_const_sigmoid", lambda: _g_matmul([helper.make_node("Sigmoid", ["m"], ["y"])], out="m"),
     {"tvmfuse.dense_sigmoid": 1}, []),
    ("matmul_bias_relu6", lambda: _g_matmul([helper.make_node("Add", ["m", "b"], ["a"]), _relu6("a", "y")],
                                            [_w("b", 6)] + _CLIP_INITS, out="m"), {"tvmfuse.dense_clip": 1}, []),
    ("matmul_nonconst_weight", lambda: make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                                  [("x", [3, 10]), ("w", [10, 6])], [("y", None)]),
     {}, ["relax.matmul"]),
    ("relu_maxpool_no_match", lambda: make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2])],
        [("x", [1, 3, 8, 8])], [("y", None)]), {}, ["relax.nn.relu", "relax.nn.max_pool2d"]),
]


MAKE = {c[0]: c[1] for c in CONVERSIONS}


@pytest.mark.parametrize("make,expected,outside", [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS])
def test_conversion(make, expected, outside):
    mod = _canonical(make())
    part, _ = _partition(mod)
    _assert_well_formed(part)
    assert dict(composite_calls(part)) == expected
    assert sorted(str(f.attrs["Composite"]) for f in composites(part).values()) == sorted(expected)
    assert outside_ops(part) == outside
    lowered = LowerPartitions()(part)
    _assert_well_formed(lowered)
    assert composites(lowered) == {}


def test_no_match_is_structurally_unchanged_and_runs():
    model = MAKE["relu_maxpool_no_match"]()
    mod = _canonical(model)
    part, rejections = _partition(mod)
    tvm.ir.assert_structural_equal(part, mod)
    assert rejections == {}
    tvm.ir.assert_structural_equal(LowerPartitions()(part), mod)
    cm = tvmfuse.compile(model, target=HOST)
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_matmul_nonconst_weight_not_partitioned_and_runs():
    model = MAKE["matmul_nonconst_weight"]()
    mod = _canonical(model)
    part, _ = _partition(mod)
    tvm.ir.assert_structural_equal(part, mod)
    cm = tvmfuse.compile(model, target=HOST)
    assert cm.record.kernels == {}
    feeds = {"x": RNG.standard_normal((3, 10)).astype("float32"), "w": RNG.standard_normal((10, 6)).astype("float32")}
    np.testing.assert_allclose(cm.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_matmul_3d_data_rejected_with_reason():
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["y"])], [("x", [2, 3, 10])], [("y", None)],
                       [_w("W", (10, 6))])
    part, rejections = _partition(_canonical(model))
    assert composite_calls(part) == {}
    assert any("2-D" in r for r in rejections.values()), rejections


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


# --------------------------------------------------------------------------------- before / expected

def test_partition_before_expected_conv_bias_relu():
    """Before: conv2d -> add(bias) -> relu in main. Expected: one composite call, weights passed as constants."""
    weight = relax.const(RNG.standard_normal((8, 3, 3, 3)).astype("float32"))
    bias = relax.const(RNG.standard_normal((1, 8, 1, 1)).astype("float32"))
    data_ty = relax.TensorType((1, 3, 8, 8), "float32")

    bb = relax.BlockBuilder()
    x = relax.Var("x", data_ty)
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, weight, padding=1))
            b = bb.emit(relax.op.add(c, bias))
            y = bb.emit_output(relax.op.nn.relu(b))
        bb.emit_func_output(y)
    before = bb.get()

    name = "fused_relax_nn_conv2d_relax_add_relax_nn_relu"
    bb = relax.BlockBuilder()
    px = relax.Var("x", data_ty)
    pw = relax.Var("param_0", relax.TensorType((8, 3, 3, 3), "float32"))
    pb = relax.Var("param_1", relax.TensorType((1, 8, 1, 1), "float32"))
    with bb.function(name, [px, pw, pb], attrs={"Composite": "tvmfuse.conv2d_relu", "Primitive": True}, private=True):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(px, pw, padding=1))
            b = bb.emit(relax.op.add(c, pb))
            y = bb.emit_output(relax.op.nn.relu(b))
        bb.emit_func_output(y)
    x = relax.Var("x", data_ty)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.Call(bb.get().get_global_var(name), [x, weight, bias]))
        bb.emit_func_output(y)
    expected = bb.get()

    after, rejections = _partition(before)
    _assert_well_formed(before)
    _assert_well_formed(after)
    tvm.ir.assert_structural_equal(after, expected)
    assert rejections == {}


def test_partition_structure_from_onnx_conv_bias_relu():
    w = RNG.standard_normal((8, 3, 3, 3)).astype("float32")
    b = RNG.standard_normal(8).astype("float32")
    model = make_model([_conv(["x", "W", "B"], "c"), helper.make_node("Relu", ["c"], ["y"])],
                       [("x", [1, 3, 8, 8])], [("y", None)], [_init("W", w), _init("B", b)])
    part, _ = _partition(_canonical(model))
    main = part["main"]
    calls = [bd.value for bd in _bindings(main) if isinstance(bd.value, relax.Call)]
    assert len(calls) == 1 and isinstance(calls[0].op, tvm.ir.GlobalVar)
    fn = part[calls[0].op]
    assert str(fn.attrs["Composite"]) == "tvmfuse.conv2d_relu"
    assert _op_names(fn) == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]
    assert [tuple(int(d) for d in p.ty.shape) for p in fn.params] == [(1, 3, 8, 8), (8, 3, 3, 3), (1, 8, 1, 1)]
    data, weight, bias = calls[0].args
    assert data.same_as(main.params[0])
    assert isinstance(weight, tvm.ir.expr.Constant) and isinstance(bias, tvm.ir.expr.Constant)
    np.testing.assert_array_equal(weight.value.numpy(), w)
    np.testing.assert_array_equal(bias.value.numpy().reshape(-1), b)


def test_lower_before_expected_conv_bias_relu():
    model = _g_conv(_act("Relu"))
    part, _ = _partition(_canonical(model))
    kernels: dict = {}
    lowered = LowerPartitions(targets.resolve(HOST), kernels)(part)
    _assert_well_formed(lowered)
    assert composites(lowered) == {}
    main_calls = [bd.value for bd in _bindings(lowered["main"]) if isinstance(bd.value, relax.Call)]
    assert [c.op.name for c in main_calls] == ["relax.call_tir"]
    gv = main_calls[0].args[0]
    assert gv.name_hint == "tvmfuse_conv2d_relu" and list(kernels) == ["tvmfuse_conv2d_relu"]
    fn, packed = kernels["tvmfuse_conv2d_relu"]
    assert str(fn.attrs["Composite"]) == "tvmfuse.conv2d_relu"
    args = main_calls[0].args[1].fields
    assert len(args) == 3 and all(isinstance(a, tvm.ir.expr.Constant) for a in args[1:])
    # On CPU the conv weight is passed pre-packed [O/ob, I, kh, kw, ob]; the numbers are unchanged.
    (index, oc_block), = packed.items()
    weight = fn.params[index]
    o, i, kh, kw = (int(d) for d in weight.ty.shape)
    assert tuple(args[index].value.numpy().shape) == (o // oc_block, i, kh, kw, oc_block)


def test_lower_no_partitions_is_identity():
    mod = _canonical(MAKE["relu_maxpool_no_match"]())
    tvm.ir.assert_structural_equal(LowerPartitions()(mod), mod)


# -------------------------------------------------------------------------------- lowered kernel attrs

KERNEL_CASES = [
    ("conv2d", lambda: _g_conv(_act("Relu")), "tvmfuse.conv2d_relu", "conv2d", "conv2d,add,relu"),
    ("depthwise", lambda: _g_conv([_relu6("c", "y")], _CLIP_INITS, cin=8, cout=8, group=8),
     "tvmfuse.depthwise_conv2d_clip", "depthwise_conv2d", "conv2d,add,clip"),
    ("grouped", lambda: _g_conv(_act("Relu"), cin=8, cout=8, group=2), "tvmfuse.conv2d_relu", "group_conv2d",
     "conv2d,add,relu"),
    ("dense", lambda: _g_gemm_relu(), "tvmfuse.dense_relu", "dense", "matmul,add,relu"),
    ("residual", lambda: _g_residual(("r", "c"), "Relu"), "tvmfuse.conv2d_add_relu", "conv2d", "conv2d,add,add,relu"),
]


@pytest.mark.parametrize("make,partition,family,ops", [c[1:] for c in KERNEL_CASES], ids=[c[0] for c in KERNEL_CASES])
def test_lowered_kernel_attrs(make, partition, family, ops):
    part, _ = _partition(_canonical(make()))
    lowered = LowerPartitions(targets.resolve(HOST))(part)
    kernels = [f for _, f in lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.partition" in f.attrs]
    assert len(kernels) == 1
    attrs = kernels[0].attrs
    assert str(attrs["tvmfuse.partition"]) == partition
    assert str(attrs["tvmfuse.family"]) == family
    assert str(attrs["tvmfuse.ops"]) == ops
    assert int(attrs["op_pattern"]) == OPAQUE == 8


# ------------------------------------------------------------------------------------ zoo well-formed

@functools.lru_cache(maxsize=None)
def _zoo_passes(name: str):
    spec = targets.resolve(HOST)
    mod = frontend.import_model(zoo.get(name)).mod
    with spec.tvm_target(), tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(canonicalize_passes())(mod)
        rejections: dict = {}
        part = Partition(rejections)(mod)
        kernels: dict = {}
        lowered = LowerPartitions(spec, kernels)(part)
    return mod, part, lowered, kernels


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_well_formed_after_partition_and_lower(name):
    mod, part, lowered, kernels = _zoo_passes(name)
    _assert_well_formed(mod)
    _assert_well_formed(part)
    _assert_well_formed(lowered)
    assert sum(composite_calls(part).values()) > 0
    assert composites(lowered) == {}
    assert kernels
    families = {"conv2d", "depthwise_conv2d", "group_conv2d", "dense"}
    for gv, f in lowered.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.partition" in f.attrs:
            assert str(f.attrs["tvmfuse.family"]) in families, gv
            assert str(f.attrs["tvmfuse.partition"]).startswith("tvmfuse.")
            assert str(f.attrs["tvmfuse.ops"])
            assert int(f.attrs["op_pattern"]) == 8


def test_zoo_resnet18_partition_counts():
    _, part, _, _ = _zoo_passes("resnet18")
    assert dict(composite_calls(part)) == {"tvmfuse.conv2d_relu": 9, "tvmfuse.conv2d_add_relu": 8,
                                           "tvmfuse.conv2d": 3, "tvmfuse.dense": 1}


def test_zoo_mobilenet_v2_every_residual_add_fused():
    _, part, _, _ = _zoo_passes("mobilenet_v2")
    calls = composite_calls(part)
    assert calls["tvmfuse.conv2d_add"] == 10
    assert "relax.add" not in outside_ops(part)
