"""CanonicalizeClip and FoldBatchNorm: before/after structure, no-match, numbers, well-formedness."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from tvmfuse import frontend, targets
from tvmfuse.passes.canonicalize import CanonicalizeClip
from tvmfuse.passes.fold_bn import FoldBatchNorm
from tvmfuse.passes.pipeline import canonicalize_passes

from helpers import HOST, ort_run
from helpers import make_model

RNG = np.random.default_rng(7)
F32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------------------------------------- helpers

def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype="float32"), name)


def _import(model) -> tvm.IRModule:
    """The model with TVM's own Clip converter, whose form ``CanonicalizeClip`` rewrites (tvmfuse's importer makes
    the Clips it can ``R.clip`` itself: ``frontend/clip.py``)."""
    from unittest import mock

    from tvm.relax.frontend.onnx import onnx_frontend

    from tvmfuse.frontend import clip

    with mock.patch.object(clip, "converter", lambda: onnx_frontend.Clip):
        return frontend.import_model(model).mod


def _canonical(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential(canonicalize_passes())(mod)


def _assert_well_formed(mod: tvm.IRModule) -> None:
    assert relax.analysis.check_well_formed(mod), mod.script(show_meta=False)


def _calls(mod: tvm.IRModule, fn: str = "main") -> list:
    """(op name, call) for every call bound in ``fn``; call_tir shows as ``call_tir:<PrimFunc name>``."""
    out = []
    for block in mod[fn].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, relax.Call):
                continue
            if isinstance(value.op, tvm.ir.Op):
                name = value.op.name
                if name == "relax.call_tir":
                    name = f"call_tir:{value.args[0].name_hint}"
                out.append((name, value))
            elif isinstance(value.op, tvm.ir.GlobalVar):
                out.append((f"call:{value.op.name_hint}", value))
    return out


def _ops(mod: tvm.IRModule, fn: str = "main") -> list[str]:
    return [name for name, _ in _calls(mod, fn)]


def _prim_func_names(mod: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def _run(mod: tvm.IRModule, *arrays: np.ndarray) -> np.ndarray:
    """Compile with TVM's default Relax pipeline (no tvmfuse partitioning) and run ``main`` once."""
    target = targets.resolve(HOST).tvm_target()
    with target, tvm.transform.PassContext(opt_level=3):
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return out.numpy()


def _clip_bounds(call) -> tuple[float, float]:
    return tuple(float(a.value.value) if hasattr(a.value, "value") else float(a.value) for a in call.args[1:3])


# ------------------------------------------------------------------------------------- CanonicalizeClip

def _clip_model(lo: float | None, hi: float | None):
    inits, ins = [], ["x"]
    ins.append("lo" if lo is not None else "")
    if lo is not None:
        inits.append(_init("lo", np.array(lo)))
    if hi is not None:
        ins.append("hi")
        inits.append(_init("hi", np.array(hi)))
    while ins[-1] == "":
        ins.pop()
    return make_model([helper.make_node("Clip", ins, ["y"])], [("x", [1, 3, 5, 7])], [("y", None)], inits)


def test_clip_importer_shape_is_a_maximum_minimum_pair():
    """The 'before' the pass is written for: two call_tir PrimFuncs (maximum, minimum)."""
    mod = relax.transform.FoldConstant()(_import(_clip_model(0.0, 6.0)))
    ops = _ops(mod)
    assert [o.split(":")[0] for o in ops] == ["call_tir", "call_tir"], ops
    assert re.match(r"call_tir:maximum\d*$", ops[0]) and re.match(r"call_tir:minimum\d*$", ops[1]), ops


