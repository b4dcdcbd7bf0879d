"""What the CUDA rules share: the limits they stay within, the SM counts grids are sized for, and the
cooperative copy into shared memory."""

from __future__ import annotations

from tvm import s_tir

from ..common import loops_below

WARP = 32
# Every rule stays within the static shared memory of any NVIDIA GPU since sm_30 (48 KiB per block); the
# CUDA targets declare it (``tvmfuse.targets``), and MetaSchedule's GPU verifier reads it there.
MAX_SHARED_BYTES = 48 * 1024
# Streaming multiprocessors by compute capability, for grid-size choices (data-centre parts: A100, H100).
SM_COUNT = {"sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132, "sm_90a": 132}


def sm_count(arch: str) -> int:
    return SM_COUNT.get(arch, 80)


def cooperative_copy(sch: s_tir.Schedule, block, at, threads: int) -> None:
    """Spread a shared-memory fill (``block``, placed under loop ``at``) over the ``threads`` threads of the
    block: its loops below ``at`` fused, split by the thread count, bound to ``threadIdx.x``."""
    fused = sch.fuse(*loops_below(sch, block, at))
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")
