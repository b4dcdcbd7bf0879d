"""The depthwise u8 x s8 -> i32 step for AVX512-VNNI: four kernel taps of 16 channels in one ``vpdpbusd``.

What it computes (the description)::

    C[i] += int32(A[k, i]) * int32(B[i, k])      for i < 16, k < 4
    A: (4, 16) uint8, 4 consecutive NCHW16c pixels (64 contiguous bytes)
    B: (16, 4) int8, channel i's 4 taps in one 32-bit word (64 contiguous bytes)
    C: (16,) int32

A depthwise conv has no reduction over channels, so the GEMM step of
:mod:`tvmfuse.schedules.x86.intrin.vnni` (one pixel's 4 channels against 16 outputs) has nothing to do. Here
the 4 products that ``vpdpbusd`` sums in each lane are 4 taps of one channel along a kernel row instead: the
64 bytes of 4 neighbouring pixels are loaded at once and transposed in the register (a byte shuffle, one
``vpermb`` on CPUs with AVX512-VBMI) so that lane i holds channel i of the 4 pixels, then multiplied by the
weight packed ``[.., 16, 4]`` (``int8_depthwise.pack_weight_vnni``). A 3x3 kernel takes three steps per
output pixel instead of nine int32 multiply-adds, a 5x5 ten (the fourth tap of each row's second group has
a zero weight) instead of 25.

Implementations: ``"vnni"`` (the shuffle and one ``vpdpbusd``) and ``"generic"`` (the description, which
LLVM vectorizes for any CPU: how the tests run the tiling on CPUs without VNNI). The accumulator lives in
``"local"`` scope (register tiles). Nothing is registered at import: :func:`ensure` does it on first use.
"""

from __future__ import annotations

import functools

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

KINDS = ("vnni", "generic")
LANES = 16  # channels (int32 lanes of one zmm register)
TAPS = 4  # taps summed per lane
# Byte 4i + k of the shuffled vector is tap k of channel i: byte 16k + i of the 4 pixels as loaded.
TRANSPOSE = [k * LANES + i for i in range(LANES) for k in range(TAPS)]
U8, S8, I32 = "uint8", "int8", "int32"


def intrin_name(kind: str = "vnni") -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown depthwise dot-product kind {kind!r}; kinds {KINDS}")
    return f"tvmfuse_depthwise_4x16_{kind}_local"


@functools.cache
def desc():
    @T.prim_func(s_tir=True)
    def depthwise_4x16_desc(
        A: T.Buffer((4, 16), U8, offset_factor=1),
        B: T.Buffer((16, 4), S8, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4, 0:16], B[0:16, 0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk, vi], "int32") * T.cast(B[vi, vk], "int32")

    return depthwise_4x16_desc


@functools.cache
def vnni_impl():
    @T.prim_func(s_tir=True)
    def depthwise_4x16_vnni(
        A: T.Buffer((4, 16), U8, offset_factor=1),
        B: T.Buffer((16, 4), S8, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope="local"),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4, 0:16], B[0:16, 0:4])
            T.writes(C[0:16])
            pixels = A.vload([0, 0], "uint8x64")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"),
                T.Shuffle([pixels], TRANSPOSE),
                B.vload([0, 0], dtype="int8x64"),
                dtype="int32x16",
            )

    return depthwise_4x16_vnni


_IMPLS = {"vnni": vnni_impl, "generic": desc}


def ensure(kind: str = "vnni") -> str:
    """Register the variant unless it is; return its name."""
    name = intrin_name(kind)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc(), _IMPLS[kind]())
    return name
