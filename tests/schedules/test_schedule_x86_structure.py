"""x86 schedule rules: loop structure of each rule, rules refusing other families, and the generic fallback.

Kernels are made the way LowerPartitions makes them (see schedule_helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse.schedules import families, x86
from tvmfuse.schedules.common import block_names
from tvmfuse.schedules.computes.packing import pack_weight
from tvmfuse.schedules.computes.partition import partition_compute
from tvmfuse.schedules.x86 import conv2d, dense, depthwise_conv2d, fused

from helpers import HOST, ort_run

AVX2 = 8  # float32 lanes
AVX512 = 16


from helpers.schedules import *  # noqa: F401,F403  (fixtures and helpers shared by both schedule test files)


@pytest.mark.parametrize("cfg", [conv2d.Config("oc", 16, 7), conv2d.Config("oc", 8, 7, 2),
                                 conv2d.Config("ow", 8, 7), conv2d.Config("ow", 4, 14, 4)],
                         ids=lambda c: f"{c.kind}{c.oc_block}x{c.ow_block}u{c.ic_unroll}")
def test_conv2d_structure(conv_fn, cfg):
    pc = partition_compute(conv_fn, cfg.oc_block)
    assert pc.family == "conv2d" and pc.packed == {1: cfg.oc_block}
    func = pc.prim_func()
    out = conv2d.apply(func, AVX2, cfg)
    assert out is not None
    s = _check_tiled(out, func, "conv2d_nchw", cfg.oc_block * cfg.ow_block, global_allowed=("pad_temp",))
    update = s.loops["conv2d_nchw_update"]
    # the innermost loop of the micro-kernel is the vector: channels for "oc", pixels for "ow"
    assert update[-1].kind == ForKind.VECTORIZED
    assert int(update[-1].extent) == (cfg.oc_block if cfg.kind == "oc" else cfg.ow_block)
    assert update[-2].kind == ForKind.UNROLLED and update[-3].kind == ForKind.UNROLLED
    assert int(update[-3].extent) == cfg.ic_unroll
    assert s.loops["pad_temp"][0].kind == ForKind.PARALLEL
    # The register tile's vectors are contiguous in the accumulator: channels innermost for "oc" (in NCHW
    # order LLVM kept the strided tile in memory on AVX-512: 22x slower), pixels for "ow".
    sch = s_tir.Schedule(out)
    acc = sch.get(sch.get_sblock("conv2d_nchw_update")).writes[0].source
    assert acc.scope() == "local" and int(acc.shape[-1]) == (32 if cfg.kind == "oc" else 14)


def test_conv2d_default_config_accepts_its_own_packing(conv_fn):
    ob = x86.weight_block(conv_fn, 256)
    assert ob == conv2d.default_config(32, 14, AVX2, 16, 3).oc_block == 8
    func = partition_compute(conv_fn, ob).prim_func()
    out = conv2d.apply(func, AVX2)
    assert out is not None
    _check_tiled(out, func, "conv2d_nchw", 8 * 7, global_allowed=("pad_temp",))


def test_conv2d_unpacked_weight_uses_ow_kernel(conv_fn):
    func = partition_compute(conv_fn).prim_func()
    assert len(func.params[1].ty.shape) == 4
    out = conv2d.apply(func, AVX2)
    cfg = conv2d.default_config(32, 14, AVX2, 16, 3, packed=False)
    assert cfg.kind == "ow"
    s = _check_tiled(out, func, "conv2d_nchw", cfg.oc_block * cfg.ow_block, global_allowed=("pad_temp",))
    assert int(s.loops["conv2d_nchw_update"][-1].extent) == cfg.ow_block


@pytest.mark.parametrize("pad_at", ["row", "channel"])
def test_depthwise_structure(dw_fn, pad_at):
    pc = partition_compute(dw_fn)
    assert pc.family == "depthwise_conv2d"
    func = pc.prim_func()
    cfg = depthwise_conv2d.Config(7, pad_at)
    out = depthwise_conv2d.apply(func, AVX2, cfg)
    assert out is not None
    s = _check_tiled(out, func, "DepthwiseConv2d", 7, global_allowed=("PaddedInput",))
    # the padded plane is built per channel (inside the parallel channel loop) or per output row
    pad_loops = s.loops["PaddedInput"]
    assert pad_loops[0].kind == ForKind.PARALLEL and pad_loops[-1].kind == ForKind.VECTORIZED
    assert s.shared_loops("PaddedInput", "DepthwiseConv2d_update") == (1 if pad_at == "channel" else 2)
    padded = Structure(out).compacted_alloc()["PaddedInput"][1]
    # 28x28 input padded to 30x30, of which stride 2 k3 reads 29x29; one output row reads 3 input rows
    assert padded == ([1, 1, 29, 29] if pad_at == "channel" else [1, 1, 3, 29])
    # kernel window unrolled, pixels vectorized
    update = s.loops["DepthwiseConv2d_update"]
    assert [l.kind for l in update[-3:]] == [ForKind.UNROLLED, ForKind.UNROLLED, ForKind.VECTORIZED]


def test_depthwise_default_config_structure(dw_fn):
    func = partition_compute(dw_fn).prim_func()
    out = depthwise_conv2d.apply(func, AVX2)
    # stride 2, k3, 14 wide output -> the whole row, padded per output row
    assert depthwise_conv2d.default_config(14, AVX2, 3, 2) == depthwise_conv2d.Config(14, "row")
    s = _check_tiled(out, func, "DepthwiseConv2d", 14, global_allowed=("PaddedInput",))
    assert s.shared_loops("PaddedInput", "DepthwiseConv2d_update") == 2


@pytest.mark.parametrize("k,hw,out_w", [(3, 55, 28), (5, 15, 7)])
def test_depthwise_stride2_reads_phase_split(k, hw, out_w):
    """Stride 2 (3x3 from 28-wide outputs, 5x5 always): each tap reads an even/odd column split of the input."""
    model, w, b = _conv_model(8, 8, hw, k, stride=2, pad=1, group=8, seed=k)
    func = partition_compute(_partition_fn(model), lanes=1).prim_func()  # lanes: a CPU target (phase split)
    assert block_names(s_tir.Schedule(func))[:3] == ["PaddedInput", "PhaseSplit", "DepthwiseConv2d"]
    cfg = depthwise_conv2d.default_config(out_w, AVX2, k, 2, phase_split=True)
    assert cfg.pad_at == "channel" and cfg.ow_block > 1
    out = depthwise_conv2d.apply(func, AVX2)
    s = _check_tiled(out, func, "DepthwiseConv2d", cfg.ow_block, global_allowed=("PaddedInput", "PhaseSplit"))
    # the taps read the split only; padding and split are built per channel plane before them
    reads = {r.source.name for r in s.sch.get(s.blocks["DepthwiseConv2d_update"]).reads}
    assert "PhaseSplit" in reads and "PaddedInput" not in reads
    assert s.shared_loops("PaddedInput", "DepthwiseConv2d_update") == 1
    assert s.shared_loops("PhaseSplit", "DepthwiseConv2d_update") == 1
    # phase innermost and unrolled (LLVM turns the row into loads + shuffles); the window unrolled
    phase = s.loops["PhaseSplit"][-1]
    assert phase.kind == ForKind.UNROLLED and int(phase.extent) == 2
    update = s.loops["DepthwiseConv2d_update"]
    assert [l.kind for l in update[-3:]] == [ForKind.UNROLLED, ForKind.UNROLLED, ForKind.VECTORIZED]
    half = out_w + k // 2  # phase columns: x + rx // 2 for x < out_w, rx < k
    assert Structure(out).compacted_alloc()["PhaseSplit"][1] == [1, 1, hw + 2, 2, half]
    x = np.random.default_rng(k).standard_normal((1, 8, hw, hw)).astype("float32")
    ref = _ref_depthwise_relu(x, w, b, 2, 1)
    np.testing.assert_allclose(_run(out, x, w, b.reshape(1, -1, 1, 1)), ref, rtol=1e-5, atol=1e-5)


def test_depthwise_stride2_narrow_3x3_reads_input_directly(dw_fn):
    """A 3x3 window over 14-wide outputs keeps the direct stride-2 read (the split did not pay there)."""
    func = partition_compute(dw_fn).prim_func()
    assert "PhaseSplit" not in block_names(s_tir.Schedule(func))
    assert depthwise_conv2d.default_config(14, AVX2, 3, 2) == depthwise_conv2d.Config(14, "row")


@pytest.mark.parametrize("cfg", [dense.Config(16, 4), dense.Config(48, 2), dense.Config(8, 1), dense.Config(16, 4, 2)],
                         ids=lambda c: f"n{c.n_block}k{c.k_unroll}m{c.m_block}")
def test_dense_structure(dense_fn, cfg):
    pc = partition_compute(dense_fn)
    assert pc.family == "dense"
    func = pc.prim_func()
    rows = 2  # dense_fn: [2, 64] x [64, 48]
    out = dense.apply(func, AVX2, cfg)
    assert out is not None
    s = _check_tiled(out, func, "T_matmul_NN", cfg.n_block * cfg.m_block, parallel=False)
    update = s.loops["T_matmul_NN_update"]
    # one task per (column panel, row tile), run on one core (2 x 64 x 48 is below the parallel work);
    # inside: K, K unrolled, rows unrolled, columns
    assert update[0].kind == ForKind.SERIAL and rows * 64 * 48 < dense.PARALLEL_MACS
    assert int(update[0].extent) == (48 // cfg.n_block) * (rows // cfg.m_block)
    # columns: whole AVX2 vectors (8 lanes), unrolled
    assert update[-1].kind == ForKind.VECTORIZED and int(update[-1].extent) == AVX2
    assert update[-2].kind == ForKind.UNROLLED and int(update[-2].extent) == cfg.n_block // AVX2
    assert update[-3].kind == ForKind.UNROLLED and int(update[-3].extent) == cfg.m_block
    assert update[-4].kind == ForKind.UNROLLED and int(update[-4].extent) == cfg.k_unroll


def test_rules_return_none_for_other_families(conv_fn, dense_fn, dw_fn):
    conv = partition_compute(conv_fn, 8).prim_func()
    conv_unpacked = partition_compute(conv_fn).prim_func()
    dns = partition_compute(dense_fn).prim_func()
    dw = partition_compute(dw_fn).prim_func()
    grouped = partition_compute(_partition_fn(_conv_model(8, 8, 7, 3, pad=1, group=2)[0])).prim_func()
    for lanes in (AVX2, AVX512):
        assert conv2d.apply(dns, lanes) is None
        assert conv2d.apply(dw, lanes) is None
        assert conv2d.apply(grouped, lanes) is None
        assert dense.apply(conv, lanes) is None
        assert dense.apply(dw, lanes) is None
        assert dense.apply(grouped, lanes) is None
        assert depthwise_conv2d.apply(conv, lanes) is None
        assert depthwise_conv2d.apply(conv_unpacked, lanes) is None
        assert depthwise_conv2d.apply(dns, lanes) is None
        assert depthwise_conv2d.apply(grouped, lanes) is None
    assert fused.schedule_fused(dns, "conv2d") is None
    assert fused.schedule_fused(conv, "no_such_family") is None


@pytest.mark.parametrize("oc_block,kind", [(16, "oc"), (4, "ow")])
def test_conv2d_packed_for_another_tile(conv_fn, oc_block, kind):
    """A weight packed for another channel tile than the default (8 here): the default tile follows the packing
    (channel vectors when the block is whole vectors, pixel vectors otherwise); an explicit config for another
    tile is not this rule's kernel."""
    func = partition_compute(conv_fn, oc_block).prim_func()
    assert conv2d.default_config(32, 14, AVX2, 16, 3).oc_block == 8
    assert conv2d.apply(func, AVX2, conv2d.Config("oc", 8, 7)) is None
    out = conv2d.apply(func, AVX2)
    assert out is not None
    s = Structure(out)
    update = s.loops["conv2d_nchw_update"]
    assert update[-1].kind == ForKind.VECTORIZED and ForKind.PARALLEL in s.kinds()
    if kind == "oc":
        assert int(update[-1].extent) == oc_block
    else:
        assert int(update[-2].extent) == oc_block and update[-2].kind == ForKind.UNROLLED
    assert not s.vectorized_not_innermost()
    _, w, b = _conv_model(16, 32, 14, 3, pad=1)  # the weights CONV_K3 was built with
    x = np.random.default_rng(5).standard_normal((1, 16, 14, 14)).astype("float32")
    np.testing.assert_allclose(_run(out, x, pack_weight(w, oc_block), b.reshape(1, -1, 1, 1)),
                               _ref_conv_relu(x, w, b, 1, 1), rtol=1e-4, atol=1e-4)
    # the dispatcher never fails on it
    assert ForKind.PARALLEL in Structure(x86.schedule(func, "conv2d", 256)).kinds()


