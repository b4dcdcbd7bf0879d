"""INT8 dense (:func:`tvmfuse.schedules.computes.int8.dense_compute`) on x86.

Each task owns ``n_blocks`` x 16 output features; ``m_block`` rows by those features accumulate in vector
registers while the packed weight streams through once per row tile (at batch 1 the kernel is bound by
reading the weight). The 16x4 step is the same as in :mod:`.int8_conv2d`: ``vpdpbusd`` with VNNI,
``vpmaddwd`` on int16 weight pairs otherwise; the requantize epilogue runs on the registers before the only
store.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from .. import families
from ..computes import int8
from ..common import anchor_loops, accumulate_in_registers, block_names, inline_epilogue, largest_divisor, vectorize_tile
from .int8_conv2d import accumulators, dot_kind, exact_pairs_marked, intrinsic, weight_pairs

ANCHOR, PAD = families.DENSE.int8.anchor_block, families.DENSE.int8.pad_block


@dataclasses.dataclass(frozen=True)
class Config:
    """``m_block`` rows x ``n_blocks`` 16-feature blocks per register tile; ``dot`` as in
    :class:`.int8_conv2d.Config`."""

    m_block: int
    n_blocks: int
    dot: str | None = None


def default_config(m: int, feature_blocks: int, vector_bits: int, has_vnni: bool, pairs: bool = False,
                   exact_pairs: bool = False) -> Config:
    """Up to 4 feature blocks per task (fewer where the registers or the block count say so), then rows."""
    per_block = max(1, int8.BLOCK_O * 32 // vector_bits)
    budget = accumulators(vector_bits, dot_kind(vector_bits, has_vnni, pairs, exact_pairs))
    n_blocks = largest_divisor(feature_blocks, min(4, max(1, budget // per_block)))
    return Config(largest_divisor(m, max(1, budget // (n_blocks * per_block))), n_blocks)


def apply(func: tirx.PrimFunc, vector_bits: int, has_vnni: bool, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule an INT8 dense kernel; None when ``func`` is not one (or ``config`` does not divide it)."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_bits, has_vnni, config) else None


def schedule(sch: s_tir.Schedule, vector_bits: int, has_vnni: bool, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it does not match."""
    names = block_names(sch)
    match = anchor_loops(sch, ANCHOR, 3)
    if match is None:
        return False
    anchor, (i, j, k) = match
    m, features = int(sch.get(i).extent), int(sch.get(j).extent)
    if features % int8.BLOCK_O or int(sch.get(k).extent) % int8.BLOCK_I:
        return False
    pairs, exact = weight_pairs(sch, anchor), exact_pairs_marked(sch)
    cfg = config or default_config(m, features // int8.BLOCK_O, vector_bits, has_vnni, pairs, exact)
    if m % cfg.m_block or (features // int8.BLOCK_O) % cfg.n_blocks:
        return False
    dot = cfg.dot or dot_kind(vector_bits, has_vnni, pairs, exact)
    epilogue = inline_epilogue(sch, ANCHOR)
    jb, oi = sch.split(j, [None, int8.BLOCK_O])
    jb_o, jb_i = sch.split(jb, [None, cfg.n_blocks])
    i_o, i_i = sch.split(i, [None, cfg.m_block])
    kb, ki = sch.split(k, [None, int8.BLOCK_I])
    sch.reorder(jb_o, i_o, kb, i_i, jb_i, oi, ki)
    sch.unroll(i_i)
    sch.unroll(jb_i)
    consumer = accumulate_in_registers(sch, anchor, epilogue, i_o)
    # one 16-feature vector at a time: LLVM scalarizes a 48-lane epilogue (3 blocks, as 1,170 blocks get) into
    # element inserts and extracts, 4-7x the whole kernel's time
    vectorize_tile(sch, consumer, i_o, vector_lanes=int8.BLOCK_O)
    sch.parallel(sch.fuse(jb_o, i_o))
    tile = sch.get_loops(consumer)[0]
    vectorize_tile(sch, sch.decompose_reduction(anchor, kb), tile)
    sch.tensorize(oi, intrinsic(dot, pairs))
    if PAD in names:
        pad = sch.get_sblock(PAD)
        row, col = sch.get_loops(pad)
        sch.parallel(row)
        sch.vectorize(col)
    return True
