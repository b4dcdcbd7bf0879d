"""The form of a kernel its tuning records are shared under: every constant its stores compute with set to 1.

A schedule does not depend on the constants a kernel computes with, only on its loops, blocks and buffers. Yet
an INT8 kernel holds its calibration table's zero points and clip bounds as constants (the padding code
``za - 128``, the output zero point, the ReLU6 bound in codes), so the same conv quantized with another table is
another workload, and a record timed for one table would apply to no other (the INT8 records of 2026-11-30 applied
to none of ResNet-50's kernels quantized with a second table). Offline tuning files its records under this form
(:func:`tvmfuse.tune.offline.import_results`) and a compile that finds no record for a kernel itself looks this
form up (:func:`tvmfuse.passes.schedule.ApplyTuningLogs`), so the record applies to every table.

Only values are replaced: constants in buffer indices, in the conditions of ``Select``, in loop bounds and shapes
and a reduction's initial value describe the structure and stay. Statements this walk does not know are kept whole
(their constants stay: a missed share, never a wrong one).
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx

_LLVM_CALLS = ("tirx.call_llvm_pure_intrin", "tirx.call_llvm_intrin")
_BINARY = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max)


def _value(e):
    if isinstance(e, tirx.IntImm) and str(e.ty) != "bool":
        return tirx.IntImm(str(e.ty), 1)
    if isinstance(e, tirx.FloatImm):
        return tirx.FloatImm(str(e.ty), 1.0)
    if isinstance(e, _BINARY):
        return type(e)(_value(e.a), _value(e.b))
    if isinstance(e, tirx.Cast):
        return tirx.Cast(str(e.ty), _value(e.value))
    if isinstance(e, tirx.Select):
        return tirx.Select(e.condition, _value(e.true_value), _value(e.false_value))
    if isinstance(e, ir.Call) and isinstance(e.op, ir.Op):  # tirx intrinsics: round, exp, if_then_else, ...
        keep = 1 if e.op.name in _LLVM_CALLS else 0  # an LLVM call's first argument names the intrinsic
        return ir.Call(e.op, list(e.args[:keep]) + [_value(a) for a in e.args[keep:]], ret_ty=e.ty)
    return e  # loads (their indices are structure), variables, anything else


def _stmt(s):
    if isinstance(s, tirx.BufferStore):
        return tirx.BufferStore(s.buffer, _value(s.value), s.indices)
    if isinstance(s, tirx.SeqStmt):
        return tirx.SeqStmt([_stmt(x) for x in s.seq])
    if isinstance(s, tirx.For):
        return tirx.For(s.loop_var, s.min, s.extent, s.kind, _stmt(s.body), s.thread_binding, s.annotations)
    if isinstance(s, s_tir.SBlockRealize):
        return s_tir.SBlockRealize(s.iter_values, s.predicate, _stmt(s.block))
    if isinstance(s, s_tir.SBlock):
        # a reduction's init stays: rfactor (split-K) needs it to be the reducer's identity
        return s_tir.SBlock(s.iter_vars, s.reads, s.writes, s.name_hint, _stmt(s.body), s.init, s.alloc_buffers,
                            s.match_buffers, s.annotations)
    return s


def shared_form(func):
    """``func`` with every constant in the values its stores compute set to 1 (of the constant's dtype)."""
    return func.with_body(_stmt(func.body))


def shared_hash(func) -> str:
    """The workload hash of :func:`shared_form` (``records.kernel_hash`` of it)."""
    from .records import kernel_hash

    return kernel_hash(shared_form(func))