def test_clip_0_6_becomes_one_relax_clip():
    before = relax.transform.FoldConstant()(_import(_clip_model(0.0, 6.0)))
    after = CanonicalizeClip(before)
    _assert_well_formed(after)
    calls = _calls(after)
    assert [name for name, _ in calls] == ["relax.clip"]
    assert _clip_bounds(calls[0][1]) == (0.0, 6.0)
    assert calls[0][1].args[0].same_as(after["main"].params[0])
    leftover = [n for n in _prim_func_names(after) if re.match(r"(maximum|minimum)\d*$", n)]
    assert leftover == [], "unused maximum/minimum PrimFuncs must be dropped"


def test_clip_min_only_zero_becomes_relu():
    after = _canonical(_import(_clip_model(0.0, None)))
    _assert_well_formed(after)
    assert _ops(after) == ["relax.nn.relu"]
    assert _prim_func_names(after) == []


def test_clip_min_only_nonzero_becomes_clip_with_open_top():
    after = _canonical(_import(_clip_model(-1.5, None)))
    calls = _calls(after)
    assert [n for n, _ in calls] == ["relax.clip"]
    lo, hi = _clip_bounds(calls[0][1])
    assert lo == -1.5 and hi >= F32_MAX


def test_clip_max_only_becomes_clip_with_open_bottom():
    after = _canonical(_import(_clip_model(None, 6.0)))
    calls = _calls(after)
    assert [n for n, _ in calls] == ["relax.clip"]
    lo, hi = _clip_bounds(calls[0][1])
    assert lo <= -F32_MAX and hi == 6.0


def test_clip_with_runtime_bounds_is_left_alone():
    """No match: bounds are graph inputs, so the maximum/minimum pair must stay as it is."""
    model = make_model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])],
                       [("x", [1, 3, 5, 7]), ("lo", []), ("hi", [])], [("y", None)])
    before = relax.transform.FoldConstant()(_import(model))
    after = CanonicalizeClip(before)
    _assert_well_formed(after)
    tvm.ir.assert_structural_equal(after, before)
    assert "relax.clip" not in _ops(after) and "relax.nn.relu" not in _ops(after)


def test_canonicalize_clip_without_clips_is_identity():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 3, 5, 7])], [("y", None)])
    before = _import(model)
    tvm.ir.assert_structural_equal(CanonicalizeClip(before), before)


@pytest.mark.parametrize("lo,hi", [(0.0, 6.0), (0.0, None), (None, 6.0), (-1.5, 2.5)],
                         ids=["relu6", "min0", "max6", "minus1.5_2.5"])
def test_clip_numbers_match_onnxruntime(lo, hi):
    model = _clip_model(lo, hi)
    after = _canonical(_import(model))
    x = (RNG.standard_normal((1, 3, 5, 7)) * 5).astype("float32")  # plenty of values beyond both bounds
    np.testing.assert_allclose(_run(after, x), ort_run(model, {"x": x})[0], rtol=0, atol=0)


def test_conv_then_relu6_canonical_form():
    """Conv -> Clip(0, 6) ends up as conv2d, add(bias), clip: what the patterns expect."""
    w = _init("W", RNG.standard_normal((4, 3, 3, 3)))
    b = _init("B", RNG.standard_normal(4))
    model = make_model([helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1] * 4),
                        helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
                       [("x", [1, 3, 6, 6])], [("y", None)],
                       [w, b, _init("lo", np.array(0.0)), _init("hi", np.array(6.0))])
    after = _canonical(_import(model))
    _assert_well_formed(after)
    assert _ops(after) == ["relax.nn.conv2d", "relax.add", "relax.clip"]


# ---------------------------------------------------------------------------------------- FoldBatchNorm

def _bn_inits(c: int, prefix: str = ""):
    gamma = RNG.standard_normal(c)
    beta = RNG.standard_normal(c)
    mean = RNG.standard_normal(c)
    var = RNG.random(c) + 0.5
    names = [f"{prefix}{n}" for n in ("gamma", "beta", "mean", "var")]
    return names, [_init(n, a) for n, a in zip(names, (gamma, beta, mean, var))]


