"""Winograd F(2x2, 3x3) and F(4x4, 3x3) conv2d (schedules/computes/winograd.py, x86 conv2d_winograd): where each is
chosen, its weight transform, its numbers against onnxruntime (odd sizes, residual, batch, 16-channel blocks) and its
schedule."""

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


@pytest.mark.parametrize("cin,cout,hw,residual,tile", [(256, 256, 14, False, 4), (256, 256, 7, True, 4),
                                                        (256, 512, 5, False, 2), (128, 128, 9, False, 4),
                                                        (128, 128, 2, False, 2)])
def test_winograd_conv_matches_onnxruntime(cin, cout, hw, residual, tile):
    # 7, 5 and 9 are odd: the last tile row and column stick out of the map and are cut. 256 -> 512: F(4x4)'s
    # weights would take 18.9 MB (winograd.WEIGHT_BYTES); a 2x2 map: one F(2x2) tile, where F(4x4) would compute 16.
    model, feeds = conv_model(cin, cout, hw, 3, 1, 1, residual=residual, seed=hw)
    got, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_winograd"
    assert f"Winograd F({tile}x{tile},3x3)" in str(kernel.attrs["tvmfuse.layout"])
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_the_tile_follows_the_map_and_the_weights_size():
    assert winograd.tile_for(1, 56, 56, 64, 64) == 4
    assert winograd.tile_for(1, 14, 14, 256, 256) == 4  # 9.4 MB of F(4x4) weights
    assert winograd.tile_for(1, 7, 7, 512, 512) == 2  # 37.7 MB
    assert winograd.tile_for(1, 1, 80, 256, 256) == 2  # one row: 20 F(4x4) tiles of 36 against 40 of 16
    assert winograd.tile_for(1, 3, 80, 256, 256) == 4
    assert winograd.tile_for(4, 2, 2, 64, 64) == 2
    assert winograd.tile_for(1, 6, 6, 64, 64) == 4  # a tie (4 tiles of 36 against 9 of 16)


def test_a_sigmoid_epilogue_on_an_odd_map_matches_onnxruntime():
    model, feeds = conv_model(128, 128, 9, 3, 1, 1, act="Sigmoid", seed=4)
    got, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_winograd" and "sigmoid" in str(kernel.attrs["tvmfuse.ops"])
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("channels", [256, 16])  # from 16 channels (winograd.MIN_CHANNELS)
def test_winograd_with_16_channel_blocks_computes_correctly_on_this_host(channels):
    model, feeds = conv_model(channels, channels, 6, 3, 1, 1, seed=1)
    got, kernel = run_blocked(model, feeds, spec=targets.resolve("x86-avx512"))
    assert str(kernel.attrs["tvmfuse.layout"]).startswith("NCHW16c, weight Winograd")
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin,cout,k,stride,pad,dilation", [
    (8, 256, 3, 1, 1, 1),  # too few input channels: the transforms cost what the products save
    (256, 8, 3, 1, 1, 1),  # too few output channels
    (256, 256, 3, 2, 1, 1),  # stride 2
    (256, 256, 3, 1, 0, 1),  # no padding
    (256, 256, 3, 1, 2, 2),  # dilation
    (256, 256, 1, 1, 0, 1),  # 1x1
])
def test_direct_conv_where_winograd_does_not_apply_or_pay(cin, cout, k, stride, pad, dilation):
    model, feeds = conv_model(cin, cout, 6, k, stride, pad, dilation)
    _, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_nchwc"


def test_the_channel_threshold():  # the same with AVX-512 and AVX2
    args = ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1)
    assert winograd.pays(16, 16, *args)
    assert not winograd.pays(8, 64, *args) and not winograd.pays(64, 8, *args)


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


