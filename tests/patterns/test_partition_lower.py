"""Partition and LowerPartitions: before/expected module pairs, the lowered kernels' attributes, and every zoo
model well-formed after both (the pattern table and its conversions: ``test_patterns.py``).

Habits (DESIGN): every pass has a before/expected test, a no-match test, a rejected-match test and a
well-formedness check. Graphs are small ONNX models imported and canonicalized like ``tvmfuse.compile`` does.
"""


from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax

from tvmfuse import frontend, targets, zoo
from tvmfuse.passes.lower import OPAQUE, LowerPartitions
from tvmfuse.passes.partition import Partition, composites
from tvmfuse.passes.pipeline import canonicalize_passes
from tvmfuse.passes.kernel_names import kind

from helpers import HOST
from helpers import make_model

from helpers.patterns import *  # noqa: F401,F403  (graph builders and pass drivers)


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
    lowered = LowerPartitions(targets.resolve(HOST), kernels, blocked=False)(part)
    _assert_well_formed(lowered)
    assert composites(lowered) == {}
    main_calls = [bd.value for bd in _bindings(lowered["main"]) if isinstance(bd.value, relax.Call)]
    assert [c.op.name for c in main_calls] == ["relax.call_tir"]
    gv = main_calls[0].args[0]
    assert kind(gv.name_hint) == "tvmfuse_conv2d_relu" and list(kernels) == [gv.name_hint]
    fn, layout = kernels[gv.name_hint]
    packed = layout.packed
    assert str(fn.attrs["Composite"]) == "tvmfuse.conv2d_relu"
    args = main_calls[0].args[1].fields
    assert len(args) == 3 and all(isinstance(a, tvm.ir.expr.Constant) for a in args[1:])
    # On CPU the conv weight is passed pre-packed [O/ob, I, kh, kw, ob]; the numbers are unchanged.
    (index, oc_block), = packed.items()
    weight = fn.params[index]
    o, i, kh, kw = (int(d) for d in weight.ty.shape)
    assert tuple(args[index].value.numpy().shape) == (o // oc_block, i, kh, kw, oc_block)


def test_lower_no_partitions_is_identity():
    mod = _canonical(_g_relu_maxpool())
    tvm.ir.assert_structural_equal(LowerPartitions()(mod), mod)


# -------------------------------------------------------------------------------- lowered kernel attrs

KERNEL_CASES = [
    ("conv2d", lambda: _g_conv(_act("Relu")), "tvmfuse.conv2d_relu", "conv2d", "conv2d,add,relu"),
    ("depthwise", lambda: _g_conv([_relu6("c", "y")], _CLIP_INITS, cin=8, cout=8, group=8),
     "tvmfuse.depthwise_conv2d_clip", "depthwise_conv2d", "conv2d,add,clip"),
    # 2 channels per group: no blocked kernel (groups of 4 or 8 share a block, see test_narrow_groups.py)
    ("grouped", lambda: _g_conv(_act("Relu"), cin=8, cout=8, group=4), "tvmfuse.conv2d_relu", "group_conv2d",
     "conv2d,add,relu"),
    ("dense", lambda: _g_gemm_relu(), "tvmfuse.dense_relu", "dense", "matmul,add,relu"),
    ("residual", lambda: _g_residual(("r", "c"), "Relu", c=8), "tvmfuse.conv2d_add_relu", "conv2d",
     "conv2d,add,add,relu"),
    ("residual-5ch", lambda: _g_residual(("r", "c"), "Relu"), "tvmfuse.conv2d_add_relu", "conv2d_5ch",
     "conv2d,add,add,relu"),  # 5 channels have no block: NCHW in both modes
]


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("make,partition,family,ops", [c[1:] for c in KERNEL_CASES], ids=[c[0] for c in KERNEL_CASES])
def test_lowered_kernel_attrs(make, partition, family, ops, blocked):
    part, _ = _partition(_canonical(make()))
    lowered = LowerPartitions(targets.resolve(HOST), blocked=blocked)(part)
    # Blocked: conv2d and depthwise kernels (8 channels here) run in NCHW[8]c; grouped and dense cannot.
    family += "_nchwc" if blocked and family in ("conv2d", "depthwise_conv2d") else ""
    family = family.replace("_5ch", "")
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
    mod = frontend.import_model(f"zoo:{name}").mod  # a -1 batch compiles at batch 1
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
    families = {"conv2d", "depthwise_conv2d", "group_conv2d", "dense", "conv2d_nchwc", "conv2d_winograd",
                "depthwise_conv2d_nchwc", "group_conv2d_nchwc"}
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