def test_dispatcher_uses_the_family_rule(conv_fn, dense_fn, dw_fn):
    for fn, family, rule, oc_block in ((conv_fn, "conv2d", conv2d.apply, 8), (dense_fn, "dense", dense.apply, None),
                                       (dw_fn, "depthwise_conv2d", depthwise_conv2d.apply, None)):
        func = partition_compute(fn, oc_block).prim_func()
        tvm.ir.assert_structural_equal(x86.schedule(func, family, 256), rule(func, AVX2))
    assert set(x86.RULES) == {"conv2d", "depthwise_conv2d", "dense", "batch_matmul", "conv2d_nchwc", "conv2d_winograd",
                              "int8_conv2d", "int8_depthwise_conv2d", "int8_dense", "depthwise_conv2d_nchwc", "group_conv2d_nchwc", "layout_transform", "pool2d_nchwc",
                              "softmax", "layer_norm", "layer_norm_channels", "codes_gate", "codes_mean",
                              "codes_concat"}


# ----------------------------------------------------------------------------------------------- 6. generic fallback


def test_grouped_conv_uses_generic_schedule():
    # 2 channels per group: the NCHW grouped kernel (groups of 4 or 8 run blocked, see test_narrow_groups.py)
    model, w, b = _conv_model(8, 8, 9, 3, pad=1, group=4, seed=7)
    cm = tvmfuse.compile(model, target=HOST)
    kernels = {gv.name_hint: f for gv, f in cm.lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.family" in f.attrs}
    assert len(kernels) == 1
    (name, kernel), = kernels.items()
    assert str(kernel.attrs["tvmfuse.family"]) == "group_conv2d"
    assert "group_conv2d" not in x86.RULES
    s = Structure(kernel)
    assert ForKind.PARALLEL in s.kinds()
    # the epilogue runs per output channel, right after that channel's accumulation
    anchor = families.GROUP_CONV2D.anchor_block
    epilogue = [n for n in s.blocks if n not in (anchor, "pad_temp")]
    assert len(epilogue) == 1 and s.shared_loops(anchor, epilogue[0]) == 1
    # it is exactly what the generic schedule makes of the unscheduled kernel
    pc = partition_compute(cm.record.kernels[name][0], lanes=cm.target.backend().vector_lanes())
    expected = fused.schedule_fused(pc.prim_func(), "group_conv2d")
    bare = kernel
    for key in [str(k) for k in kernel.attrs.keys() if k not in expected.attrs]:  # tvmfuse.* / op_pattern
        bare = bare.without_attr(key)
    tvm.ir.assert_structural_equal(bare, expected)
    x = np.random.default_rng(7).standard_normal((1, 8, 9, 9)).astype("float32")
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
