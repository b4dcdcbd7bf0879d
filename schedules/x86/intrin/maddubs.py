"""u8 x s8 -> i32 16x4 dot-product step without VNNI: ``vpmaddubsw`` then ``vpmaddwd`` with ones, on the
VNNI weight layout, for weights whose pairs cannot saturate it (``int8_ref.pairs_fit_int16``).

What it computes is VNNI's step (the description is :func:`.vnni.desc`)::

    C[i] += int32(A[k]) * int32(B[i, k])      for i < 16, k < 4
    A: (4,) uint8   B: (16, 4) int8 (64 contiguous bytes)   C: (16,) int32

``vpmaddubsw`` multiplies the pixel's 4 bytes (broadcast, unsigned) by each output's 4 weight bytes (signed)
and adds neighbouring products into int16 with saturation: ``A[0] B[i,0] + A[1] B[i,1]`` and ``A[2] B[i,2] +
A[3] B[i,3]``; ``vpmaddwd`` with ones adds the two into output ``i``'s int32 lane. Exact exactly when no such
pair sum can leave int16, i.e. when for every weight pair the positive codes sum to at most 128 and the
negative ones to at least -128 (``255 * 128 = 32640``); 7-bit weights in [-64, 64] always are
(onnxruntime's ``reduce_range``, what its quantizer advises for CPUs without VNNI). The INT8 passes quantize
to that range for targets without VNNI and check the packed codes (a quantized model's own weights may not
fit: those keep the int16 pair step, :mod:`.madd_pairs`).

Why it pays over the pair step: per 32 products 3 vector uops (two multiplies and an add) against the pair
step's 4 and its two byte shuffles per pixel, and the weight bytes stream once as int8 instead of int16.

Kinds (:data:`KINDS`): ``"maddubs"`` (two ymm halves of 8 outputs, AVX2) and ``"maddubs512"`` (one zmm,
AVX512BW). The accumulator C is in ``"local"`` scope (tvmfuse's register tiles).
"""

from __future__ import annotations

import functools

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from . import vnni

KINDS = ("maddubs", "maddubs512")
U8, S8, I16, I32 = "uint8", "int8", "int16", "int32"
_LLVM = {"maddubs": (8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
         "maddubs512": (16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")}


def intrin_name(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown vpmaddubsw step {kind!r}; kinds {KINDS}")
    return f"tvmfuse_dot_16x4_{kind}_local"


@functools.cache
def impl(kind: str):
    """``vpmaddubsw`` + ``vpmaddwd`` (ones) + add over ``lanes`` int32 outputs at a time."""
    lanes, maddubs, madd = _LLVM[kind]
    data, words, out = f"int8x{4 * lanes}", f"int16x{2 * lanes}", f"int32x{lanes}"

    @T.prim_func(s_tir=True)
    def dot_16x4_maddubs(
        A: T.Buffer((4,), U8, offset_factor=1),
        B: T.Buffer((16, 4), S8, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), lanes), dtype=data)
            for h in T.unroll(16 // lanes):
                C[T.ramp(h * lanes, 1, lanes)] = C[T.ramp(h * lanes, 1, lanes)] + T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(madd),
                    T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(maddubs), a, B.vload([h * lanes, 0], data),
                                            dtype=words),
                    T.broadcast(T.int16(1), 2 * lanes), dtype=out)

    return dot_16x4_maddubs


def ensure(kind: str) -> str:
    """Register the variant unless it is; return its name."""
    name = intrin_name(kind)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, vnni.desc("local"), impl(kind))
    return name
