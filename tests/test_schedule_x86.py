"""x86 schedule rules (tvmfuse.schedules.x86): loop structure, pinned default configs, unit tiles, packed weights,
AVX-512 code generation and the generic fallback.

Kernels are made the way LowerPartitions makes them: a tiny ONNX graph is imported, canonicalized and partitioned,
and the partition function goes through ``partition_compute`` (optionally with a packed weight) and a rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import s_tir
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import frontend, targets
from tvmfuse.passes.lower import make_kernel
from tvmfuse.passes.partition import Partition, composites
from tvmfuse.passes.pipeline import canonicalize_passes
from tvmfuse.schedules import x86
from tvmfuse.schedules.common import block_names, largest_divisor
from tvmfuse.schedules.compute import ANCHOR_BLOCK, pack_weight, partition_compute, unpack_weight
from tvmfuse.schedules.x86 import conv2d, dense, depthwise_conv2d, fused

from conftest import HOST, ort_run
from helpers import make_model

AVX2 = 8  # float32 lanes
AVX512 = 16


# ----------------------------------------------------------------------------------------------- model helpers


def _conv_model(cin, cout, hw, k, stride=1, pad=0, group=1, seed=0, epilogue=True):
    """x[1, cin, hw, hw] -> Conv(bias) -> Relu (or a bare Conv with ``epilogue=False``), with its weights."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype("float32")
    b = rng.standard_normal(cout).astype("float32")
    conv_in = ["x", "W", "B"] if epilogue else ["x", "W"]
    nodes = [helper.make_node("Conv", conv_in, ["c" if epilogue else "y"], kernel_shape=[k, k],
                              strides=[stride] * 2, pads=[pad] * 4, group=group)]
    inits = [numpy_helper.from_array(w, "W")]
    if epilogue:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        inits.append(numpy_helper.from_array(b, "B"))
    model = make_model(nodes, [("x", [1, cin, hw, hw])], [("y", None)], inits)
    return model, w, b


def _dense_model(m, k, n, seed=0):
    """x[m, k] -> MatMul(W[k, n]) -> Add(B) -> Relu, with its weights."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["c"]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", [m, k])], [("y", None)],
                       [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    return model, w, b


def _partition_fn(model):
    """The single partition function of ``model`` (Relax, weights as parameters)."""
    mod = frontend.import_model(model).mod
    with targets.resolve(HOST).tvm_target(), tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(canonicalize_passes())(mod)
        mod = Partition()(mod)
    fns = list(composites(mod).values())
    assert len(fns) == 1, [str(f.attrs["Composite"]) for f in fns]
    return fns[0]


def _kernel(model, oc_block=None):
    """(unscheduled PrimFunc, PartitionCompute) of the model's partition."""
    pc = partition_compute(_partition_fn(model), oc_block)
    return pc.prim_func(), pc


def _host_lanes() -> int:
    return targets.resolve(HOST).vector_bits() // 32


def _build(func, target=HOST):
    spec = targets.resolve(target)
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=spec.tvm_target())


def _run(func, *arrays):
    """Run ``func`` (params: inputs..., output) on numpy inputs; returns the output."""
    lib = _build(func)
    out_shape = [int(d) for d in func.params[-1].ty.shape]
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(a, dtype="float32")) for a in arrays]
    out = tvm.runtime.tensor(np.zeros(out_shape, dtype="float32"))
    lib.mod["main"](*tensors, out)
    return out.numpy()


def _ref_conv_relu(x, w, b, stride, pad):
    from tvm.topi.testing import conv2d_nchw_python

    return np.maximum(conv2d_nchw_python(x, w, stride, pad) + b.reshape(1, -1, 1, 1), 0)


