"""Blocked NCHW[b]c kernels (schedules/computes/blocked.py, x86 conv2d_nchwc / depthwise_nchwc) and the layout plan
of LowerPartitions: each kernel against onnxruntime over a grid of shapes, weight packing, where layout
transforms appear, and whole models in both layouts."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import targets
from tvmfuse.passes.lower import make_kernel
from tvmfuse.schedules.computes import blocked, packing
from tvmfuse.schedules.x86 import conv2d_nchwc, depthwise_nchwc

from helpers import HOST, ort_run
from helpers import make_model
from helpers.blocked import conv_model, partition_call, run_blocked
from helpers.layout import transforms
from helpers.schedules import Structure

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32


CONV_GRID = [
    # cin, cout, hw, k, stride, pad, dilation
    (8, 32, 14, 3, 1, 1, 1),  # (from 16 channels (AVX-512) or 32 (AVX2) a 3x3 stride-1 conv is Winograd)
    (8, 24, 9, 3, 2, 1, 1),  # 24 output channels: 8-channel blocks, odd input size, stride 2
    (24, 16, 13, 1, 1, 0, 1),
    (16, 16, 12, 3, 1, 2, 2),  # dilation 2, padding 2
    (8, 64, 7, 3, 1, 1, 1),
    (16, 8, 3, 3, 1, 0, 1),  # 1x1 output
    (64, 32, 11, 5, 2, 2, 1),
    (64, 128, 14, 1, 2, 0, 1),  # 1x1 stride 2 to a 7-wide map: 2x4 tiles with a predicated last pixel
    (16, 16, 15, 1, 2, 0, 1),  # 1x1 stride 2 from an odd size: the gathered input's last row and column
    (16, 16, 13, 1, 3, 0, 1),  # 1x1 stride 3
]


@pytest.mark.parametrize("cin,cout,hw,k,stride,pad,dilation", CONV_GRID)
def test_blocked_conv2d_matches_onnxruntime(cin, cout, hw, k, stride, pad, dilation):
    model, feeds = conv_model(cin, cout, hw, k, stride, pad, dilation)
    got, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_nchwc"
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin,hw,k,stride", [(3, 17, 7, 2), (3, 16, 3, 2), (5, 9, 3, 1)])
def test_blocked_conv2d_reads_plain_input(cin, hw, k, stride):
    # The stem: NCHW input (3 channels have no block) read directly, NCHW[b]c written.
    model, feeds = conv_model(cin, 16, hw, k, stride, k // 2)
    got, kernel = run_blocked(model, feeds, block_inputs=False)
    assert "OIHW1i" in str(kernel.attrs["tvmfuse.layout"])
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


DEPTHWISE_GRID = [
    # channels, hw, k, stride, pad, dilation
    (16, 14, 3, 1, 1, 1),
    (24, 13, 3, 2, 1, 1),
    (8, 11, 5, 2, 2, 1),
    (16, 12, 3, 1, 2, 2),  # dilation 2 (segmentation models)
    (32, 9, 7, 1, 3, 1),
    (16, 56, 3, 1, 1, 1),  # rows 56 wide: the border is read through bounds checks
    (16, 7, 3, 1, 1, 1),  # 7-wide 3x3: padded per output row
    (8, 3, 3, 1, 0, 1),  # 1x1 output
]


@pytest.mark.parametrize("c,hw,k,stride,pad,dilation", DEPTHWISE_GRID)
def test_blocked_depthwise_matches_onnxruntime(c, hw, k, stride, pad, dilation):
    model, feeds = conv_model(c, c, hw, k, stride, pad, dilation, group=c, act="Relu6")
    got, kernel = run_blocked(model, feeds)
    assert str(kernel.attrs["tvmfuse.family"]) == "depthwise_conv2d_nchwc"
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cin,cout,group,block", [(16, 32, 1, 16), (24, 48, 1, 16), (16, 40, 1, 8), (32, 32, 32, 16), (24, 24, 24, 8)])
def test_avx512_blocked_kernels_compute_correctly_on_this_host(cin, cout, group, block):
    """x86-avx512 kernels (16-channel blocks, 8 where the channels need it), built for this host (LLVM
    splits the 512-bit vectors), give the right numbers."""
    model, feeds = conv_model(cin, cout, 11, 3, 2, 1, group=group, seed=cin)
    got, kernel = run_blocked(model, feeds, spec=targets.resolve("x86-avx512"))
    assert str(kernel.attrs["tvmfuse.layout"]).startswith(f"NCHW{block}c")
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block_residual", [True, False])
def test_blocked_residual_add(block_residual):
    model, feeds = conv_model(16, 16, 10, 3, 1, 1, residual=True, seed=3)
    got, _ = run_blocked(model, feeds, block_inputs=block_residual)
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ["HardSwish", "Relu6", "LeakyRelu"])
def test_blocked_activations(act):
    model, feeds = conv_model(8, 16, 9, 3, 1, 1, act=act, seed=4)
    fn, _ = partition_call(model)
    assert "conv2d" in str(fn) and act.lower().replace("6", "") in str(fn).replace("clip", "relu").replace("_", "")
    got, _ = run_blocked(model, feeds)
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_weight_packing_round_trips():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 24, 3, 3)).astype("float32")
    layout = packing.KernelLayout({1: ("conv", 8, 16)}, {}, 16)
    packed = layout.pack(1, w)
    assert packed.shape == (2, 3, 3, 3, 8, 16)
    assert packed[1, 2, 0, 1, 3, 5] == w[16 + 5, 2 * 8 + 3, 0, 1]
    np.testing.assert_array_equal(packing.unpack_conv_weight(packed), w)
    dw = rng.standard_normal((16, 1, 5, 5)).astype("float32")
    layout = packing.KernelLayout({0: ("depthwise", 8)}, {}, 8)
    x5 = rng.standard_normal((1, 2, 4, 4, 8)).astype("float32")
    plain = layout.plain([layout.pack(0, dw), x5])
    np.testing.assert_array_equal(plain[0], dw)
    np.testing.assert_array_equal(plain[1][0, 9], x5[0, 1, :, :, 1])
    dn = rng.standard_normal((24, 96)).astype("float32")  # a dense's [K, N] weight, panels of 32 columns
    layout = packing.KernelLayout({1: ("panels", 32)})
    packed = layout.pack(1, dn)
    assert packed.shape == tuple(layout.shape(1, [24, 96])) == (3, 24, 32) and packed.flags.c_contiguous
    assert packed[2, 5, 7] == dn[5, 2 * 32 + 7]
    np.testing.assert_array_equal(layout.plain([None, packed, None])[1], dn)


def test_block_for_picks_whole_vectors_then_eight():
    assert blocked.block_for(32, 16) == 16 and blocked.block_for(24, 16) == 8 and blocked.block_for(24, 8) == 8
    assert blocked.block_for(12, 8) is None and blocked.block_for(3, 16) is None


def test_default_configs():
    # The most useful FMAs per load (a width that does not divide the row wastes its tail), then the most
    # accumulators, then the widest row (AVX2 budget: 8).
    assert conv2d_nchwc.default_config(8, 56, 8) == conv2d_nchwc.Config(2, 4)
    assert conv2d_nchwc.default_config(32, 14, 8) == conv2d_nchwc.Config(4, 2)
    assert conv2d_nchwc.default_config(64, 7, 8) == conv2d_nchwc.Config(2, 4)  # 7 of 8 pixels used
    assert conv2d_nchwc.default_config(5, 14, 8) == conv2d_nchwc.Config(1, 7)  # 5 blocks: a dividing tile wins
    assert conv2d_nchwc.default_config(3, 56, 8) == conv2d_nchwc.Config(3, 2)
    assert depthwise_nchwc.default_config(56, 112, 3) == depthwise_nchwc.Config(7, "inline")
    assert depthwise_nchwc.default_config(14, 14, 3) == depthwise_nchwc.Config(7, "channel")
    assert depthwise_nchwc.default_config(7, 7, 3) == depthwise_nchwc.Config(7, "row")
    assert depthwise_nchwc.default_config(10, 10, 5) == depthwise_nchwc.Config(5, "channel")


@pytest.mark.parametrize("cin,k,dw", [(16, 5, False), (32, 3, True)])  # a 3x3 conv would be Winograd
def test_blocked_schedule_structure(cin, k, dw):
    model, feeds = conv_model(cin, cin, 14, k, 1, 1, group=cin if dw else 1)
    _, kernel = run_blocked(model, feeds)
    s = Structure(kernel)
    anchor = (depthwise_nchwc if dw else conv2d_nchwc).ANCHOR
    assert ForKind.PARALLEL in s.kinds()
    # The channel-block axis is the vector: innermost in the update and in the epilogue store.
    update, epilogue = s.loops[f"{anchor}_update"], s.loops[list(s.blocks)[-1]]
    assert update[-1].kind == ForKind.VECTORIZED and int(update[-1].extent) == LANES
    assert epilogue[-1].kind == ForKind.VECTORIZED and int(epilogue[-1].extent) == LANES
    assert not s.vectorized_not_innermost()
    assert any(scope == "local" for scope, _ in s.compacted_alloc().values())


@pytest.mark.parametrize("k,stride,pad,gathered", [(1, 2, 0, True), (1, 1, 0, False), (3, 2, 1, False),
                                                   (1, 2, 1, False)])
def test_strided_1x1_conv_runs_stride_1_on_a_gathered_input(k, stride, pad, gathered):
    """A strided 1x1 conv without padding reads a parallel, vectorized gather of the pixels it uses."""
    model, feeds = conv_model(16, 16, 14, k, stride, pad)
    got, kernel = run_blocked(model, feeds)
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    s = Structure(kernel)
    assert (blocked.SUBSAMPLE in s.blocks) == gathered
    if gathered:
        loops = s.loops[blocked.SUBSAMPLE]
        assert loops[0].kind == ForKind.PARALLEL and loops[-1].kind == ForKind.VECTORIZED


# ------------------------------------------------------------------------------------------ the layout plan


def _chain(c=16, residual=True, pool=True):
    """x -> conv 3x3 -> depthwise 3x3 -> conv 1x1 (+ x residual) -> [global pool]: one NCHW boundary."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def conv(name, src, cin, cout, k, group=1):
        w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype("float32")
        inits.extend([numpy_helper.from_array(w, f"W{name}"),
                      numpy_helper.from_array(rng.standard_normal(cout).astype("float32"), f"B{name}")])
        nodes.append(helper.make_node("Conv", [src, f"W{name}", f"B{name}"], [f"c{name}"], kernel_shape=[k, k],
                                      pads=[k // 2] * 4, group=group))
        nodes.append(helper.make_node("Relu", [f"c{name}"], [f"a{name}"]))
        return f"a{name}"

    a = conv("0", "x", 3, c, 3)
    b = conv("1", a, c, c, 3, group=c)
    w = (rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype("float32")
    inits.append(numpy_helper.from_array(w, "W2"))
    nodes.append(helper.make_node("Conv", [b, "W2"], ["c2"]))
    last = "c2"
    if residual:
        nodes.append(helper.make_node("Add", ["c2", a], ["s2"]))
        last = "s2"
    if pool:
        nodes.append(helper.make_node("GlobalAveragePool", [last], ["y"]))
    else:
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    return make_model(nodes, [("x", [1, 3, 12, 12])], [("y", None)], inits)


def _transforms(model, layout="blocked") -> dict:
    return transforms(model, SPEC, layout)


def test_layout_transforms_only_at_the_boundary():
    # Stem reads the plain input, the chain stays blocked, one transform back for the output ...
    assert _transforms(_chain(pool=False)) == {"to_blocked": 0, "to_plain": 1, "nchwc": 3}
    # ... and none before a global average pooling, which reads the blocked map (tests/schedules/test_blocked_pool.py).
    assert _transforms(_chain()) == {"to_blocked": 0, "to_plain": 0, "nchwc": 3}
    assert _transforms(_chain(), layout="nchw") == {"to_blocked": 0, "to_plain": 0, "nchwc": 0}


def test_channels_without_a_block_stay_nchw():
    counts = _transforms(_chain(c=12))
    assert counts["nchwc"] == 0 and counts["to_plain"] == 0


@pytest.mark.parametrize("pool", [True, False])
@pytest.mark.parametrize("layout", ["blocked", "nchw"])
def test_chain_matches_onnxruntime_in_both_layouts(pool, layout):
    model = _chain(pool=pool)
    x = np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False, layout=layout)
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert cm.manifest()["layout"] == layout
    checks = cm.opcheck({"x": x})  # blocked kernels unpacked back to NCHW for the reference
    assert len(checks) == 3


def test_unknown_layout_is_refused():
    with pytest.raises(tvmfuse.errors.InputError, match="layout 'nhwc'"):
        tvmfuse.compile(_chain(), target=HOST, logs=False, layout="nhwc")


@pytest.mark.parametrize("row_block", [1, 2, 14])
def test_conv_row_block_moves_the_parallel_axis_and_keeps_the_numbers(row_block):
    model, feeds = conv_model(16, 16, 14, 3, 1, 2, 2, seed=5)  # dilated: not Winograd
    fn, args = partition_call(model)
    kernel, layout = make_kernel(fn, SPEC, schedule=False, blocks={0: blocked.block_for(16, LANES)})
    config = conv2d_nchwc.Config(2 if LANES == 8 else 1, 7, 1, row_block)
    scheduled = conv2d_nchwc.apply(kernel, LANES, config)
    s = Structure(scheduled)
    parallel = [loop for loop in s.loops[f"{conv2d_nchwc.ANCHOR}_update"] if loop.kind == ForKind.PARALLEL]
    # (n, channel-block tiles, row blocks) fused: fewer, larger parallel tasks as row_block grows.
    assert len(parallel) == 1 and int(parallel[0].extent) == (16 // LANES // config.oc_vectors) * (14 // row_block)
    x = feeds["x"].reshape(1, 16 // LANES, LANES, 14, 14).transpose(0, 1, 3, 4, 2)
    arrays = [x, layout.pack(1, args[1]), args[2]]
    out = tvm.runtime.tensor(np.zeros([int(d) for d in scheduled.params[-1].ty.shape], "float32"))
    lib = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    lib["main"](*[tvm.runtime.tensor(np.array(a, order="C")) for a in arrays], out)
    got = layout.plain(arrays + [out.numpy()])[-1]
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
