"""x86 kernels flush denormal floats to zero while they run (MXCSR's FTZ and DAZ bits), and put the calling
thread's MXCSR back after.

Intel cores take a microcode assist for every float operation whose input or result is denormal. On a Sapphire
Rapids Xeon (2 threads, the same build with and without this pass, interleaved) PaddleOCR's detectors and a
recognizer, whose activations decay into denormals, ran 2.4-2.8x faster with them flushed (PP-OCRv6 det 129 -> 53
ms, PP-OCRv5 det 74 -> 26, en PP-OCRv4 rec 13.6 -> 5.6), every output of the 12 models tried identical, the others
within noise. AMD's Zen 4 takes no such penalty: the same three and two more detectors ran 0.93-1.02x flushed
against IEEE, so the flush costs nothing there. onnxruntime keeps denormals unless
``session.set_denormal_as_zero`` is set; OpenVINO and TensorFlow flush on their CPU threads by default. A
flushed value is below 1.2e-38 in magnitude.

MXCSR is per thread: the kernel sets it where it starts on the calling thread and where each thread of TVM's
pool starts its share of a parallel loop (``pragma_parallel_launch_point``: the code around the loop runs once
per task), saving the thread's own value first (``stmxcsr``) and loading it back after, so a process that
calls a tvmfuse library keeps its own floating-point mode (numpy's, the caller's). Integer instructions
ignore MXCSR; the INT8 kernels' float requantize steps round as before (the rounding bits are not touched).
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .lowered import map_children

FLUSH_BITS = 0x8040  # FTZ (bit 15) and DAZ (bit 6)
LAUNCH_POINT = "pragma_parallel_launch_point"
SAVED = "mxcsr_saved"
COMPUTE_SCOPE = "compute_scope"  # MakePackedAPI's mark of the body after the arguments are unpacked
MARK = "tvmfuse.flushes_denormals"


def _mxcsr(name: str, buffer) -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_llvm_intrin("void", f"llvm.x86.sse.{name}", buffer.access_ptr(
        "w" if name == "stmxcsr" else "r")))


def flushing(stmt: tirx.Stmt) -> tirx.Stmt:
    """``stmt`` run with FTZ and DAZ set, the thread's MXCSR saved before and loaded back after (two ``"local"``
    words: :mod:`.stack_tiles` puts them on the stack, of the task's closure inside a parallel launch)."""
    saved = tirx.decl_buffer((1,), "uint32", name=SAVED, scope="local")
    flush = tirx.decl_buffer((1,), "uint32", name="mxcsr_flush", scope="local")
    return tirx.SeqStmt([
        tirx.AllocBuffer(saved), tirx.AllocBuffer(flush), _mxcsr("stmxcsr", saved),
        tirx.BufferStore(flush, tirx.BufferLoad(saved, [0]) | tirx.const(FLUSH_BITS, "uint32"), [0]),
        _mxcsr("ldmxcsr", flush), stmt, _mxcsr("ldmxcsr", saved)])


def _one(extent) -> bool:
    """A loop of one iteration: a launch point around no parallel loop fails to build."""
    return isinstance(extent, tirx.IntImm) and extent.value == 1


def _per_task(stmt):
    """``stmt`` with every outermost parallel loop flushing on each task of the pool; ``stmt`` itself when it
    holds none. Walks the statements that hold others in a lowered kernel."""
    if isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == LAUNCH_POINT:
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, flushing(stmt.body))
    if isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == COMPUTE_SCOPE:
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, flushing(_per_task(stmt.body)))
    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL and not _one(stmt.extent):
        return tirx.AttrStmt(tirx.const(0, "int32"), LAUNCH_POINT, tirx.const(0, "int32"), flushing(stmt))
    return map_children(stmt, _per_task)


def flush_denormals(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (lowered: after TVM's S-TIR passes, before ``LowerTVMBuiltin``) flushing denormals on the calling
    thread and on every task of its parallel loops; unchanged when it already does. The calling thread's part is
    the function's compute scope where it has one (the packed-API wrapper returns at its end: a restore after
    the whole body would never run)."""
    if func.attrs is not None and MARK in func.attrs:
        return func
    body = _per_task(func.body)
    if not _has_compute_scope(func.body):
        body = flushing(body)
    return func.with_body(body).with_attr(MARK, 1)


def _has_compute_scope(stmt) -> bool:
    if isinstance(stmt, tirx.AttrStmt):
        return stmt.attr_key == COMPUTE_SCOPE or _has_compute_scope(stmt.body)
    if isinstance(stmt, tirx.SeqStmt):
        return any(_has_compute_scope(s) for s in stmt.seq)
    return False


def FlushDenormals() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """:func:`flush_denormals` on every PrimFunc of a module (in the x86 TIR pipeline, :mod:`.stack_tiles`)."""

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmfuse.FlushDenormals")
    def _pass(func, _mod, _ctx):
        return flush_denormals(func)

    return _pass
