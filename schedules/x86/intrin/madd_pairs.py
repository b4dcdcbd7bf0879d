"""u8 x s16 -> i32 16x4 dot-product step on weights packed as int16 pairs: ``vpmaddwd`` without horizontal
adds, for x86 CPUs without VNNI (AVX2, AVX-512 before Cascade Lake) whose weight codes do not fit
:mod:`.maddubs` (a quantized model's own full-range codes; tvmfuse's quantizer writes 7-bit ones there).

What every variant computes (the description)::

    C[i] += int32(A[k]) * int32(B[k // 2, i, k % 2])      for i < 16, k < 4
    A: (4,) uint8   B: (2, 16, 2) int16 (128 contiguous bytes)   C: (16,) int32

The weights are the int8 codes, sign-extended once at compile time (``int8_ref.to_pairs``) and laid out so
that input channels ``2p`` and ``2p + 1`` of the 16 output channels sit side by side: ``vpmaddwd`` of one
weight vector with the pixel's pair ``(A[2p], A[2p+1])`` broadcast to every 32-bit lane gives, in lane
``i``, ``A[2p] * B[p, i, 0] + A[2p+1] * B[p, i, 1]`` -- output ``i``'s share, in order, exact (``2 * 255 *
127`` fits easily). Per step and pixel: one broadcast load, two ``vpshufb`` forming the zero-extended pairs,
and per 8 (AVX2) or 16 (AVX-512) outputs two ``vpmaddwd`` (weights straight from memory) and two adds.

Why not ``vpmaddubsw`` (u8 x s8 pairs, :mod:`.maddubs`) for these: its int16 pair sum saturates for full-range
codes (``2 * 255 * 127 > 32767``). Zen 4 (ymm, 2 threads): two ``vpmaddwd`` per cycle, as many as FMAs, each
16 multiply-adds against an FMA's 8.

Kinds (:data:`KINDS`): ``"avx2"`` (ymm), ``"avx512"`` (zmm, AVX512BW), ``"generic"`` (the description as
code, which LLVM vectorizes: the tests' way to check the tiling anywhere). The accumulator C is in
``"local"`` scope (tvmfuse's register tiles).
"""

from __future__ import annotations

import functools

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

KINDS = ("avx2", "avx512", "generic")
U8, I16, I32 = "uint8", "int16", "int32"
# vpshufb masks over the broadcast 4 bytes of A: (A[0], A[1]) and (A[2], A[3]) zero-extended to int16
# (a mask byte with its top bit set writes 0)
PAIR_MASKS = tuple(int.from_bytes(bytes(m), "little", signed=True) for m in ((0, 0x80, 1, 0x80), (2, 0x80, 3, 0x80)))


def kind_for(vector_bits: int) -> str:
    """The kind a target of ``vector_bits``-bit vectors runs: zmm, ymm, or the generic description below AVX2."""
    return "avx512" if vector_bits >= 512 else "avx2" if vector_bits >= 256 else "generic"


def intrin_name(kind: str, data: str = U8) -> str:
    if kind not in KINDS or data not in (U8, I16):
        raise ValueError(f"unknown pair-step variant ({kind!r}, {data!r}); kinds {KINDS}, data uint8 or int16")
    return f"tvmfuse_madd_pairs_16x4_{kind}" + ("_wide" if data == I16 else "")


@functools.cache
def desc(data: str = U8):
    """The description; ``data`` is A's dtype (int16: codes widened by the kernel's input copy)."""

    @T.prim_func(s_tir=True)
    def madd_pairs_desc(
        A: T.Buffer((4,), data, offset_factor=1),
        B: T.Buffer((2, 16, 2), I16, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:2, 0:16, 0:2])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vk // 2, vi, vk % 2], "int32")

    return madd_pairs_desc


def _pairs(A, lanes: int, data: str):
    """The pixel's pairs (A[0], A[1]) and (A[2], A[3]) as int16 in every 32-bit lane: two byte shuffles of
    the broadcast 4 bytes, or (int16 data) two broadcasts of 32-bit words loaded as they lie."""
    if data == I16:
        return tuple(T.reinterpret(T.broadcast(T.reinterpret(A.vload([2 * p], "int16x2"), dtype="int32"), lanes),
                                   dtype=f"int16x{2 * lanes}") for p in (0, 1))
    bytes_ = f"int8x{4 * lanes}"
    shuffle = "llvm.x86.avx2.pshuf.b" if lanes == 8 else "llvm.x86.avx512.pshuf.b.512"
    a = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), lanes), dtype=bytes_)
    return tuple(T.reinterpret(T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(shuffle), a, T.reinterpret(
        T.broadcast(T.int32(m), lanes), dtype=bytes_), dtype=bytes_), dtype=f"int16x{2 * lanes}") for m in PAIR_MASKS)


@functools.cache
def impl(kind: str, data: str = U8):
    """``vpmaddwd`` over ``lanes`` int32 outputs at a time (8: ymm, 16: zmm)."""
    lanes, madd = {"avx2": (8, "llvm.x86.avx2.pmadd.wd"), "avx512": (16, "llvm.x86.avx512.pmaddw.d.512")}[kind]
    words, out = f"int16x{2 * lanes}", f"int32x{lanes}"

    @T.prim_func(s_tir=True)
    def madd_pairs(
        A: T.Buffer((4,), data, offset_factor=1),
        B: T.Buffer((2, 16, 2), I16, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:2, 0:16, 0:2])
            T.writes(C[0:16])
            p0, p1 = _pairs(A, lanes, data)
            for h in T.unroll(16 // lanes):
                C[T.ramp(h * lanes, 1, lanes)] = (
                    C[T.ramp(h * lanes, 1, lanes)]
                    + T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(madd), B.vload([0, h * lanes, 0], words), p0,
                                              dtype=out)
                    + T.call_llvm_pure_intrin(T.llvm_lookup_intrinsic_id(madd), B.vload([1, h * lanes, 0], words), p1,
                                              dtype=out))

    return madd_pairs


def ensure(kind: str, data: str = U8) -> str:
    """Register the variant for A of dtype ``data`` unless it is; return its name."""
    name = intrin_name(kind, data)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc(data), desc(data) if kind == "generic" else impl(kind, data))
    return name
