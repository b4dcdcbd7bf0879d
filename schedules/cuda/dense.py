"""dense (``data[M, K] x weight``, fp32) on CUDA: a GEMV for the few rows of batch-1 inference, the
implicit-GEMM tiles of :mod:`.conv2d` from ``GEMM_ROWS`` rows up.

For the GEMV the backend packs the ``[K, N]`` weight ``[N, K, 1]`` at compile time
(:meth:`tvmfuse.schedules.cuda.Backend.weight_block`), so each output's K weights are contiguous and
:func:`.gemv.schedule_rows` gives every output a warp whose lanes read neighbouring weights (coalesced, each
weight read once) and add their partial sums by warp shuffles; the epilogue is applied to the sum before the
single store.
"""

from __future__ import annotations

from tvm import s_tir

from ..common import anchor_loops
from . import conv2d, gemv

ANCHOR = "T_matmul_NN"
GEMM_ROWS = 16


def kernel_candidates(func, sms: int) -> list:
    """The GEMM tiles an offline tuning round times (:func:`.conv2d.gemm_candidates`); none for a GEMV."""
    sch = s_tir.Schedule(func)
    found = anchor_loops(sch, ANCHOR, 3)
    if found is None or int(sch.get(found[1][0]).extent) < GEMM_ROWS:
        return []
    return conv2d.gemm_candidates(func, sms, ANCHOR)


def schedule(sch: s_tir.Schedule, sms: int, config=None) -> bool:
    """Schedule a dense partition kernel in place; False (``sch`` untouched) when it is not one, or has few
    rows and an unpacked weight. ``config``: the GEMM tiles (from ``GEMM_ROWS`` rows up)."""
    found = anchor_loops(sch, ANCHOR, 3)
    if found is None:
        return False
    main, (rows, _, _) = found
    if int(sch.get(rows).extent) >= GEMM_ROWS:
        return conv2d.schedule_gemm(sch, ANCHOR, sms, config)
    if any(len(r.region) == 3 for r in sch.get(main).reads):  # weight [N, K, 1]
        return gemv.schedule_rows(sch, ANCHOR)
    return False
