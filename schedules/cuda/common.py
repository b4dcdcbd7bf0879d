"""What the CUDA rules share: the limits they stay within, the SM counts grids are sized for, and the
cooperative copy into shared memory."""

from __future__ import annotations

import functools

from tvm import s_tir

from ..common import loops_below

WARP = 32
# Every rule stays within the static shared memory of any NVIDIA GPU since sm_30 (48 KiB per block); the
# CUDA targets declare it (``tvmfuse.targets``), and MetaSchedule's GPU verifier reads it there.
MAX_SHARED_BYTES = 48 * 1024
# Streaming multiprocessors by compute capability, for grid-size choices (data-centre parts: A100, H100).
MAX_WASTE = 0.15  # padded share of a tiled GEMM's I x J a tile may add (more where every tile does)
SM_COUNT = {"sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132, "sm_90a": 132}


def sm_count(arch: str) -> int:
    return SM_COUNT.get(arch, 80)


def cooperative_copy(sch: s_tir.Schedule, block, at, threads: int) -> None:
    """Spread a shared-memory fill (``block``, placed under loop ``at``) over the ``threads`` threads of the
    block: its loops below ``at`` fused, split by the thread count, bound to ``threadIdx.x``."""
    fused = sch.fuse(*loops_below(sch, block, at))
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def fill_sms(configs: list, i: int, j: int, sms: int):
    """The first of ``configs`` (largest tile first; anything with ``tile_i``/``tile_j``) whose grid gives every
    SM a block, else the last, among those padding the ``I x J`` GEMM by at most ``MAX_WASTE`` (or as little as
    any of them does)."""

    def waste(c) -> float:
        return (-(-i // c.tile_i) * c.tile_i * -(-j // c.tile_j) * c.tile_j) / (i * j) - 1

    allowed = max(MAX_WASTE, min(waste(c) for c in configs) + 0.01)  # a 7x7 map pads to 64 pixels in every tile
    fitting = [c for c in configs if waste(c) <= allowed]
    for config in fitting:
        if -(-i // config.tile_i) * -(-j // config.tile_j) >= sms:
            return config
    return fitting[-1]


@functools.cache
def lower_llvm_fma() -> None:
    """Teach TVM's CUDA lowering the INT8 epilogue's ``llvm.fma`` (one rounding, what keeps a residual add
    bit-exact on the CPU): CUDA's ``fmaf``, which rounds once too. TVM has no CUDA rule for LLVM intrinsics
    (nor for ``tirx.fma``); the rule returns every other call unchanged. Registered once, when a CUDA backend
    is made."""
    import tvm
    from tvm import tirx

    fma_id = int(tvm.target.codegen.llvm_lookup_intrinsic_id("llvm.fma"))

    def lower(call):
        if int(call.args[0]) == fma_id:
            return tirx.call_pure_extern(call.ty, "fmaf", *call.args[1:])
        return call

    tirx.op.register_intrin_lowering("tirx.call_llvm_pure_intrin", "cuda", f=lower, level=99)
