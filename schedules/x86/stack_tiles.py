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

from .lowered import map_children, same

PIPELINE = "tvmfuse_x86"
MOST_BYTES = 16 * 1024  # per allocation; tiles are at most a few KB (AMX: 4 x 1 KB accumulators)
MARK = "disable_lower_builtin"  # tvm::tirx::transform::kDisableLowerTVMBuiltin


def _stackable(buffer) -> bool:
    if buffer.scope() != "local" or len(buffer.shape) != 1 or not isinstance(buffer.shape[0], tirx.IntImm):
        return False
    dtype = tvm.DataType(str(buffer.dtype))
    return 0 < int(buffer.shape[0]) * dtype.bits * dtype.lanes // 8 <= MOST_BYTES


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
    return func if same(body, func.body) else func.with_body(body)


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
