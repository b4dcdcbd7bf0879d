"""Ops on uint8 codes on x86 (the computes are :mod:`..int8_se` and :mod:`..int8_concat`): the channel gate and
the spatial mean of NCHW16c codes, 16 channels of a pixel per vector, and the channel concat.

- ``codes_gate``: channel blocks in parallel (a single block: its rows), each pixel's 16 codes widened to
  float32 in one vector, scaled by the block's 16 gates (computed once per block, one vector load per
  pixel) and narrowed back.
- ``codes_mean``: channel blocks in parallel, the int32 sums of a block's 16 channels in one vector over the
  pixels (the reduction outside the lanes), then one requantized vector per block.

- ``codes_concat``: the channel loop split at the inputs' borders, so each part reads one input (its select
  of inputs resolved by the part's bounds); rows in parallel, the innermost loop a vector.

NCHW codes of the gate and mean (no INT8 kernel upstream writes them blocked) are left to :mod:`.generic`.
"""

from __future__ import annotations

from tvm import s_tir

from ..common import block_names, iterations
from ..computes.int8_concat import CONCAT_STAGE, STARTS
from ..computes.int8_se import GATE_LANES, GATE_STAGE, MEAN_STAGES
from .concat import channel_parts
from .generic import PARALLEL_MIN


def _gate(sch: s_tir.Schedule) -> bool:
    block = sch.get_sblock(GATE_STAGE)
    loops = sch.get_loops(block)
    if len(loops) != 5:
        return False
    b, c, y, x, lane = loops
    blocks = sch.fuse(b, c)  # channel blocks in parallel; a single block: its rows
    if iterations(sch, block) >= PARALLEL_MIN:
        sch.parallel(blocks if int(sch.get(blocks).extent) > 1 else y)
    sch.vectorize(lane)
    # The block's 16 scaled gates computed once per block (the last block's lanes past the channels read the
    # last gate: no ramp), so each pixel loads them as one vector.
    sch.compute_at(sch.get_sblock(GATE_LANES), blocks)
    return True


def _mean(sch: s_tir.Schedule) -> bool:
    total, out = (sch.get_sblock(name) for name in MEAN_STAGES)
    loops = sch.get_loops(total)
    if len(loops) != 7:
        return False
    b, c, y, x, lane, ry, rx = loops
    sch.reorder(b, c, y, x, ry, rx, lane)
    blocks = sch.fuse(b, c)
    sch.reverse_compute_at(out, blocks)
    if iterations(sch, total) >= PARALLEL_MIN:
        sch.parallel(blocks)
    sch.vectorize(lane)  # while the sum still has its init (a reduction block); the init then moves out
    sch.decompose_reduction(total, ry)
    sch.vectorize(sch.get_loops(out)[-1])
    return True


def _concat(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    block = sch.get_sblock(CONCAT_STAGE)
    starts = [int(v) for v in sch.get(block).annotations[STARTS]]
    channels = sch.get_loops(block)[1]
    sizes = [b - a for a, b in zip(starts, starts[1:])]
    for rest in channel_parts(sch, block, channels, sizes):  # columns (, lanes)
        if int(sch.get(rest[-1]).extent) % vector_lanes == 0 or len(rest) == 2:
            sch.vectorize(rest[-1])
    return True


def schedule(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    """Apply the rule to ``sch`` in place; False when the kernel is not one of NCHW16c codes (``sch`` may
    then be partly changed: the backend starts afresh)."""
    names = block_names(sch)
    if names == [CONCAT_STAGE]:
        return _concat(sch, vector_lanes)
    if names == [GATE_LANES, GATE_STAGE]:
        return _gate(sch)
    if names == list(MEAN_STAGES):
        return _mean(sch)
    return False
