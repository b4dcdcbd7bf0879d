"""u8 x s8 -> i32 16x4 dot-product tensor intrinsics: AVX512-VNNI ``vpdpbusd`` that LLVM 22 accepts, and the
step's description as code. (CPUs without VNNI take the weights as int16 pairs: :mod:`.madd_pairs`.)

What every variant computes (the description, identical to TVM's ``dot_product_16x4_u8i8i32_desc``)::

    C[i] += int32(A[k]) * int32(B[i, k])      for i < 16, k < 4
    A: (4,) uint8   B: (16, 4) int8 (64 contiguous bytes)   C: (16,) int32

TVM 0.27 ships this intrinsic as ``dot_16x4_vnni``, but its implementation passes ``<16 x i32>`` operands to
``llvm.x86.avx512.vpdpbusd.512``, whose signature became ``(<16 x i32>, <64 x i8>, <64 x i8>)`` in LLVM 21
(llvm/llvm-project PR #155194); LLVM 22's verifier rejects every kernel tensorized with it. Ours passes byte
vectors: A's 4 bytes broadcast to 64, B's 64 bytes as they lie in memory.

Implementations (:data:`KINDS`):

- ``"vnni"``: one ``vpdpbusd`` (zmm).
- ``"vnni256"``: two ``vpdpbusd`` on ymm, 8 outputs each: AVX-VNNI (the VEX form on CPUs without AVX-512:
  Alder Lake and later client cores, Sierra Forest) or AVX512-VNNI with VL; LLVM picks the encoding from the
  target's features.
- ``"generic"``: the description itself, plain loops that LLVM vectorizes for whatever the target has: int8
  weights on a CPU without VNNI, and how the tests run a VNNI-tiled schedule on CPUs without VNNI.

The accumulator C lives in ``"global"`` scope in TVM's convention (what MetaSchedule tensorizes) and in
``"local"`` scope in tvmfuse's schedules (register tiles): each (kind, scope) is its own intrinsic name,
:func:`intrin_name`.

Nothing is registered at import. :func:`register` adds the ``"vnni"`` intrinsics and, by default, replaces
TVM's broken :data:`STOCK_NAME` (MetaSchedule's ``DefaultX86("vnni")`` rules look the intrinsic up by that
name); :func:`ensure` registers one (kind, scope) on first use, which the schedules call.
"""

from __future__ import annotations

import functools
import sys

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.target import codegen

STOCK_NAME = "dot_16x4_vnni"
# The module whose import registers TVM's stock x86 intrinsics (and with them the broken STOCK_NAME).
STOCK_MODULE = "tvm.s_tir.tensor_intrin.x86"
KINDS = ("vnni", "vnni256", "generic")
SCOPES = ("global", "local")
INTRIN_NAME = "tvmfuse_dot_16x4_vnni"  # the "vnni" kind with a global accumulator: TVM's convention

LANES = 16  # int32 outputs per call (one zmm register)
REDUCE = 4  # u8 x s8 products summed into each output
# Dtypes of A, B, C (names, not literals, in the TVMScript signatures: linters read literals there as types).
U8, S8, I32 = "uint8", "int8", "int32"


def intrin_name(kind: str = "vnni", scope: str = "global") -> str:
    """The registry name of one variant (``tvmfuse_dot_16x4_<kind>[_local]``)."""
    if kind not in KINDS or scope not in SCOPES:
        raise ValueError(f"unknown 16x4 dot-product variant ({kind!r}, {scope!r}); kinds {KINDS}, scopes {SCOPES}")
    return f"tvmfuse_dot_16x4_{kind}" + ("_local" if scope == "local" else "")


