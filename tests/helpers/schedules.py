"""Shared helpers for the x86 schedule tests: kernels made as LowerPartitions makes them, TIR inspection,
and module-scoped fixtures of one conv2d, one dense and one depthwise partition."""

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
from tvmfuse.schedules.computes.packing import pack_weight, unpack_weight
from tvmfuse.schedules.computes.partition import partition_compute
from tvmfuse.schedules.x86 import conv2d, dense, depthwise_conv2d, fused

from helpers import HOST, ort_run
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


def _partition_fn(model, skip=()):
    """The single partition function of ``model`` (Relax, weights as parameters); ``skip`` names
    canonicalization passes to leave out (to reach a kernel rule with a shape the pipeline would change)."""
    mod = frontend.import_model(model).mod
    passes = [p for p in canonicalize_passes() if p.info.name not in skip]
    with targets.resolve(HOST).tvm_target(), tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(passes)(mod)
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
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=spec.tvm_target(),
                       tir_pipeline=spec.backend().tir_pipeline())


def run_in_place(func, arrays, target=HOST):
    """Build ``func`` for ``target`` as TVM does by default and run it on numpy ``arrays``, one per parameter
    (the output's last, any dtype); returns the output."""
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=targets.resolve(target).tvm_target())
    args = [tvm.runtime.tensor(a) for a in arrays]
    lib["main"](*args)
    return args[-1].numpy()


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


def _check_tiled(func, unscheduled, anchor: str, tile: int, global_allowed=(), parallel: bool = True):
    """The checks every rule must pass on a fused kernel with an epilogue (``parallel=False``: one too small
    to split over the cores, whose tile loop stays serial)."""
    s = Structure(func)
    epilogue = block_names(s_tir.Schedule(unscheduled))[-1]
    assert epilogue != anchor
    assert (ForKind.PARALLEL in s.kinds()) == parallel and ForKind.VECTORIZED in s.kinds()
    # the init block was decomposed out of the reduction
    assert f"{anchor}_init" in s.blocks and f"{anchor}_update" in s.blocks and anchor not in s.blocks
    assert all(s.sch.get(b).init is None for b in s.blocks.values())
    # epilogue stages were inlined into one, placed inside the anchor's tile under the parallel loop
    assert set(s.blocks) <= {f"{anchor}_init", f"{anchor}_update", epilogue, *global_allowed}
    shared = s.shared_loops(f"{anchor}_update", epilogue)
    tile_kind = ForKind.PARALLEL if parallel else ForKind.SERIAL
    assert shared >= 1 and any(l.kind == tile_kind for l in s.loops[epilogue][:shared])
    assert s.inner_extent(epilogue, shared) == tile
    # the accumulator is local; only padding buffers live in global memory
    locals_ = [n for n, (scope, _) in s.alloc.items() if scope == "local"]
    assert locals_ == [f"{anchor}_local"]
    assert {n for n, (scope, _) in s.alloc.items() if scope != "local"} <= set(global_allowed)
    compact = s.compacted_alloc()
    assert math.prod(compact[f"{anchor}_local"][1]) == tile
    assert not s.vectorized_not_innermost()
    return s


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


# Exported to both test files, underscored helpers and fixtures included.
__all__ = [
    "CONV_K3",
    "AVX2",
    "AVX512",
    "Structure",
    "_build",
    "_check_tiled",
    "_conv_model",
    "_dense_model",
    "_host_lanes",
    "_kernel",
    "_partition_fn",
    "_ref_conv_relu",
    "_ref_depthwise",
    "_ref_depthwise_relu",
    "_run",
    "conv_fn",
    "dense_fn",
    "dw_fn",
]