def _ref_depthwise(x, w, stride, pad):
    """Depthwise (multiplier 1) conv in numpy."""
    c = x.shape[1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = w.shape[2]
    oh = (xp.shape[2] - k) // stride + 1
    ow = (xp.shape[3] - k) // stride + 1
    out = np.zeros((x.shape[0], c, oh, ow), dtype="float64")
    for dy in range(k):
        for dx in range(k):
            out += xp[:, :, dy:dy + stride * oh:stride, dx:dx + stride * ow:stride] * w[None, :, 0, dy, dx, None, None]
    return out


def _ref_depthwise_relu(x, w, b, stride, pad):
    return np.maximum(_ref_depthwise(x, w, stride, pad) + b.reshape(1, -1, 1, 1), 0)


# ----------------------------------------------------------------------------------------------- TIR inspection


class Structure:
    """What the tests check about a scheduled PrimFunc, read through a fresh Schedule."""

    def __init__(self, func):
        self.func = func
        self.sch = sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
        self.blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(root)}
        self.loops = {name: [sch.get(l) for l in sch.get_loops(b)] for name, b in self.blocks.items()}
        self.alloc = {b.name: (b.scope(), [int(d) for d in b.shape]) for b in sch.get(root).alloc_buffers}

    def kinds(self) -> set:
        return {loop.kind for loops in self.loops.values() for loop in loops}

    def vectorized_not_innermost(self) -> list[str]:
        """Blocks with a VECTORIZED loop that has other loops inside it (e.g. a vectorized tile loop)."""
        return [name for name, loops in self.loops.items()
                if any(loop.kind == ForKind.VECTORIZED for loop in loops[:-1])]

    def shared_loops(self, a: str, b: str) -> int:
        """How many outer loops blocks ``a`` and ``b`` share."""
        la, lb = self.sch.get_loops(self.blocks[a]), self.sch.get_loops(self.blocks[b])
        n = 0
        for x, y in zip(la, lb):
            if not self.sch.get_sref(x).same_as(self.sch.get_sref(y)):
                break
            n += 1
        return n

    def inner_extent(self, name: str, below: int) -> int:
        return math.prod(int(loop.extent) for loop in self.loops[name][below:])

    def compacted_alloc(self) -> dict:
        """Buffers allocated after TVM's own buffer compaction: name -> (scope, shape)."""
        seq = tvm.transform.Sequential([s_tir.transform.LowerInitBlock(),
                                        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
                                        s_tir.transform.ConvertBlocksToOpaque(),
                                        s_tir.transform.CompactBufferAllocation()])
        out = {}

        def walk(stmt):
            if isinstance(stmt, s_tir.SBlockRealize):
                walk(stmt.block)
            elif isinstance(stmt, s_tir.SBlock):
                for buf in stmt.alloc_buffers:
                    out[buf.name] = (buf.scope(), [int(d) for d in buf.shape])
                walk(stmt.body)
            elif isinstance(stmt, tvm.tirx.For):
                walk(stmt.body)
            elif isinstance(stmt, tvm.tirx.SeqStmt):
                for s in stmt.seq:
                    walk(s)
            elif hasattr(stmt, "body"):
                walk(stmt.body)

        walk(seq(tvm.IRModule({"main": self.func}))["main"].body)
        return out


def _check_tiled(func, unscheduled, anchor: str, tile: int, global_allowed=()):
    """The checks every rule must pass on a fused kernel with an epilogue."""
    s = Structure(func)
    epilogue = block_names(s_tir.Schedule(unscheduled))[-1]
    assert epilogue != anchor
    assert ForKind.PARALLEL in s.kinds() and ForKind.VECTORIZED in s.kinds()
    # the init block was decomposed out of the reduction
    assert f"{anchor}_init" in s.blocks and f"{anchor}_update" in s.blocks and anchor not in s.blocks
    assert all(s.sch.get(b).init is None for b in s.blocks.values())
    # epilogue stages were inlined into one, placed inside the anchor's tile under the parallel loop
    assert set(s.blocks) <= {f"{anchor}_init", f"{anchor}_update", epilogue, *global_allowed}
    shared = s.shared_loops(f"{anchor}_update", epilogue)
    assert shared >= 1 and any(l.kind == ForKind.PARALLEL for l in s.loops[epilogue][:shared])
    assert s.inner_extent(epilogue, shared) == tile
    # the accumulator is local; only padding buffers live in global memory
    locals_ = [n for n, (scope, _) in s.alloc.items() if scope == "local"]
    assert locals_ == [f"{anchor}_local"]
    assert {n for n, (scope, _) in s.alloc.items() if scope != "local"} <= set(global_allowed)
    compact = s.compacted_alloc()
    assert math.prod(compact[f"{anchor}_local"][1]) == tile
    assert not s.vectorized_not_innermost()
    return s


