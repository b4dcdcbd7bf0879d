"""LayerNorm as one kernel (issue #18): the spelt-out form becomes ``relax.nn.layer_norm`` (FuseLayerNorm), and
on x86 a last-axis LayerNorm is one kernel scheduled a row at a time, a channels-first one (ConvNeXt's
LayerNorm2d) one kernel scheduled a run of pixels at a time; each against onnxruntime, the kernel against
float64 on rows far from zero, and other forms left to TVM's rules."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

import tvmfuse
from tvmfuse import frontend, targets
from tvmfuse.passes.layer_norm import FuseLayerNorm
from tvmfuse.schedules.x86 import layer_norm as rule

from helpers import HOST, make_model, ort_run

WIDTH = 48


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def spelt(square: str = "pow", scaled: bool = True, shifted: bool = True, axis: int = -1, swap: bool = False,
          shape=(2, 5, WIDTH)):
    """``x -> (x - mean) / sqrt(mean((x - mean)^2) + eps) [* gamma] [+ beta]`` over ``axis``."""
    rng = np.random.default_rng(7)
    width = shape[axis]
    per_axis = (width,) + (1,) * (len(shape) - 1 - axis % len(shape))  # gamma/beta broadcast along ``axis``
    inits = [_const("eps", 1e-5), _const("two", 2.0)]
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[axis], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else helper.make_node("Mul", ["d", "d"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["v"], axes=[axis], keepdims=1),
             helper.make_node("Add", ["eps", "v"] if swap else ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]), helper.make_node("Div", ["d", "s"], ["n"])]
    out = "n"
    if scaled:
        inits.append(_const("gamma", rng.uniform(0.5, 1.5, per_axis)))
        nodes.append(helper.make_node("Mul", ["gamma", out] if swap else [out, "gamma"], ["g"]))
        out = "g"
    if shifted:
        inits.append(_const("beta", rng.uniform(-0.5, 0.5, per_axis)))
        nodes.append(helper.make_node("Add", ["beta", out] if swap else [out, "beta"], ["b"]))
        out = "b"
    nodes.append(helper.make_node("Identity", [out], ["y"]))
    return make_model(nodes, [("x", list(shape))], [("y", None)], inits, opset=13)


def layer_normalization(shape=(2, 5, WIDTH), axis=-1):
    rng = np.random.default_rng(8)
    width = shape[axis] if axis == -1 else int(np.prod(shape[axis:]))
    gshape = [width] if axis == -1 else list(shape[axis:])
    inits = [_const("gamma", rng.uniform(0.5, 1.5, gshape)), _const("beta", rng.uniform(-0.5, 0.5, gshape))]
    node = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=axis, epsilon=1e-5)
    return make_model([node], [("x", list(shape))], [("y", None)], inits, opset=17)


def _ops(model) -> list[str]:
    mod = frontend.import_model(model).mod
    with targets.resolve(HOST).tvm_target():
        mod = tvm.transform.Sequential([relax.transform.FoldConstant(), FuseLayerNorm()])(mod)
    return [b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _feeds(model, offset=0.0):
    shape = [int(d.dim_value) for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": (np.random.default_rng(3).standard_normal(shape) * 2 + offset).astype("float32")}


def _kernels(cm) -> list[str]:
    return [gv.name_hint for gv in cm.lowered.functions if isinstance(cm.lowered[gv], tvm.tirx.PrimFunc)]


@pytest.mark.parametrize("square,scaled,shifted,swap", [
    ("pow", True, True, False), ("mul", True, True, True), ("pow", True, False, False), ("mul", False, False, True)])
def test_spelt_out_layer_norm_is_one_op_and_one_kernel(square, scaled, shifted, swap):
    model = spelt(square, scaled, shifted, swap=swap)
    assert _ops(model) == ["relax.nn.layer_norm"]
    cm = tvmfuse.compile(model, target=HOST)
    assert [k for k in _kernels(cm) if "layer_norm" in k] and len(_kernels(cm)) == 1
    x = _feeds(model)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 5, WIDTH), (1, 3, 7, 96), (4, 13)])
def test_layer_normalization_runs_on_the_row_kernel(shape):
    model = layer_normalization(shape)
    cm = tvmfuse.compile(model, target=HOST)
    kernel = next(cm.lowered[gv] for gv in cm.lowered.functions if gv.name_hint.startswith("layer_norm"))
    assert "ln_norm" in kernel.script()
    x = _feeds(model)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)


def test_the_rule_schedules_the_kernel_in_whole_vectors():
    from tvm import te

    from tvmfuse.schedules.computes.layer_norm import layer_norm

    x, g, b = te.placeholder((6, 96), name="x"), te.placeholder((96,), name="g"), te.placeholder((96,), name="b")
    func = te.create_prim_func([x, g, b, layer_norm(x, g, b, 1e-5)])
    sch = rule.scheduled(func, 16)
    assert sch is not None
    text = sch.mod.script()
    assert "T.vectorized" in text and text.count("T.vectorized") >= 3  # both moments' partials and the output


def test_rows_far_from_zero_keep_their_precision():
    """Rows with mean 1e4 and spread 1: the deviation's variance, not E[x^2] - mean^2, so the result stays
    within float32 rounding of the float64 answer."""
    model = layer_normalization((3, 256))
    cm = tvmfuse.compile(model, target=HOST)
    x = _feeds(model, offset=1e4)
    g, b = (numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer)
    v = x["x"].astype(np.float64)
    want = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(cm.run(x)[0], want, atol=2e-3)


def test_other_axes_stay_as_written_and_right():
    """Over several axes (ONNX LayerNormalization with axis=1 of NCHW normalizes C, H and W): TVM's rule."""
    model = layer_normalization((1, 8, 5, 5), axis=1)
    x = _feeds(model)
    np.testing.assert_allclose(tvmfuse.compile(model, target=HOST).run(x)[0], ort_run(model, x)[0],
                               rtol=1e-5, atol=1e-5)


