"""The depthwise u8 x s16 -> i32 step for CPUs without VNNI: four kernel taps of 16 channels as two
``vpmaddwd`` pairs per 8 (ymm) or 16 (zmm) channels.

What it computes (the description)::

    C[i] += int32(A[k, i]) * int32(B[k // 2, i, k % 2])      for i < 16, k < 4
    A: (4, 16) uint8, 4 consecutive NCHW16c pixels (64 contiguous bytes)
    B: (2, 16, 2) int16, channel i's taps 2p and 2p+1 side by side (``int8_depthwise.pack_weight_pairs``)
    C: (16,) int32

The taps-in-fours kernel of :mod:`.depthwise_vnni` with the multiply-add VNNI lacks here: the bytes of two
neighbouring pixels are interleaved (``vpunpcklbw``/``vpunpckhbw``) and zero-extended to int16, so lane ``i``
of ``vpmaddwd`` against the pair-packed weights is channel ``i``'s two taps, summed exactly in int32. Per 4
taps and 16 channels: 4 interleaves, 4 widenings, 4 multiply-adds and 4 adds (ymm), against 8 widenings, 8
``vpmulld`` and 8 adds for one int32 multiply per tap.

Implementations (:data:`KINDS`): ``"avx2"`` (ymm), ``"avx512"`` (zmm, AVX512BW), ``"generic"`` (the
description as code). The accumulator lives in ``"local"`` scope.
"""

from __future__ import annotations

import functools

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

KINDS = ("avx2", "avx512", "generic")
U8, I16, I32 = "uint8", "int16", "int32"


def intrin_name(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown depthwise pair-step kind {kind!r}; kinds {KINDS}")
    return f"tvmfuse_depthwise_pairs_4x16_{kind}_local"


@functools.cache
def desc():
    @T.prim_func(s_tir=True)
    def depthwise_pairs_desc(
        A: T.Buffer((4, 16), U8, offset_factor=1),
        B: T.Buffer((2, 16, 2), I16, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4, 0:16], B[0:2, 0:16, 0:2])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk, vi], "int32") * T.cast(B[vk // 2, vi, vk % 2], "int32")

    return depthwise_pairs_desc


def _interleave(lanes: int) -> list[int]:
    """Shuffle indices over two pixels' ``lanes`` channels each, concatenated: channel j of the first, then
    of the second, for each j."""
    return [v for j in range(lanes) for v in (j, lanes + j)]


@functools.cache
def impl(kind: str):
    """Channels in groups of 8 (``"avx2"``, ymm) or 16 (``"avx512"``, zmm): pixels 2p and 2p+1 interleaved
    byte by byte, zero-extended, one ``vpmaddwd`` against taps 2p, 2p+1 of those channels."""
    lanes, madd = {"avx2": (8, "llvm.x86.avx2.pmadd.wd"), "avx512": (16, "llvm.x86.avx512.pmaddw.d.512")}[kind]
    pixel, words, out, order = f"uint8x{lanes}", f"int16x{2 * lanes}", f"int32x{lanes}", _interleave(lanes)

    @T.prim_func(s_tir=True)
    def depthwise_pairs(
        A: T.Buffer((4, 16), U8, offset_factor=1),
        B: T.Buffer((2, 16, 2), I16, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4, 0:16], B[0:2, 0:16, 0:2])
            T.writes(C[0:16])
            for g in T.unroll(16 // lanes):
                c = g * lanes
                C[T.ramp(c, 1, lanes)] = (
                    C[T.ramp(c, 1, lanes)]
                    + T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id(madd),
                        T.Cast(words, T.Shuffle([A.vload([0, c], pixel), A.vload([1, c], pixel)], order)),
                        B.vload([0, c, 0], words), dtype=out)
                    + T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id(madd),
                        T.Cast(words, T.Shuffle([A.vload([2, c], pixel), A.vload([3, c], pixel)], order)),
                        B.vload([1, c, 0], words), dtype=out))

    return depthwise_pairs


def ensure(kind: str) -> str:
    """Register the variant unless it is; return its name."""
    name = intrin_name(kind)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc(), desc() if kind == "generic" else impl(kind))
    return name