# ----------------------------------------------------------------------------------------------- 1. structure

CONV_K3 = _conv_model(16, 32, 14, 3, pad=1)[0]  # 32 ch, 14 wide: default AVX2 config is oc 8x7


@pytest.fixture(scope="module")
def conv_fn():
    return _partition_fn(CONV_K3)


@pytest.fixture(scope="module")
def dense_fn():
    return _partition_fn(_dense_model(2, 64, 48)[0])


@pytest.fixture(scope="module")
def dw_fn():
    return _partition_fn(_conv_model(8, 8, 28, 3, stride=2, pad=1, group=8)[0])


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


@pytest.mark.parametrize("cfg", [dense.Config(16, 4), dense.Config(48, 2), dense.Config(8, 1)],
                         ids=lambda c: f"n{c.n_block}k{c.k_unroll}")
def test_dense_structure(dense_fn, cfg):
    pc = partition_compute(dense_fn)
    assert pc.family == "dense"
    func = pc.prim_func()
    out = dense.apply(func, AVX2, cfg)
    assert out is not None
    s = _check_tiled(out, func, "T_matmul_NN", cfg.n_block)
    update = s.loops["T_matmul_NN_update"]
    assert update[0].kind == ForKind.PARALLEL and int(update[0].extent) == 48 // cfg.n_block
    assert update[-1].kind == ForKind.VECTORIZED and int(update[-1].extent) == cfg.n_block
    assert update[-2].kind == ForKind.UNROLLED and int(update[-2].extent) == cfg.k_unroll


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
    assert set(x86.RULES) == {"conv2d", "depthwise_conv2d", "dense"}


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
]


@pytest.mark.parametrize("args,expected", DW_DEFAULTS, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple)
                         else None)
def test_depthwise_default_config(args, expected):
    assert depthwise_conv2d.default_config(*args) == expected


@pytest.mark.parametrize("args,expected", [
    # (n, k, lanes) -> up to 4 vectors of columns (any divisor, not a vector multiple), K unrolled by <= 4
    ((48, 64, AVX2), dense.Config(24, 4)), ((1024, 512, AVX2), dense.Config(32, 4)),
    ((1000, 1280, AVX2), dense.Config(25, 4)), ((1000, 1280, AVX512), dense.Config(50, 4)),
    ((37, 10, AVX2), dense.Config(1, 2)), ((10, 7, AVX2), dense.Config(10, 1))])
