"""Winograd F(2x2, 3x3) conv2d (schedules/computes/winograd.py, x86 conv2d_winograd): where it is chosen, its weight
transform, its numbers against onnxruntime (odd sizes, residual, batch, 16-channel blocks) and its schedule."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tvm
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.computes import winograd
from tvmfuse.schedules.x86 import conv2d_winograd, templates

from helpers import HOST, ort_run
from helpers.schedules import Structure
from helpers.blocked import conv_model, partition_call, run_blocked


@pytest.mark.parametrize("cin,cout,hw,residual", [(256, 256, 14, False), (256, 256, 7, True), (256, 512, 5, False),
                                                   (128, 128, 9, False)])
def test_winograd_conv_matches_onnxruntime(cin, cout, hw, residual):
    # 7 and 5 are odd: the last tile row and column stick out of the map and are cut.
    model, feeds = conv_model(cin, cout, hw, 3, 1, 1, residual=residual, seed=hw)
    got, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_winograd"
    assert "Winograd" in str(kernel.attrs["tvmfuse.layout"])
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_sigmoid_epilogue_on_an_odd_map_matches_onnxruntime():
    model, feeds = conv_model(128, 128, 9, 3, 1, 1, act="Sigmoid", seed=4)
    got, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_winograd" and "sigmoid" in str(kernel.attrs["tvmfuse.ops"])
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("channels", [256, 32])  # from 32 channels with 16-lane vectors (winograd.min_channels)
def test_winograd_with_16_channel_blocks_computes_correctly_on_this_host(channels):
    model, feeds = conv_model(channels, channels, 6, 3, 1, 1, seed=1)
    got, kernel = run_blocked(model, feeds, spec=targets.resolve("x86-avx512"))
    assert str(kernel.attrs["tvmfuse.layout"]).startswith("NCHW16c, weight Winograd")
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin,cout,k,stride,pad,dilation", [
    (16, 256, 3, 1, 1, 1),  # too few input channels: the transforms cost what the products save
    (256, 16, 3, 1, 1, 1),  # too few output channels
    (256, 256, 3, 2, 1, 1),  # stride 2
    (256, 256, 3, 1, 0, 1),  # no padding
    (256, 256, 3, 1, 2, 2),  # dilation
    (256, 256, 1, 1, 0, 1),  # 1x1
])
def test_direct_conv_where_winograd_does_not_apply_or_pay(cin, cout, k, stride, pad, dilation):
    model, feeds = conv_model(cin, cout, 6, k, stride, pad, dilation)
    _, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_nchwc"


def test_the_channel_threshold_follows_the_vector_width():
    args = ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1)
    assert winograd.pays(32, 32, *args, lanes=16) and not winograd.pays(32, 32, *args, lanes=8)
    assert winograd.pays(64, 64, *args, lanes=8) and not winograd.pays(16, 64, *args, lanes=16)
    assert not winograd.pays(32, 32, *args)  # no vector width given: the AVX2 threshold


def test_a_whole_model_with_batch_two_matches_onnxruntime():
    from helpers import make_model
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((256, 256, 3, 3)) / 48).astype("float32")
    w2 = (rng.standard_normal((256, 256, 3, 3)) / 48).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "W2"], ["b"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Add", ["b", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make_model(nodes, [("x", [2, 256, 9, 9])], [("y", None)],
                       [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    families = {str(f.attrs["tvmfuse.family"]) for gv, f in cm.mod.functions_items() if gv.name_hint.startswith("tvmfuse_")}
    # The first conv reads the plain model input directly (direct kernel); the second gets it blocked.
    assert families == {"conv2d_nchwc", "conv2d_winograd"}
    x = {"x": rng.standard_normal((2, 256, 9, 9)).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)


def test_a_conv_without_bias_or_activation_stores_the_output_transform_itself():
    from helpers import make_model
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(2)
    w = (rng.standard_normal((256, 256, 3, 3)) / 48).astype("float32")
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)],
                       [("x", [1, 256, 7, 7])], [("y", None)], [numpy_helper.from_array(w, "W")])
    feeds = {"x": rng.standard_normal((1, 256, 7, 7)).astype("float32")}
    got, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_winograd"
    assert list(Structure(kernel).blocks)[-1] == winograd.ANCHOR  # no epilogue stage to compute it in
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_weight_transform_round_trips_and_matches_the_definition():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 24, 3, 3)).astype("float32")
    packed = winograd.pack_weight(w, 8, 8)
    assert packed.shape == (4, 4, 2, 24, 8)
    _, _, g = winograd.matrices()
    np.testing.assert_allclose(packed[1, 2, 1, 5, 3], (g @ w[8 + 3, 5] @ g.T)[1, 2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(winograd.unpack_weight(packed), w, rtol=1e-5, atol=1e-5)


def _kernel(cin=256, cout=256, hw=8):
    from tvmfuse.passes.lower import make_kernel

    model, feeds = conv_model(cin, cout, hw, 3, 1, 1)
    fn, _ = partition_call(model)
    data = [i for i, p in enumerate(fn.params) if p.ty.shape is not None and len(p.ty.shape) == 4][0]
    kernel, _ = make_kernel(fn, targets.resolve(HOST), schedule=False, blocks={data: 8})
    return kernel


def test_schedule_structure():
    """Constants folded (no transform-matrix stage left), each stage parallel and vectorized over channels;
    both transforms unrolled sums and differences with no multiplication: the input's 16 values per tile, the
    output's 2 x 2 pixels of a tile, kept in registers for the epilogue (bias and ReLU here), applied to them
    under the same tile loop in a loop of its own (not unrolled with them: one copy of its code)."""
    func = conv2d_winograd.apply(_kernel(), 8)
    s = Structure(func)
    assert not {"A", "B", "pad_temp"} & set(s.blocks), s.blocks
    epilogue = list(s.blocks)[-1]
    for block in (winograd.INPUT, winograd.PRODUCT + "_update", winograd.ANCHOR, epilogue):
        kinds = [loop.kind for loop in s.loops[block]]
        assert ForKind.PARALLEL in kinds and kinds[-1] == ForKind.VECTORIZED, (block, kinds)
    assert [loop.kind for loop in s.loops[winograd.INPUT]] == [ForKind.PARALLEL, ForKind.UNROLLED, ForKind.UNROLLED,
                                                               ForKind.VECTORIZED]
    assert [loop.kind for loop in s.loops[winograd.ANCHOR]] == [ForKind.PARALLEL, ForKind.SERIAL, ForKind.UNROLLED,
                                                                ForKind.UNROLLED, ForKind.VECTORIZED]
    assert s.shared_loops(winograd.ANCHOR, epilogue) == 2 and ForKind.UNROLLED not in {
        loop.kind for loop in s.loops[epilogue]}
    assert s.alloc[winograd.ANCHOR + "_local"][0] == "local"
    for block in (winograd.INPUT, winograd.ANCHOR):
        ops = collections.Counter()
        _float_ops(s.sch.get(s.blocks[block]).body.value, ops)
        assert ops["Mul"] == 0 and ops["Add"] + ops["Sub"] >= 3, (block, ops)


@pytest.mark.parametrize("which,k", [("B", e) for e in range(winograd.ALPHA)]
                         + [("A", y) for y in range(winograd.TILE)])
def test_a_transform_is_the_matrix_transposed_times_the_values(which, k):
    a, b, _ = winograd.matrices()
    matrix = {"A": a, "B": b}[which]
    values = [tvm.tirx.FloatImm("float64", float(v)) for v in (3.0, -5.0, 7.5, 11.0)]
    got = tvm.sym.Analyzer().simplify(winograd.transform(matrix, tvm.tirx.IntImm("int32", k), values.__getitem__))
    assert float(got.value) == float(matrix[:, k] @ [3.0, -5.0, 7.5, 11.0])


def test_a_transform_takes_only_zero_and_unit_entries():
    _, b, _ = winograd.matrices()
    values = [tvm.tirx.FloatImm("float64", 1.0)] * winograd.ALPHA
    for bad in (b * 0.5, -b):  # halves; a column with no +1
        with pytest.raises(ValueError, match="0 and"):
            winograd.transform(bad, tvm.tirx.Var("e", "int32"), values.__getitem__)


def _float_ops(expr, ops: collections.Counter) -> None:
    """Count the float operations of ``expr`` by node type (a load's indices are not looked into)."""
    if "float" in str(getattr(expr, "ty", "")):
        ops[type(expr).__name__] += 1
    for field in ("a", "b", "condition", "true_value", "false_value", "value"):
        if hasattr(expr, field) and not hasattr(expr, "indices"):  # a load: its indices are not float ops
            _float_ops(getattr(expr, field), ops)
    for arg in getattr(expr, "args", []):
        _float_ops(arg, ops)


def test_template_space_and_a_non_default_config_keep_the_numbers():
    kernel = _kernel()
    # oc_vectors in {1, 2, 4} (of 32 output blocks) x tile_block 1..8 (the AVX2 accumulator budget)
    assert templates.space_size(templates.annotate(kernel, "conv2d_winograd"), 256) == 3 * 8
    spec = targets.resolve(HOST)
    x = [np.random.default_rng(i).standard_normal([int(d) for d in p.ty.shape]).astype("float32")
         for i, p in enumerate(kernel.params)]
    outs = []
    for cfg in (None, conv2d_winograd.Config(1, 3)):
        func = conv2d_winograd.apply(kernel, 8, cfg)
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=spec.tvm_target())
        arrays = [tvm.runtime.tensor(a) for a in x]
        lib["main"](*arrays)
        outs.append(arrays[-1].numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