@functools.cache
def desc(scope: str = "global"):
    """The description PrimFunc, with the accumulator C in ``scope``."""

    @T.prim_func(s_tir=True)
    def dot_16x4_desc(
        A: T.Buffer((4,), U8, offset_factor=1),
        B: T.Buffer((16, 4), S8, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return dot_16x4_desc


@functools.cache
def vnni_impl(scope: str = "global"):
    """``vpdpbusd``: byte 4j+k of the second operand (unsigned) times byte 4j+k of the third (signed),
    four products added to int32 lane j. A is broadcast to every lane, B's row j lies in lane j."""

    @T.prim_func(s_tir=True)
    def dot_16x4_vnni(
        A: T.Buffer((4,), U8, offset_factor=1),
        B: T.Buffer((16, 4), S8, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            A_i32 = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            A_u8x64 = T.reinterpret(T.broadcast(A_i32, 16), dtype="uint8x64")
            B_i8x64 = B.vload([0, 0], dtype="int8x64")
            C_i32x16 = C.vload([0], dtype="int32x16")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C_i32x16,
                A_u8x64,
                B_i8x64,
                dtype="int32x16",
            )

    return dot_16x4_vnni


@functools.cache
def vnni256_impl(scope: str = "global"):
    """``vpdpbusd`` on ymm: outputs 8h to 8h+7 from B's rows 8h to 8h+7 (32 bytes), A broadcast to 32 bytes."""

    @T.prim_func(s_tir=True)
    def dot_16x4_vnni256(
        A: T.Buffer((4,), U8, offset_factor=1),
        B: T.Buffer((16, 4), S8, offset_factor=1),
        C: T.Buffer((16,), I32, offset_factor=1, scope=scope),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            A_u8x32 = T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], "uint8x4"), dtype="int32"), 8),
                                    dtype="uint8x32")
            for h in T.unroll(2):
                C[T.ramp(h * 8, 1, 8)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.256"),
                    C[T.ramp(h * 8, 1, 8)], A_u8x32, B.vload([h * 8, 0], dtype="int8x32"), dtype="int32x8")

    return dot_16x4_vnni256


_IMPLS = {"vnni": vnni_impl, "vnni256": vnni256_impl, "generic": desc}


def is_registered(name: str) -> bool:
    """True when a tensor intrinsic called ``name`` is registered in this process."""
    return TensorIntrin.get(name, allow_missing=True) is not None


def ensure(kind: str = "vnni", scope: str = "global") -> str:
    """Register the (kind, scope) variant unless it is; return its name. TVM's own names are left alone."""
    name = intrin_name(kind, scope)
    if not is_registered(name):
        TensorIntrin.register(name, desc(scope), _IMPLS[kind](scope))
    return name


def register(override_stock: bool = True) -> list[str]:
    """Register the VNNI intrinsic (both accumulator scopes); return the names that now map to it.

    Parameters
    ----------
    override_stock : bool
        Also replace TVM's :data:`STOCK_NAME` (global accumulator), so that MetaSchedule's VNNI rules
        tensorize with ours. TVM registers its own version when :data:`STOCK_MODULE` is first imported and
        refuses a second registration without ``override``; the module is therefore imported here first
        (the ``tvm.s_tir.tensor_intrin`` package takes ~30 s to import), so that a later import by
        MetaSchedule can neither fail nor undo the override. Idempotent.
    """
    names = [ensure("vnni", scope) for scope in SCOPES]
    if override_stock:
        __import__(STOCK_MODULE)
        TensorIntrin.register(STOCK_NAME, desc("global"), vnni_impl("global"), override=True)
        names.append(STOCK_NAME)
    return names


def stock_overridden() -> bool:
    """True when :data:`STOCK_NAME` resolves to tvmfuse's implementation (False if TVM's or missing)."""
    import tvm_ffi  # tvm.ir.structural_equal is gone in TVM 0.27

    if STOCK_MODULE not in sys.modules or not is_registered(STOCK_NAME):
        return False
    return bool(tvm_ffi.structural_equal(TensorIntrin.get(STOCK_NAME).impl, vnni_impl("global")))


def target_has_vnni(target) -> bool:
    """True when the LLVM target (``tvm.target.Target``) has AVX512-VNNI."""
    return target.kind.name == "llvm" and bool(codegen.llvm_cpu_has_features(["avx512vnni"], target))


def target_has_avx_vnni(target) -> bool:
    """True when the LLVM target has AVX-VNNI (``vpdpbusd`` on ymm without AVX-512)."""
    return target.kind.name == "llvm" and bool(codegen.llvm_cpu_has_features(["avxvnni"], target))