def _conv_bn_model(cin=3, cout=6, hw=7, bias=True, group=1, k=3, epsilon=1e-5):
    w = _init("W", RNG.standard_normal((cout, cin // group, k, k)))
    inits = [w]
    conv_in = ["x", "W"]
    if bias:
        inits.append(_init("B", RNG.standard_normal(cout)))
        conv_in.append("B")
    names, bn = _bn_inits(cout)
    nodes = [helper.make_node("Conv", conv_in, ["c"], pads=[1] * 4, group=group),
             helper.make_node("BatchNormalization", ["c", *names], ["y"], epsilon=epsilon)]
    return make_model(nodes, [("x", [1, cin, hw, hw])], [("y", None)], inits + bn)


def _unfolded(model) -> tvm.IRModule:
    return relax.transform.FoldConstant()(_import(model))


@pytest.mark.parametrize("bias", [True, False], ids=["conv_bias_bn", "conv_bn"])
def test_fold_bn_conv(bias):
    model = _conv_bn_model(bias=bias)
    before = _unfolded(model)
    assert "relax.nn.batch_norm" in _ops(before)
    after = relax.transform.FoldConstant()(FoldBatchNorm(before))
    _assert_well_formed(FoldBatchNorm(before))
    _assert_well_formed(after)
    assert _ops(after) == ["relax.nn.conv2d", "relax.add"], "batch_norm folded into conv weights + one bias add"
    conv = _calls(after)[0][1]
    assert isinstance(conv.args[1], tvm.ir.expr.Constant)
    assert tuple(int(d) for d in conv.args[1].ty.shape) == (6, 3, 3, 3)
    bias_const = _calls(after)[1][1].args[1]
    assert isinstance(bias_const, tvm.ir.expr.Constant)
    assert tuple(int(d) for d in bias_const.ty.shape) == (1, 6, 1, 1)
    x = RNG.standard_normal((1, 3, 7, 7)).astype("float32")
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(after, x), ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("multiplier", [1, 2], ids=["dw", "dw_mult2"])
def test_fold_bn_depthwise(multiplier):
    c = 5
    model = _conv_bn_model(cin=c, cout=c * multiplier, group=c, bias=True)
    before = _unfolded(model)
    after = relax.transform.FoldConstant()(FoldBatchNorm(before))
    _assert_well_formed(after)
    assert _ops(after) == ["relax.nn.conv2d", "relax.add"]
    assert int(_calls(after)[0][1].attrs.groups) == c
    x = RNG.standard_normal((1, c, 7, 7)).astype("float32")
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


def test_fold_bn_uses_epsilon():
    model = _conv_bn_model(epsilon=0.3)
    before = _unfolded(model)
    after = relax.transform.FoldConstant()(FoldBatchNorm(before))
    assert "relax.nn.batch_norm" not in _ops(after)
    x = RNG.standard_normal((1, 3, 7, 7)).astype("float32")
    np.testing.assert_allclose(_run(after, x), ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_fold_bn_in_canonicalize_pipeline():
    after = _canonical(_import(_conv_bn_model()))
    _assert_well_formed(after)
    assert _ops(after) == ["relax.nn.conv2d", "relax.add"]


def test_bn_not_after_conv_is_left_alone():
    names, bn = _bn_inits(3)
    model = make_model([helper.make_node("Relu", ["x"], ["r"]),
                        helper.make_node("BatchNormalization", ["r", *names], ["y"])],
                       [("x", [1, 3, 5, 5])], [("y", None)], bn)
    before = _unfolded(model)
    after = FoldBatchNorm(before)
    _assert_well_formed(after)
    tvm.ir.assert_structural_equal(after, before)
    assert "relax.nn.batch_norm" in _ops(after)


def _bb_conv_bn(training: bool, bias_shape=None, hw=(6, 6)) -> tvm.IRModule:
    c = 4
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, *hw), "float32"))
    stats = [relax.const(a.astype("float32")) for a in
             (RNG.standard_normal(c), RNG.standard_normal(c), RNG.standard_normal(c), RNG.random(c) + 0.5)]
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit(relax.op.nn.conv2d(x, relax.const(RNG.standard_normal((c, 3, 3, 3)).astype("float32")),
                                             padding=1))
            if bias_shape is not None:
                out = bb.emit(relax.op.add(out, relax.const(RNG.standard_normal(bias_shape).astype("float32"))))
            bn = bb.emit(relax.op.nn.batch_norm(out, *stats, axis=1, training=training))
            y = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(y)
    return bb.get()


def test_bn_training_mode_is_left_alone():
    before = _bb_conv_bn(training=True)
    after = FoldBatchNorm(before)
    _assert_well_formed(after)
    tvm.ir.assert_structural_equal(after, before)


def test_bn_inference_mode_from_block_builder_folds():
    """Same graph as the training-mode test with training=False: folds (the training test is not vacuous)."""
    before = _bb_conv_bn(training=False, bias_shape=(1, 4, 1, 1))
    after = FoldBatchNorm(before)
    _assert_well_formed(after)
    assert "relax.nn.batch_norm" not in _ops(after)
    x = RNG.standard_normal((1, 3, 6, 6)).astype("float32")
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


def test_fold_bn_bias_must_be_per_channel():
    """conv (1,4,6,4) + const of shape (4,) (broadcast along the last axis, W) -> BN: must not be read as a bias."""
    before = _bb_conv_bn(training=False, bias_shape=(4,), hw=(6, 4))
    after = FoldBatchNorm(before)
    x = RNG.standard_normal((1, 3, 6, 4)).astype("float32")
    # W == C == 4 is needed for the (4,) constant to broadcast at all; then folding must keep the numbers.
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-5, atol=1e-5)