def test_channels_first_layer_norm_is_one_op_where_the_backend_has_its_kernel():
    model = spelt(axis=1, shape=(1, 24, 8, 8))
    assert _ops(model) == ["relax.nn.layer_norm"]
    mod = frontend.import_model(model).mod
    with targets.resolve(HOST).tvm_target():
        kept = tvm.transform.Sequential([relax.transform.FoldConstant(), FuseLayerNorm(channels=False)])(mod)
    assert "relax.nn.layer_norm" not in kept["main"].script()  # a backend without the kernel: TVM's ops
    assert not targets.resolve("cuda-sm90").backend().channel_layer_norm


@pytest.mark.parametrize("shape,ruled", [((1, 24, 8, 8), True), ((1, 16, 6, 32), True), ((2, 12, 40), True),
                                         ((1, 8, 5, 5), False)],
                         ids=["whole_rows", "part_of_a_row", "ncl", "no_vector_generic"])
@pytest.mark.parametrize("swap", [False, True])
def test_channels_first_layer_norm_kernel_matches_onnxruntime(shape, ruled, swap):
    """ConvNeXt's LayerNorm2d (``ReduceMean`` over axis 1, ``gamma[:, None, None]``): one kernel; the x86 rule
    takes runs of pixels (whole rows, part of a row) where a run is a vector, else the generic schedule."""
    model = spelt("mul" if swap else "pow", swap=swap, axis=1, shape=shape)
    cm = tvmfuse.compile(model, target=HOST)
    (kernel,) = [cm.lowered[gv] for gv in cm.lowered.functions if isinstance(cm.lowered[gv], tvm.tirx.PrimFunc)]
    text = kernel.script()
    assert "lnc_norm" in text
    assert ("T.vectorized" in text and "lnc_sum_init" in text) == ruled  # the rule splits the sums' init off
    x = _feeds(model, offset=3.0)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)


def test_gelu_after_the_norm_is_folded_into_the_row_kernel():
    """LayerNorm then GELU (erf, spelt out: the norm's output read twice), outside any partition: TVM fuses
    them into one kernel, and the row rule folds the GELU into the output."""
    model = layer_normalization()
    inits = [_const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)]
    model.graph.node[0].output[0] = "ln"
    model.graph.node.extend([helper.make_node("Div", ["ln", "sqrt2"], ["q"]), helper.make_node("Erf", ["q"], ["e"]),
                             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["ln", "e1"], ["le"]),
                             helper.make_node("Mul", ["le", "half"], ["y"])])
    model.graph.initializer.extend(inits)
    cm = tvmfuse.compile(model, target=HOST)
    kernels = _kernels(cm)
    assert len(kernels) == 1 and "ln_norm" in cm.lowered[kernels[0]].script()
    x = _feeds(model)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)
