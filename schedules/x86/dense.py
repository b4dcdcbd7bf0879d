"""Dense (``data[M, K] x weight[K, N]``, constant weight) on x86.

At batch 1 this is a matrix-vector product bound by reading the weight once: each task owns ``n_block``
output columns held in registers and streams the matching weight columns row by row (contiguous
vector loads), the fused epilogue applied before the store.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..common import accumulate_in_registers, anchor_loops, inline_epilogue, largest_divisor, vectorize_tile

ANCHOR = "T_matmul_NN"


@dataclasses.dataclass(frozen=True)
class Config:
    n_block: int
    k_unroll: int


def default_config(n: int, k: int, vector_lanes: int) -> Config:
    """Up to 5 whole vectors of outputs per task (else the largest divisor of N up to 4 vectors); K unrolled by 8.

    Whole vectors matter: N = 1000 split 25 wide streams 100-byte row pieces in 3 partial vectors, 1.5x slower
    than 40 wide (measured on MobileNetV2's classifier, 1280 x 1000).
    """
    whole = [d for d in range(vector_lanes, 5 * vector_lanes + 1, vector_lanes) if n % d == 0]
    return Config(whole[-1] if whole else largest_divisor(n, 4 * vector_lanes), largest_divisor(k, 8))


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule ``func`` (a fused partition kernel); None when it is not this rule's kernel."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, config) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    match = anchor_loops(sch, ANCHOR, 3)
    if match is None:
        return False
    anchor, (i, j, k) = match
    cfg = config or default_config(int(sch.get(j).extent), int(sch.get(k).extent), vector_lanes)
    epilogue = inline_epilogue(sch, ANCHOR)
    j_o, j_i = sch.split(j, [None, cfg.n_block])
    k_o, k_i = sch.split(k, [None, cfg.k_unroll])
    sch.reorder(j_o, i, k_o, k_i, j_i)
    sch.unroll(k_i)
    sch.vectorize(j_i)
    consumer = accumulate_in_registers(sch, anchor, epilogue, i)
    vectorize_tile(sch, consumer, i)
    sch.parallel(j_o)
    vectorize_tile(sch, sch.decompose_reduction(anchor, k_o), i)
    return True