def test_called_ops_sees_the_ops_of_main_and_of_a_branch():
    from tvmfuse.passes.utils import called_ops

    with_bn = _bb_conv_bn(training=False)
    assert {"relax.nn.conv2d", "relax.nn.batch_norm"} <= called_ops(with_bn)
    assert "relax.dequantize" not in called_ops(with_bn)
    bb = relax.BlockBuilder()
    x, cond = relax.Var("x", relax.TensorType((2,), "float32")), relax.Var("c", relax.TensorType((), "bool"))
    with bb.function("main", [x, cond]):
        y = bb.emit(relax.If(cond, relax.op.nn.relu(x), x))
        bb.emit_func_output(y)
    assert "relax.nn.relu" in called_ops(bb.get())  # inside the branch, not a binding of main


def test_fold_bn_without_batch_norm_gives_what_the_full_rewrite_gives(monkeypatch):
    from tvmfuse.passes import fold_bn

    model = make_model([helper.make_node("Conv", ["x", "W"], ["c"]), helper.make_node("Relu", ["c"], ["y"]),
                        helper.make_node("Sigmoid", ["c"], ["unused"])],
                       [("x", [1, 3, 5, 5])], [("y", None)], [_init("W", RNG.standard_normal((4, 3, 1, 1)))])
    before = CanonicalizeClip(_import(model))
    assert "relax.nn.batch_norm" not in fold_bn.called_ops(before)
    fast = FoldBatchNorm(before)
    monkeypatch.setattr(fold_bn, "called_ops", lambda mod: {"relax.nn.batch_norm"})
    tvm.ir.assert_structural_equal(fast, FoldBatchNorm(before))


def test_fuse_qdq_reports_nothing_on_a_float_model():
    from tvmfuse.passes.int8.qdq import FuseQDQ

    before = _import("zoo:tiny_convnet")
    report: dict = {}
    tvm.ir.assert_structural_equal(FuseQDQ(None, report)(before), before)
    assert report == {"int8_kernels": 0, "kept_float": [], "code_pools": 0, "code_squeezes": 0,
                      "residual_adds": 0}