@pytest.mark.parametrize("tile", winograd.TILES)
def test_weight_transform_round_trips_and_matches_the_definition(tile):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 24, 3, 3)).astype("float32")
    packed = winograd.pack_weight(w, 8, 8, tile)
    assert packed.shape == (tile + 2, tile + 2, 2, 24, 8)
    _, _, g = winograd.matrices(tile)
    np.testing.assert_allclose(packed[1, 2, 1, 5, 3], (g @ w[8 + 3, 5] @ g.T)[1, 2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(winograd.unpack_weight(packed), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", winograd.TILES)
def test_the_weight_transform_in_chunks_gives_the_whole_products_bits(monkeypatch, tile):
    # pack_weight multiplies column chunks (a remainder too here: 16 x 24 pairs in chunks of 100); each packed
    # value is the float64 product over the 9 taps rounded once, as the product of the whole array gives it
    monkeypatch.setattr(winograd, "_PACK_COLUMNS", 100)
    w = np.random.default_rng(1).standard_normal((16, 24, 3, 3)).astype("float32")
    _, _, g = winograd.matrices(tile)
    whole = (w.reshape(16 * 24, 9).astype(np.float64) @ np.kron(g, g).T).astype("float32")
    expected = whole.reshape(2, 8, 24, tile + 2, tile + 2).transpose(3, 4, 0, 2, 1)
    assert np.array_equal(winograd.pack_weight(w, 8, 8, tile), expected)


@pytest.mark.parametrize("tile", winograd.TILES)
def test_the_matrices_compute_a_convolution(tile):
    # 1-D: A^T [(G g) * (B^T d)] is the valid correlation of d (tile + 2 values) with g (3 taps)
    a, b, g = winograd.matrices(tile)
    rng = np.random.default_rng(tile)
    d, k = rng.standard_normal(tile + 2), rng.standard_normal(3)
    np.testing.assert_allclose(a.T @ ((g @ k) * (b.T @ d)), np.correlate(d, k, "valid"), rtol=1e-12, atol=1e-12)


def test_only_the_implemented_tiles():
    with pytest.raises(ValueError, match=r"F\(3x3, 3x3\) is not implemented"):
        winograd.matrices(3)


def _kernel(cin=256, cout=256, hw=8):
    from tvmfuse.passes.lower import make_kernel

    model, feeds = conv_model(cin, cout, hw, 3, 1, 1)
    fn, _ = partition_call(model)
    data = [i for i, p in enumerate(fn.params) if p.ty.shape is not None and len(p.ty.shape) == 4][0]
    kernel, _ = make_kernel(fn, targets.resolve(HOST), schedule=False, blocks={data: 8})
    return kernel


@pytest.mark.parametrize("cin,tile", [(256, 4), (512, 2)])  # 512 channels: F(4x4)'s weights too large
def test_schedule_structure(cin, tile):
    """Constants folded (no transform-matrix stage left), each stage parallel and vectorized over channels;
    the input read one zero-padded window column at a time; each transform in two unrolled stages (rows, then
    columns) of sums, differences and multiplications by the matrix's entries other than 0 and +-1, never by a
    zero; the output's m x m pixels of a tile kept in registers for the epilogue (bias and ReLU here), applied to
    them under the same tile loop in a loop of its own (not unrolled with them: one copy of its code)."""
    kernel = _kernel(cin, cin)
    assert f"F({tile}x{tile}" in str(kernel.attrs["tvmfuse.layout"])
    s = Structure(conv2d_winograd.apply(kernel, 8))
    assert not {"A", "B"} & set(s.blocks), s.blocks
    # the window's zero-padded column copied under the tile and column loops, then transformed from the copy
    assert s.shared_loops("pad_temp", winograd.INPUT_ROWS) == 2
    assert s.compacted_alloc()["pad_temp"][1] == [1, 1, tile + 2, 1, 8]
    pad_kinds = [loop.kind for loop in s.loops["pad_temp"] if loop.extent > 1]
    assert pad_kinds == [ForKind.PARALLEL, ForKind.UNROLLED, ForKind.UNROLLED, ForKind.VECTORIZED], pad_kinds
    epilogue = list(s.blocks)[-1]
    stages = (winograd.INPUT_ROWS, winograd.INPUT, winograd.PRODUCT + "_update", winograd.OUTPUT_ROWS,
              winograd.ANCHOR, epilogue)
    for block in stages:
        kinds = [loop.kind for loop in s.loops[block]]
        assert ForKind.PARALLEL in kinds and kinds[-1] == ForKind.VECTORIZED, (block, kinds)
    for block in (winograd.INPUT_ROWS, winograd.INPUT, winograd.OUTPUT_ROWS, winograd.ANCHOR):
        inner = [loop.kind for loop in s.loops[block] if loop.extent > 1]
        assert inner[-3:] == [ForKind.UNROLLED] * 2 + [ForKind.VECTORIZED], (block, inner)
    assert s.shared_loops(winograd.INPUT_ROWS, winograd.INPUT) == 1  # a tile's rows computed under its loop
    assert s.shared_loops(winograd.OUTPUT_ROWS, winograd.ANCHOR) == 2
    assert s.shared_loops(winograd.ANCHOR, epilogue) == 2 and ForKind.UNROLLED not in {
        loop.kind for loop in s.loops[epilogue]}
    assert s.alloc[winograd.ANCHOR + "_local"][0] == "local"
    a, b, _ = winograd.matrices(tile)
    for block, matrix in ((winograd.INPUT_ROWS, b), (winograd.INPUT, b), (winograd.OUTPUT_ROWS, a),
                          (winograd.ANCHOR, a)):
        ops = collections.Counter()
        _float_ops(s.sch.get(s.blocks[block]).body.value, ops)
        # each column's sum once (the Select over the unrolled index folds): one add or subtract per nonzero
        # entry after the first, one multiplication per entry other than 0 and +-1
        assert ops["Mul"] == np.count_nonzero(np.abs(matrix) > 1), (block, ops)
        assert ops["Add"] + ops["Sub"] == np.count_nonzero(matrix) - matrix.shape[1], (block, ops)


@pytest.mark.parametrize("which,tile,k", [("B", t, e) for t in winograd.TILES for e in range(t + 2)]
                         + [("A", t, y) for t in winograd.TILES for y in range(t)])
def test_a_transform_is_the_matrix_transposed_times_the_values(which, tile, k):
    a, b, _ = winograd.matrices(tile)
    matrix = {"A": a, "B": b}[which]
    numbers = [3.0, -5.0, 7.5, 11.0, 0.25, -2.0][:tile + 2]
    values = [tvm.tirx.FloatImm("float64", v) for v in numbers]
    got = tvm.sym.Analyzer().simplify(winograd.transform(matrix, tvm.tirx.IntImm("int32", k), values.__getitem__))
    assert float(got.value) == float(matrix[:, k] @ numbers)


def test_a_transform_takes_only_integer_entries():
    _, b, _ = winograd.matrices(2)
    values = [tvm.tirx.FloatImm("float64", 1.0)] * 4
    for bad in (b * 0.5, -b):  # halves; a column with no positive entry
        with pytest.raises(ValueError, match="integers, and a positive entry"):
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
