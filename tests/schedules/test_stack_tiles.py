"""Register tiles on the stack (schedules/x86/stack_tiles.py): the x86 pipeline makes a kernel's ``"local"``
tiles ``alloca``s where TVM's default asks the runtime's workspace for them, leaves larger and other buffers
alone, changes no result, and is the pipeline every x86 build uses (compile, the kernel cache, tuning)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import s_tir, te

from tvmfuse import targets
from tvmfuse.schedules.x86 import stack_tiles

from helpers import HOST

WORKSPACE = "TVMBackendAllocWorkspace"


def _tiled(n: int, tile: int):
    """``y = x * 3 + 1`` over ``n`` floats, accumulated in a ``"local"`` tile of ``tile`` floats per task."""
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: x[i] * 3.0 + 1.0, name="y")
    sch = s_tir.Schedule(te.create_prim_func([x, y]))
    block = sch.get_sblock("y")
    outer, inner = sch.split(sch.get_loops(block)[0], [None, tile])
    sch.parallel(outer)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, outer)
    return sch.mod["main"].with_attr("global_symbol", "main")


def _build(func, pipeline: str):
    target = targets.resolve(HOST).tvm_target()
    with target:
        return tvm.tirx.build(tvm.IRModule({"main": func}), target=target, pipeline=pipeline)


def _workspace_calls(lib) -> int:
    # "%y_local = [tail] call ptr %N(...)": the workspace allocator, called through its function pointer
    return sum(1 for line in lib.inspect_source("ll").splitlines() if "_local = " in line and "call ptr %" in line)


def test_a_tile_moves_from_the_workspace_to_the_stack_with_the_same_results():
    func = _tiled(256, 16)
    default, stacked = _build(func, "default"), _build(func, stack_tiles.register())
    assert _workspace_calls(default) == 1  # TVM's lowering of a "local" buffer, which the pass is for
    assert _workspace_calls(stacked) == 0
    x = np.random.default_rng(0).standard_normal(256).astype("float32")
    outs = []
    for lib in (default, stacked):
        y = tvm.runtime.tensor(np.zeros(256, "float32"))
        lib["main"](tvm.runtime.tensor(x), y)
        outs.append(y.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], x * 3.0 + 1.0, rtol=1e-6, atol=1e-6)  # an FMA rounds once


def test_a_tile_over_the_limit_stays_in_the_workspace():
    floats = stack_tiles.MOST_BYTES // 4 * 2
    assert _workspace_calls(_build(_tiled(floats * 2, floats), stack_tiles.register())) == 1


def test_the_pass_marks_only_local_allocations_of_known_size():
    def alloc(shape, scope, dtype="float32"):
        return tvm.tirx.AllocBuffer(tvm.tirx.decl_buffer(shape, dtype, scope=scope))

    tile, big = alloc((16,), "local"), alloc((stack_tiles.MOST_BYTES,), "local")
    plane, dynamic = alloc((16,), "global"), alloc((tvm.tirx.Var("n", "int32"),), "local")
    seq = tvm.tirx.SeqStmt([tile, big, plane, dynamic, tvm.tirx.Evaluate(0)])
    marked = stack_tiles._mark(seq)
    assert [stack_tiles.MARK in s.annotations for s in marked.seq[:4]] == [True, False, False, False]
    assert stack_tiles._mark(marked).same_as(marked)  # idempotent: nothing left to mark, nothing rebuilt
    unmarked = tvm.tirx.SeqStmt([plane, tvm.tirx.Evaluate(0)])
    assert stack_tiles._mark(unmarked).same_as(unmarked)


def test_x86_builds_use_the_pipeline_and_the_kernel_cache_keys_it():
    assert targets.resolve("x86-host").backend().tir_pipeline() == stack_tiles.PIPELINE
    assert stack_tiles.PIPELINE in tvm.tirx.compilation_pipeline.PIPELINE_MAP
    assert targets.resolve("cuda-sm90").backend().tir_pipeline() == "default"


def test_the_kernel_cache_keys_objects_by_pipeline():
    from tvmfuse.cache import kernels

    func, target = _tiled(64, 8), targets.resolve(HOST).tvm_target()
    with target, tvm.transform.PassContext(opt_level=3):
        keys = {kernels.kernel_key(func, target, kernels.pass_options() + name)
                for name in ("default", stack_tiles.register())}
    assert len(keys) == 2