def test_dense_default_config(args, expected):
    assert dense.default_config(*args) == expected


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
    func, packed = make_kernel(fn, targets.resolve(HOST))
    cfg = conv2d.default_config(cout, hw, lanes, cin, k)
    assert packed == {1: cfg.oc_block}
    s = Structure(func)
    assert ForKind.PARALLEL in s.kinds()
    assert not s.vectorized_not_innermost(), "a 1-wide tile must not vectorize the tile (reduction) loop"
    reduction = s.loops["conv2d_nchw_update"]
    assert all(l.kind != ForKind.VECTORIZED for l in reduction[:-1])
    x = np.random.default_rng(1).standard_normal((1, cin, hw, hw)).astype("float32")
    out = _run(func, x, pack_weight(w, cfg.oc_block), b.reshape(1, -1, 1, 1))
    np.testing.assert_allclose(out, _ref_conv_relu(x, w, b, 1, pad), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m,k,n", [(3, 10, 37), (1, 10, 37), (2, 12, 41)])
def test_dense_unit_tile(m, k, n):
    model, w, b = _dense_model(m, k, n, seed=n)
    func, packed = make_kernel(_partition_fn(model), targets.resolve(HOST))
    assert packed == {}
    assert dense.default_config(n, k, _host_lanes()).n_block == 1
    s = Structure(func)
    assert ForKind.PARALLEL in s.kinds()
    assert not s.vectorized_not_innermost()
    assert all(l.kind != ForKind.VECTORIZED for l in s.loops["T_matmul_NN_update"][:-1])
    x = np.random.default_rng(2).standard_normal((m, k)).astype("float32")
    out = _run(func, x, w, b)
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


def test_avx512_dense_asm():
    fn = _partition_fn(_dense_model(1, 64, 64)[0])
    func = partition_compute(fn).prim_func()
    sched = x86.schedule(func, "dense", 512)
    assert int(Structure(sched).loops["T_matmul_NN_update"][-1].extent) == 64
    asm = _build(sched, "x86-avx512").mod.inspect_source("asm")
    assert "zmm" in asm and "vfmadd" in asm


@pytest.mark.parametrize("cin,cout,hw,k,stride,pad,group,oc_block",
                         [(16, 32, 14, 3, 1, 1, 1, 32), (64, 128, 7, 1, 1, 0, 1, 32), (8, 24, 13, 3, 2, 1, 1, 8),
                          (16, 16, 33, 3, 1, 1, 16, None)],
                         ids=["oc32x7", "k1-oc32x7u4", "ow8x7-s2", "depthwise"])
def test_avx512_schedules_compute_correctly_on_this_host(cin, cout, hw, k, stride, pad, group, oc_block):
    """The AVX-512 tiles, compiled for the host (LLVM splits the 512-bit vectors), give the right numbers."""
    model, w, b = _conv_model(cin, cout, hw, k, stride=stride, pad=pad, group=group, seed=cout)
    func, packed = make_kernel(_partition_fn(model), targets.resolve("x86-avx512"))
    assert packed == ({1: oc_block} if oc_block else {})
    x = np.random.default_rng(4).standard_normal((1, cin, hw, hw)).astype("float32")
    weight = pack_weight(w, packed[1]) if packed else w
    out = _run(func, x, weight, b.reshape(1, -1, 1, 1))
    ref = _ref_conv_relu(x, w, b, stride, pad) if group == 1 else _ref_depthwise_relu(x, w, b, stride, pad)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------- 6. generic fallback


def test_grouped_conv_uses_generic_schedule():
    model, w, b = _conv_model(8, 8, 9, 3, pad=1, group=2, seed=7)
    cm = tvmfuse.compile(model, target=HOST)
    kernels = {gv.name_hint: f for gv, f in cm.mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.family" in f.attrs}
    assert len(kernels) == 1
    (name, kernel), = kernels.items()
    assert str(kernel.attrs["tvmfuse.family"]) == "group_conv2d"
    assert "group_conv2d" not in x86.RULES
    s = Structure(kernel)
    assert ForKind.PARALLEL in s.kinds()
    # the epilogue runs per output channel, right after that channel's accumulation
    anchor = ANCHOR_BLOCK["group_conv2d"]
    epilogue = [n for n in s.blocks if n not in (anchor, "pad_temp")]
    assert len(epilogue) == 1 and s.shared_loops(anchor, epilogue[0]) == 1
    # it is exactly what the generic schedule makes of the unscheduled kernel
    pc = partition_compute(cm.record.kernels[name][0])
    expected = fused.schedule_fused(pc.prim_func(), "group_conv2d")
    bare = kernel
    for key in [str(k) for k in kernel.attrs.keys() if k not in expected.attrs]:  # tvmfuse.* / op_pattern
        bare = bare.without_attr(key)
    tvm.ir.assert_structural_equal(bare, expected)
    x = np.random.default_rng(7).standard_normal((1, 8, 9, 9)).astype("float32")
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
