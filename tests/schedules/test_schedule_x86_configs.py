"""x86 schedule rules: pinned default configs, 1-wide tiles, packed weights and AVX-512 code generation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tvm import s_tir
from tvm.tirx import ForKind

from tvmfuse import targets
from tvmfuse.passes.lower import make_kernel
from tvmfuse.schedules import x86
from tvmfuse.schedules.common import block_names, largest_divisor
from tvmfuse.schedules.computes.packing import pack_weight, unpack_weight
from tvmfuse.schedules.computes.partition import partition_compute
from tvmfuse.schedules.x86 import conv2d, dense, depthwise_conv2d

from helpers import HOST

AVX2 = 8  # float32 lanes
AVX512 = 16


from helpers.schedules import *  # noqa: F401,F403  (fixtures and helpers shared by both schedule test files)


# ----------------------------------------------------------------------------------------------- 2. default configs

C = conv2d.Config
CONV_DEFAULTS = [
    # (out_channels, out_width, lanes, in_channels, kernel, packed) -> Config
    ((64, 56, AVX2, 64, 3, True), C("oc", 16, 4, 1)),   # ResNet-50 stage 1: 16 ch x 4 px
    ((256, 14, AVX2, 256, 3, True), C("oc", 8, 7, 1)),  # 14-wide maps: 8 ch x 7 px
    ((512, 7, AVX2, 512, 3, True), C("oc", 8, 7, 1)),
    ((128, 28, AVX2, 128, 3, True), C("oc", 16, 4, 1)),
    ((384, 14, AVX2, 64, 1, True), C("oc", 32, 2, 4)),  # short 1x1 reduction: 4 weight vectors x 2 px
    ((384, 7, AVX2, 64, 1, True), C("oc", 8, 7, 4)),    # 7 has no 2-px tile: back to 8 x 7
    ((256, 56, AVX2, 256, 1, True), C("oc", 16, 4, 4)),  # long 1x1 reduction: no 32-wide kernel
    ((64, 56, AVX2, 3, 1, True), C("oc", 32, 2, 1)),   # 3 input channels: no ic unroll
    ((512, 1, AVX2, 512, 1, True), C("oc", 16, 1, 4)),  # 1-pixel output row
    ((16, 13, AVX2, 8, 3, True), C("ow", 8, 1, 1)),     # 13 px: 1-wide oc tiles rejected -> ow kernel
    ((5, 13, AVX2, 3, 3, True), C("ow", 1, 1, 1)),      # prime channels and width: unit tile
    ((5, 56, AVX2, 3, 3, True), C("ow", 1, 8, 1)),
    ((12, 56, AVX2, 3, 3, True), C("ow", 4, 8, 1)),
    ((64, 56, AVX2, 64, 3, False), C("ow", 8, 8, 1)),   # unpacked weight: pixel vectors
    ((64, 14, AVX2, 64, 1, False), C("ow", 8, 7, 4)),
    ((64, 56, AVX512, 64, 3, True), C("oc", 32, 8, 1)),
    ((256, 14, AVX512, 256, 3, True), C("oc", 32, 7, 1)),
    ((512, 7, AVX512, 512, 3, True), C("oc", 32, 7, 1)),
    ((384, 14, AVX512, 64, 1, True), C("oc", 64, 2, 4)),
    ((64, 56, AVX512, 64, 3, False), C("ow", 16, 8, 1)),
    # ShuffleNet's 58 and 116 channels: the largest divisor within 29 accumulators on AVX-512, not a power of 2
    ((58, 56, AVX512, 24, 1, True), C("ow", 29, 8, 4)), ((116, 28, AVX512, 116, 1, True), C("ow", 29, 14, 4)),
    ((58, 56, AVX2, 24, 1, True), C("ow", 2, 8, 4)),
]


@pytest.mark.parametrize("args,expected", CONV_DEFAULTS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple)
                         else None)
def test_conv2d_default_config(args, expected):
    out_channels, out_width, lanes, in_channels, kernel, packed = args
    cfg = conv2d.default_config(out_channels, out_width, lanes, in_channels, kernel, packed=packed)
    assert cfg == expected
    assert out_channels % cfg.oc_block == 0 and out_width % cfg.ow_block == 0
    if packed:
        assert conv2d.weight_block(out_channels, out_width, lanes, in_channels, kernel) == cfg.oc_block


def test_conv2d_avx512_channel_blocks_are_vector_multiples():
    for oc in (32, 64, 128, 256, 384, 512, 1024):
        for width in (1, 7, 14, 28, 56, 112):
            for cin, k in ((64, 1), (256, 1), (64, 3), (3, 7)):
                cfg = conv2d.default_config(oc, width, AVX512, cin, k)
                assert cfg.kind == "oc" and cfg.oc_block % 16 == 0, (oc, width, cin, k, cfg)
                # within the AVX-512 accumulator budget (20 of 32 zmm)
                assert cfg.oc_block // 16 * cfg.ow_block <= 20


D = depthwise_conv2d.Config
DW_DEFAULTS = [
    # (out_width, lanes, kernel, stride) -> Config
    ((28, AVX2, 3, 2), D(28, "row")),
    ((14, AVX2, 3, 2), D(14, "row")),
    ((56, AVX2, 3, 2), D(8, "row")),
    ((56, AVX512, 3, 2), D(14, "row")),
    ((56, AVX2, 3, 1), D(8, "channel")),
    ((112, AVX2, 3, 1), D(8, "channel")),
    ((112, AVX512, 3, 1), D(16, "channel")),
    ((28, AVX2, 3, 1), D(4, "channel")),
    ((28, AVX2, 5, 1), D(28, "channel")),
    ((14, AVX2, 5, 2), D(14, "channel")),  # stride-2 5x5 keeps the per-channel plane
    ((7, AVX2, 3, 1), D(7, "channel")),
    ((31, AVX2, 3, 1), D(1, "channel")),  # prime width above 28: unit tile
    # phase-split input (stride 2): per channel plane, one vector per tile for 3x3, two for 5x5
    ((56, AVX2, 3, 2, True), D(8, "channel")),
    ((32, AVX2, 3, 2, True), D(8, "channel")),  # 28-wide output computed 32 wide
    ((56, AVX512, 3, 2, True), D(14, "channel")),
    ((32, AVX2, 5, 2, True), D(16, "channel")),
    ((8, AVX2, 5, 2, True), D(8, "channel")),
]


@pytest.mark.parametrize("args,expected", DW_DEFAULTS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple)
                         else None)
def test_depthwise_default_config(args, expected):
    assert depthwise_conv2d.default_config(*args) == expected


@pytest.mark.parametrize("args,expected", [
    # (n, k, lanes) -> up to 4 vectors of columns (any divisor, not a vector multiple), K unrolled by <= 4
    ((48, 64, AVX2), dense.Config(24, 8)), ((1024, 512, AVX2), dense.Config(32, 8)),
    ((1000, 1280, AVX2), dense.Config(40, 8)), ((1000, 1280, AVX512), dense.Config(50, 8)),
    ((37, 10, AVX2), dense.Config(1, 5)), ((10, 7, AVX2), dense.Config(10, 7))])
def test_dense_default_config(args, expected):
    assert dense.default_config(*args) == expected


@pytest.mark.parametrize("args,expected", [
    # (n, k, lanes, m) -> a K x n_block weight panel within 16 KB, as many rows as the accumulators hold
    ((18720, 120, AVX512, 40), dense.Config(32, 8, 10)),  # a recognizer's CTC head
    ((360, 120, AVX512, 40), dense.Config(8, 8, 20)), ((240, 120, AVX512, 40), dense.Config(16, 8, 20)),
    ((4096, 1024, AVX2, 6), dense.Config(8, 8, 6)), ((1000, 1280, AVX512, 1), dense.Config(50, 8, 1)),
    # A prime row count (an LSTM's 31 steps): two tiles of 16, the second one row short, not 31 tiles of 1
    ((384, 256, AVX512, 31), dense.Config(16, 8, 16)), ((384, 256, AVX2, 31), dense.Config(16, 8, 4)),
    ((288, 96, AVX512, 31), dense.Config(32, 8, 8)),
    # K = 1024: the tile's data rows stay within one L1d, 8 rows of 4 KB (ConvNeXt's 16 x 1024 x 256)
    ((256, 1024, AVX512, 16), dense.Config(16, 8, 8)), ((1024, 256, AVX512, 16), dense.Config(16, 8, 16))])
def test_dense_default_config_rows(args, expected):
    assert dense.default_config(*args) == expected


@pytest.mark.parametrize("m,k,n", [(40, 120, 96), (6, 24, 32), (31, 256, 384), (23, 40, 16)])
def test_dense_row_tile(m, k, n):
    model, w, b = _dense_model(m, k, n, seed=m)
    func, layout = make_kernel(_partition_fn(model), targets.resolve(HOST))
    cfg = dense.default_config(n, k, _host_lanes(), m)
    assert cfg.m_block > 1
    assert layout.weights == {1: ("panels", cfg.n_block)}  # the weight is read in panels of a tile's columns
    s = Structure(func)
    assert s.loops["T_matmul_NN_update"][-2].kind == ForKind.UNROLLED  # the rows of the register tile
    x = np.random.default_rng(3).standard_normal((m, k)).astype("float32")
    got = _run(func, x, layout.pack(1, w), b)
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n,parallel", [(1, 48, 192, False), (1, 48, 144, False), (31, 256, 384, True),
                                              (1, 1280, 1000, True)])
def test_dense_runs_on_one_core_below_its_parallel_work(m, k, n, parallel):
    # An LSTM's recurrent step ([1, 48] x [48, 192]) is ~1 us of work: launching both cores cost CRNN 4-6 %
    # end to end (Zen 4); a classifier or an input projection still splits over the cores.
    model, w, b = _dense_model(m, k, n, seed=k)
    func, layout = make_kernel(_partition_fn(model), targets.resolve(HOST))
    assert (m * k * n >= dense.PARALLEL_MACS) == parallel
    assert (ForKind.PARALLEL in Structure(func).kinds()) == parallel
    x = np.random.default_rng(4).standard_normal((m, k)).astype("float32")
    got = _run(func, x, layout.pack(1, w), b)
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,budget,expected", [(31, 20, 16), (31, 10, 8), (40, 10, 10), (40, 20, 20),
                                               (12, 20, 12), (37, 5, 5), (97, 20, 20), (30, 20, 15)])
def test_dense_row_block(m, budget, expected):
    assert dense.row_block(m, budget) == expected


def test_largest_divisor():
    assert largest_divisor(56, 8) == 8 and largest_divisor(14, 8) == 7 and largest_divisor(13, 8) == 1
    assert largest_divisor(56, 16, multiple_of=8) == 8 and largest_divisor(12, 16, multiple_of=8) == 1
    assert largest_divisor(7, 100) == 7


# ----------------------------------------------------------------------------------------------- 3. unit tiles


@pytest.mark.parametrize("cin,cout,hw,k,pad", [(3, 5, 13, 3, 1), (17, 17, 13, 1, 0), (5, 17, 13, 3, 1)],
                         ids=["c5w13k3", "c17w13k1", "c17w13k3"])
def test_conv2d_unit_tile(cin, cout, hw, k, pad):
    model, w, b = _conv_model(cin, cout, hw, k, pad=pad, seed=cout)
    fn = _partition_fn(model)
    lanes = _host_lanes()
    func, layout = make_kernel(fn, targets.resolve(HOST))
    cfg = conv2d.default_config(cout, hw, lanes, cin, k)
    assert layout.packed == {1: cfg.oc_block}
    s = Structure(func)
    assert ForKind.PARALLEL in s.kinds()
    assert not s.vectorized_not_innermost(), "a 1-wide tile must not vectorize the tile (reduction) loop"
    reduction = s.loops["conv2d_nchw_update"]
    assert all(l.kind != ForKind.VECTORIZED for l in reduction[:-1])
    x = np.random.default_rng(1).standard_normal((1, cin, hw, hw)).astype("float32")
    out = _run(func, x, pack_weight(w, cfg.oc_block), b.reshape(1, -1, 1, 1))
    np.testing.assert_allclose(out, _ref_conv_relu(x, w, b, 1, pad), rtol=1e-4, atol=1e-4)


# N prime and wider than 4 vectors on AVX2 and AVX-512 hosts alike: no tile divides it. The graph pipeline pads
# such weights (PadDenseColumns: 67 -> 80 columns); the rule's own fallback is checked without that pass.
@pytest.mark.parametrize("m,k,n", [(3, 10, 67), (1, 10, 67), (2, 12, 71)])
def test_dense_unit_tile(m, k, n):
    model, w, b = _dense_model(m, k, n, seed=n)
    assert int(_partition_fn(model).params[1].ty.shape[1]) == -(-n // 16) * 16
    func, layout = make_kernel(_partition_fn(model, skip=("PadDenseColumns",)), targets.resolve(HOST))
    assert dense.default_config(n, k, _host_lanes()).n_block == 1
    assert layout.weights == {1: ("panels", 1)}  # a column's K weights are contiguous
    s = Structure(func)
    assert ForKind.UNROLLED in s.kinds() and ForKind.PARALLEL not in s.kinds()  # the rule's tile, on one core
    assert not s.vectorized_not_innermost()
    assert all(l.kind != ForKind.VECTORIZED for l in s.loops["T_matmul_NN_update"][:-1])
    x = np.random.default_rng(2).standard_normal((m, k)).astype("float32")
    out = _run(func, x, layout.pack(1, w), b)
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_depthwise_unit_tile():
    model, w, b = _conv_model(5, 5, 31, 3, pad=1, group=5, seed=3)
    fn = _partition_fn(model)
    x = np.random.default_rng(3).standard_normal((1, 5, 31, 31)).astype("float32")
    ref = _ref_depthwise_relu(x, w, b, 1, 1)
    # rows of the true width (no lanes given to the compute): a 31-wide row gets 1-pixel tiles
    func = partition_compute(fn).prim_func()
    assert depthwise_conv2d.default_config(31, AVX2, 3, 1).ow_block == 1
    sched = depthwise_conv2d.apply(func, AVX2)
    s = Structure(sched)
    assert ForKind.PARALLEL in s.kinds() and not s.vectorized_not_innermost()
    assert all(l.kind != ForKind.VECTORIZED for l in s.loops["DepthwiseConv2d_update"][:-1])
    np.testing.assert_allclose(_run(sched, x, w, b.reshape(1, -1, 1, 1)), ref, rtol=1e-5, atol=1e-5)
    # the real flow computes the row in whole vectors (32 wide on AVX2) and crops it
    func, _ = make_kernel(fn, targets.resolve(HOST))
    assert not Structure(func).vectorized_not_innermost()
    np.testing.assert_allclose(_run(func, x, w, b.reshape(1, -1, 1, 1)), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epilogue", [True, False], ids=["bias_relu", "bare"])
@pytest.mark.parametrize("hw,stride,wide,ow_block", [(28, 2, 16, 16), (14, 1, 16, 16), (29, 1, 32, 8)])
def test_depthwise_whole_vector_rows(hw, stride, wide, ow_block, epilogue):
    """With ``lanes``, a row that is not whole vectors is computed ``wide`` and cropped in the epilogue."""
    model, w, b = _conv_model(8, 8, hw, 3, stride=stride, pad=1, group=8, seed=hw, epilogue=epilogue)
    fn = _partition_fn(model)
    pc = partition_compute(fn, lanes=AVX2)
    func = pc.prim_func()
    names = block_names(s_tir.Schedule(func))
    assert "DepthwiseCrop" in names
    out_w = (hw + 2 - 3) // stride + 1
    assert [int(d) for d in func.params[-1].ty.shape] == [1, 8, out_w, out_w]
    sched = depthwise_conv2d.apply(func, AVX2)
    assert sched is not None
    s = Structure(sched)
    # the crop is folded into the one stage that stores the output, right after the tile's accumulation
    assert set(s.blocks) == {"PaddedInput", "DepthwiseConv2d_init", "DepthwiseConv2d_update", names[-1]}
    assert "DepthwiseCrop" not in s.blocks or names[-1] == "DepthwiseCrop"
    update = s.loops["DepthwiseConv2d_update"]
    assert update[-1].kind == ForKind.VECTORIZED and int(update[-1].extent) == ow_block
    assert math.prod(int(l.extent) for l in update[:-3]) * ow_block == 8 * out_w * wide
    assert s.compacted_alloc()["DepthwiseConv2d_local"][1] == [1, 1, 1, ow_block]
    assert s.shared_loops("DepthwiseConv2d_update", names[-1]) >= 2 and not s.vectorized_not_innermost()
    x = np.random.default_rng(hw).standard_normal((1, 8, hw, hw)).astype("float32")
    args = (x, w, b.reshape(1, -1, 1, 1)) if epilogue else (x, w)
    ref = _ref_depthwise_relu(x, w, b, stride, 1) if epilogue else _ref_depthwise(x, w, stride, 1)
    np.testing.assert_allclose(_run(sched, *args), ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------- 4. packed weights


@pytest.mark.parametrize("oc_block", [1, 4, 8, 16])
def test_pack_unpack_roundtrip(oc_block):
    w = np.random.default_rng(oc_block).standard_normal((32, 5, 3, 2)).astype("float32")
    packed = pack_weight(w, oc_block)
    assert packed.shape == (32 // oc_block, 5, 3, 2, oc_block) and packed.flags.c_contiguous
    # one step's oc_block weights are contiguous: packed[b, i, y, x, :] == w[b*ob:(b+1)*ob, i, y, x]
    last = packed.shape[0] - 1
    np.testing.assert_array_equal(packed[last, 2, 1, 0], w[last * oc_block:(last + 1) * oc_block, 2, 1, 0])
    np.testing.assert_array_equal(unpack_weight(packed), w)


@pytest.mark.parametrize("kind", ["oc", "ow"])
@pytest.mark.parametrize("k,stride,pad", [(1, 1, 0), (1, 2, 0), (3, 1, 0), (3, 1, 1), (3, 2, 0), (3, 2, 1)],
                         ids=lambda v: str(v))
def test_packed_conv2d_matches_numpy(kind, k, stride, pad):
    cin, cout, hw = 8, 32, 11
    model, w, b = _conv_model(cin, cout, hw, k, stride=stride, pad=pad, seed=k * 10 + stride + pad)
    pc = partition_compute(_partition_fn(model), oc_block=16)
    assert pc.packed == {1: 16}
    func = pc.prim_func()
    assert [int(d) for d in func.params[1].ty.shape] == [2, cin, k, k, 16]
    out_w = (hw + 2 * pad - k) // stride + 1
    ow_block = largest_divisor(out_w, 4) if kind == "oc" else out_w
    cfg = conv2d.Config(kind, 16, ow_block, 4 if cin % 4 == 0 and k == 1 else 1)
    sched = conv2d.apply(func, AVX2, cfg)
    assert sched is not None
    x = np.random.default_rng(k + stride + pad).standard_normal((1, cin, hw, hw)).astype("float32")
    out = _run(sched, x, pack_weight(w, 16), b.reshape(1, -1, 1, 1))
    np.testing.assert_allclose(out, _ref_conv_relu(x, w, b, stride, pad), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------- 5. AVX-512 codegen


def test_avx512_conv2d_asm():
    spec = targets.resolve("x86-avx512")
    assert spec.vector_bits() == 512
    fn = _partition_fn(_conv_model(16, 32, 14, 3, pad=1)[0])
    ob = x86.weight_block(fn, 512)
    assert ob == 32
    func = partition_compute(fn, ob).prim_func()
    sched = conv2d.apply(func, AVX512)
    assert sched is not None
    s = Structure(sched)
    update = s.loops["conv2d_nchw_update"]
    assert update[-1].kind == ForKind.VECTORIZED and int(update[-1].extent) == 32
    asm = _build(sched, "x86-avx512").mod.inspect_source("asm")
    assert "zmm" in asm
    assert "vfmadd" in asm
    # nothing is run: this host may lack AVX-512


def test_avx512_plain_stem_keeps_its_accumulators_in_registers():
    """ResNeXt's stem (3 plain channels, 7x7 stride 2) at 4x6 accumulators spilled 98 zmm registers in its code
    and ran 543 against 345 us (Zen 4); a window over plain input gets at most 16 accumulators."""
    import re

    from tvmfuse.schedules.x86 import conv2d_nchwc

    assert conv2d_nchwc.default_config(4, 64, AVX512) == conv2d_nchwc.Config(4, 6)  # blocked input: 24
    assert conv2d_nchwc.default_config(4, 64, AVX512, plain_window=True) == conv2d_nchwc.Config(4, 4)
    fn = _partition_fn(_conv_model(3, 64, 128, 7, stride=2, pad=3)[0])
    func, _ = make_kernel(fn, targets.resolve("x86-avx512"), schedule=False, blocks={})
    sched = conv2d_nchwc.apply(func, AVX512)
    update = [b for b in block_names(s_tir.Schedule(sched)) if b.endswith("_update")]
    assert update and "p0" in [p.name for p in sched.params] and int(sched.params[0].ty.shape[1]) == 3
    asm = _build(sched, "x86-avx512").mod.inspect_source("asm")
    spills = [line for line in asm.splitlines() if re.search(r"zmm.*\(%rsp\)|\(%rsp\).*zmm", line)]
    # (zmm moves: its 16 accumulators stored to the runtime's workspace and loaded back, before the tile was
    # put on the stack, schedules/x86/stack_tiles.py; now one register spilled and reloaded)
    moves = [line for line in asm.splitlines() if re.search(r"vmovup[sd].*zmm", line)]
    assert "vfmadd" in asm and len(spills) <= 2 and len(moves) <= 4, (spills[:5], moves[:5])


def test_avx512_dense_asm():
    fn = _partition_fn(_dense_model(1, 64, 64)[0])
    func = partition_compute(fn).prim_func()
    sched = x86.schedule(func, "dense", 512)
    update = Structure(sched).loops["T_matmul_NN_update"]
    assert int(update[-1].extent) == 16 and int(update[-2].extent) == 4  # 64 columns: 4 unrolled zmm vectors
    asm = _build(sched, "x86-avx512").mod.inspect_source("asm")
    assert "zmm" in asm and "vfmadd" in asm


@pytest.mark.parametrize("cin,cout,hw,k,stride,pad,group,oc_block",
                         [(16, 32, 14, 3, 1, 1, 1, 32), (64, 128, 7, 1, 1, 0, 1, 32), (8, 24, 13, 3, 2, 1, 1, 24),
                          (16, 16, 33, 3, 1, 1, 16, None)],
                         ids=["oc32x7", "k1-oc32x7u4", "ow24x7-s2", "depthwise"])
def test_avx512_schedules_compute_correctly_on_this_host(cin, cout, hw, k, stride, pad, group, oc_block):
    """The AVX-512 tiles, compiled for the host (LLVM splits the 512-bit vectors), give the right numbers."""
    model, w, b = _conv_model(cin, cout, hw, k, stride=stride, pad=pad, group=group, seed=cout)
    func, layout = make_kernel(_partition_fn(model), targets.resolve("x86-avx512"))
    assert layout.packed == ({1: oc_block} if oc_block else {})
    x = np.random.default_rng(4).standard_normal((1, cin, hw, hw)).astype("float32")
    weight = pack_weight(w, layout.packed[1]) if layout.packed else w
    out = _run(func, x, weight, b.reshape(1, -1, 1, 1))
    ref = _ref_conv_relu(x, w, b, stride, pad) if group == 1 else _ref_depthwise_relu(x, w, b, stride, pad)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


