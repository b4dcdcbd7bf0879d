"""Register tiles on the stack: the ``"local"`` buffers of a CPU kernel become ``alloca``s, not heap workspaces.

Every rule accumulates its register tile in a ``"local"`` buffer (``common.accumulate_in_registers``, the tensor
intrinsics' accumulators). TVM's ``LowerTVMBuiltin`` keeps a CPU allocation on the stack only in ``"global"``
scope and under 1 KB; a ``"local"`` one is asked of ``TVMBackendAllocWorkspace``, once per parallel task. LLVM
cannot tell that heap pointer from the kernel's other buffers, so a tile it cannot keep whole in registers
goes through memory: accumulators stored after the reduction and loaded again by the epilogue, spills, half-
vector reloads of whole-vector stores. An ``alloca`` of constant size is one SROA promotes to registers.
``bench/int8_kernels.py``'s layers (INT8 NCHW kernels, the two builds timed in alternation), AVX2 code on
Zen 4: conv 64->64 3x3 at 56x56 882 -> 663 us, 256->256 3x3 at 14x14 776 -> 554, depthwise 144x56x56 154 ->
124; AVX512-VNNI: conv 64->256 1x1 at 56x56 643 -> 503, depthwise 137 -> 112, dense 2048->1000 13.8 -> 11.4.
The NCHW16c kernels whole models run kept their tiles in registers before: MobileNetV2 INT8 and FP32 time
the same with both builds (within 1%).

:func:`StackTiles` marks those allocations with ``disable_lower_builtin``, which ``LowerTVMBuiltin`` leaves to
the LLVM code generator (an ``alloca`` at the entry of the function or of the parallel task's closure). It
runs in :data:`PIPELINE`, TVM's default S-TIR pipeline with it before the host finalization, after
:mod:`.denormals` (kernels flush denormals, their MXCSR words on the stack too); the x86 backend builds its
kernels with it (``Backend.tir_pipeline``). Allocations over :data:`MOST_BYTES` (a worker
thread's stack is the platform's default) and every other scope stay as TVM makes them.
"""

from __future__ import annotations

import tvm
from tvm import tirx

PIPELINE = "tvmfuse_x86"
MOST_BYTES = 16 * 1024  # per allocation; tiles are at most a few KB (AMX: 4 x 1 KB accumulators)
MARK = "disable_lower_builtin"  # tvm::tirx::transform::kDisableLowerTVMBuiltin


def _stackable(buffer) -> bool:
    if buffer.scope() != "local" or len(buffer.shape) != 1 or not isinstance(buffer.shape[0], tirx.IntImm):
        return False
    dtype = tvm.DataType(str(buffer.dtype))
    return 0 < int(buffer.shape[0]) * dtype.bits * dtype.lanes // 8 <= MOST_BYTES


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and a.same_as(b))


def map_children(stmt, fn):
    """``stmt`` with ``fn`` applied to the statements it holds, for the kinds a lowered kernel nests others in
    (SeqStmt, For, IfThenElse, AttrStmt); the same node where nothing changed, and any other kind as it is."""
    if isinstance(stmt, tirx.SeqStmt):
        seq = [fn(s) for s in stmt.seq]
        return stmt if all(_same(a, b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, tirx.For):
        body = fn(stmt.body)
        if _same(body, stmt.body):
            return stmt
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step)
    if isinstance(stmt, tirx.IfThenElse):
        then, other = fn(stmt.then_case), (fn(stmt.else_case) if stmt.else_case is not None else None)
        if _same(then, stmt.then_case) and _same(other, stmt.else_case):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    if isinstance(stmt, tirx.AttrStmt):
        body = fn(stmt.body)
        return stmt if _same(body, stmt.body) else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
    return stmt


def _mark(stmt):
    """``stmt`` with its stackable allocations marked; the same node where nothing changed. Only the
    statements that hold others are walked; an allocation inside any other kind stays as it is."""
    if isinstance(stmt, tirx.AllocBuffer):
        if _stackable(stmt.buffer) and MARK not in stmt.annotations:
            return tirx.AllocBuffer(stmt.buffer, {**stmt.annotations, MARK: tirx.IntImm("int32", 1)})
        return stmt
    return map_children(stmt, _mark)


def stack_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (lowered, before ``LowerTVMBuiltin``) with its stackable ``"local"`` allocations marked."""
    body = _mark(func.body)
    return func if _same(body, func.body) else func.with_body(body)


def StackTiles() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """:func:`stack_tiles` on every PrimFunc of a module."""

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmfuse.StackTiles")
    def _pass(func, _mod, _ctx):
        return stack_tiles(func)

    return _pass


def _pipeline():
    from .denormals import FlushDenormals

    pipeline, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("s_tir")

    def host():
        return tvm.transform.Sequential([FlushDenormals(), StackTiles(), finalize_host()])

    return pipeline, host, finalize_device


def register() -> str:
    """Register :data:`PIPELINE` with TVM (once per process); return its name for ``tvm.tirx.build``."""
    from tvm.tirx import compilation_pipeline

    if PIPELINE not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(PIPELINE, _pipeline)
    return PIPELINE
