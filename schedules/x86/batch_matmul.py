"""Batched MatMul (``A[..., M, K] x B[..., K, N]``, both activations: attention) on x86.

Each batch (the leading dims fused, one per head) is a small dense product, tiled as :mod:`.dense` tiles
its ``[M, K] x [K, N]``: an ``m_block x n_block`` register tile of whole vectors of N, one broadcast of A per
row and one load of B per vector, K unrolled, the epilogue applied to the registers before the store. B read
transposed (``K^T``) is first copied into ``[K, N]`` order per batch (``batch_matmul.PACK``, vectorized along
N), so the tile's loads are contiguous. Batches are the parallel loop; a single batch spreads its tiles.
"""

from __future__ import annotations

from tvm import s_tir

from ..computes.batch_matmul import ANCHOR, PACK
from ..common import (accumulate_in_registers, block_names, dividing_vector, inline_epilogue, inline_producers,
                      vectorize_tile)
from . import dense

Config = dense.Config


def default_config(n: int, k: int, vector_lanes: int, m: int) -> Config:
    """The dense rule's tile for one batch's ``[M, K] x [K, N]``."""
    return dense.default_config(n, k, vector_lanes, m)


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    names = block_names(sch)
    if ANCHOR not in names:
        return False
    anchor = sch.get_sblock(ANCHOR)
    loops = sch.get_loops(anchor)
    if len(loops) < 3:
        return False
    inline_producers(sch, ANCHOR, keep=(PACK,))
    *batch, i, j, k = loops
    n, k_extent, m = (int(sch.get(loop).extent) for loop in (j, k, i))
    cfg = config or default_config(n, k_extent, vector_lanes, m)
    epilogue = inline_epilogue(sch, ANCHOR)
    batch = sch.fuse(*batch) if len(batch) > 1 else (batch[0] if batch else sch.add_unit_loop(anchor))
    i_o, i_i = sch.split(i, [None, cfg.m_block])
    vector = dividing_vector(cfg.n_block, vector_lanes) or cfg.n_block
    j_o, j_v, j_i = sch.split(j, [None, cfg.n_block // vector, vector])
    k_o, k_i = sch.split(k, [None, cfg.k_unroll])
    sch.reorder(batch, j_o, i_o, k_o, k_i, i_i, j_v, j_i)
    for loop in (k_i, i_i, j_v):
        sch.unroll(loop)
    sch.vectorize(j_i)
    consumer = accumulate_in_registers(sch, anchor, epilogue, i_o)
    vectorize_tile(sch, consumer, i_o, vector_lanes)
    if PACK in names:
        pack = sch.get_sblock(PACK)
        sch.compute_at(pack, batch, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(pack)[-1])
    tile = i_o
    if int(sch.get(batch).extent) > 1:
        sch.parallel(batch)
    elif PACK not in names:  # one batch: its tiles spread (a pack sits under the batch loop, so not then)
        tile = sch.fuse(j_o, i_o)
        if m * n * k_extent >= dense.PARALLEL_MACS:
            sch.parallel(tile)
    vectorize_tile(sch, sch.decompose_reduction(anchor, k_o), tile, vector_lanes)
    return True
