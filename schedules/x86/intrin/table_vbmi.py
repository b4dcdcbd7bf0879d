"""Table lookups of 16 codes at a time for AVX512-VBMI (the INT8 kernels' epilogue tables, :mod:`..int8_table`).

``out[i] = table[codes[i]]`` for 16 int32 indices in [0, 256) and a 256-byte table. Vectorized by TVM each
lane is a byte load and an insert (``vpinsrb``), which cost a 1x1 conv up to twice its time. Here the
indices are narrowed to bytes and looked up in the table's four 64-byte rows by two ``vpermi2b`` (each a
128-entry lookup: bit 6 of an index picks the row of the pair, bits 0-5 the byte) and a select on bit 7.

:func:`VectorTableLookups` rewrites the loops annotated :data:`MARK` (a scheduled kernel's 16-lane lookup loop,
marked by :mod:`..int8_table`) into that vector statement; it runs after scheduling, on every kernel.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.target import codegen
from tvm.ir.expr import TensorLoad  # what tirx.BufferLoad builds

from ...padding_taps import rebuild_loops, substitute

LANES = 16
MARK = "tvmfuse.table_lookup_16"  # loop annotation: rewrite this loop into one vector lookup
_VPERMI2B = "llvm.x86.avx512.vpermi2var.qi.512"


def lookup(table: tirx.Buffer, codes) -> tirx.PrimExpr:
    """The 16 entries of ``table`` (256 bytes, uint8 or int8) at ``codes`` (int32x16)."""
    index16 = tirx.Cast("int8x16", codes)
    index = tirx.Shuffle([index16] * 4, list(range(64)))
    rows = [tirx.reinterpret("int8x64", tirx.BufferLoad(table, [tirx.Ramp(tirx.const(64 * r, "int32"), 1, 64)]))
            for r in range(4)]
    permute = tirx.const(codegen.llvm_lookup_intrinsic_id(_VPERMI2B), "uint32")
    low = tirx.call_llvm_pure_intrin("int8x64", permute, rows[0], index, rows[1])
    high = tirx.call_llvm_pure_intrin("int8x64", permute, rows[2], index, rows[3])
    picked = tirx.Select(index < tirx.Broadcast(tirx.const(0, "int8"), 64), high, low)
    return tirx.reinterpret(f"{table.dtype}x{LANES}", tirx.Shuffle([picked], list(range(LANES))))


def _rewrite(loop: tirx.For):
    """The vector stores replacing a marked loop (one per 16 of its values), or None when its body is not
    ``out[..] = table[codes[..]]`` over the loop's values in the last index of both, or they are not 16 a
    store."""
    if not isinstance(loop.extent, tirx.IntImm) or int(loop.extent) % LANES:
        return None
    stores = [_vector_store(loop, start) for start in range(0, int(loop.extent), LANES)]
    if any(store is None for store in stores):
        return None
    return stores[0] if len(stores) == 1 else tirx.SeqStmt(stores)


def _vector_store(loop: tirx.For, start: int):
    """The store of the loop's 16 lookups from value ``start``, as :func:`_rewrite` says."""
    realize = loop.body
    if not isinstance(realize, s_tir.SBlockRealize) or not (isinstance(realize.predicate, tirx.IntImm)
                                                              and int(realize.predicate.value) == 1):
        return None
    block = realize.block
    store = block.body
    if not (isinstance(store, tirx.BufferStore) and isinstance(store.value, TensorLoad)
            and len(store.value.indices) == 1 and isinstance(store.value.indices[0], TensorLoad)):
        return None
    ramp = tirx.Ramp(tirx.const(start, str(loop.loop_var.ty.dtype)) + loop.min, 1, LANES)
    try:
        binding = {iv.var: substitute(value, {loop.loop_var: ramp})
                   for iv, value in zip(block.iter_vars, realize.iter_values)}
        table, load = store.value.source, store.value.indices[0]
        simplify = tvm.sym.Analyzer().simplify  # a broadcast row plus the loop's ramp: one ramp again
        out_index = [simplify(substitute(i, binding)) for i in store.indices]
        code_index = [simplify(substitute(i, binding)) for i in load.indices]
    except ValueError:
        return None
    if not all(isinstance(i, tirx.Ramp) == (n == len(out_index) - 1) for n, i in enumerate(out_index)) or \
            not all(isinstance(i, tirx.Ramp) == (n == len(code_index) - 1) for n, i in enumerate(code_index)):
        return None
    codes = tirx.BufferLoad(load.source, code_index)
    return tirx.BufferStore(store.buffer, lookup(table, codes), out_index)


def rewrite_lookups(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every loop marked :data:`MARK` (16 lanes) a vector lookup; a marked loop whose body does
    not fit is vectorized as it is (a byte load per lane)."""

    marked = []

    def replace(loop: tirx.For):
        if MARK not in loop.annotations:
            return None
        marked.append(loop)
        vector = _rewrite(loop)
        return vector if vector is not None else tirx.For(loop.loop_var, loop.min, loop.extent,
                                                          tirx.ForKind.VECTORIZED, loop.body)

    body = rebuild_loops(func.body, replace)
    return func.with_body(body) if marked else func


def VectorTableLookups() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """:func:`rewrite_lookups` on every PrimFunc of a module."""

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmfuse.VectorTableLookups")
    def _pass(func, _mod, _ctx):
        return rewrite_lookups(func)

    return _pass
