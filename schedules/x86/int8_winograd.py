"""INT8 Winograd F(2x2, 3x3) conv2d (:mod:`..computes.int8_winograd`) on x86 without VNNI.

The transforms are FP32 Winograd's schedules (:mod:`.conv2d_winograd`: vectorized over a block's 16
channels, here 16 int16 lanes in the input and 16 int32 in the output, the epilogue on the output tile's
registers). The products are the pair step (:mod:`.intrin.madd_pairs`, int16 data): per transform position a
register tile of ``oc_blocks`` x 16 output channels by ``tile_block`` tiles, each step broadcasting a tile's
two int16 pairs from memory against 16 outputs' weight pairs.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir

from ..common import accumulate_in_registers, block_names, inline_epilogue, vectorize_tile
from ..computes import int8_winograd, winograd
from . import conv2d_winograd
from .conv2d_nchwc import inline_views
from .intrin import madd_pairs


# (channel blocks, tiles) of the register tile, in order of preference
TILES = ((2, 3), (1, 6), (1, 4), (2, 2), (1, 3), (1, 2), (1, 1))


@dataclasses.dataclass(frozen=True)
class Config:
    """``oc_blocks`` blocks of 16 output channels x ``tile_block`` tiles of accumulators (2 ymm per block and
    tile with AVX2). ``dot``: the step's kind (:mod:`.intrin.madd_pairs`; None: from the vector width)."""

    oc_blocks: int = 2
    tile_block: int = 3
    dot: str | None = None


def default_config(out_blocks: int, tiles: int, vector_bits: int) -> Config:
    """The first of :data:`TILES` that divides the channel blocks and the tiles: at most 12 ymm of accumulators,
    the pair step's budget (:func:`.int8_conv2d.accumulators`); (1, 1) always does."""
    return next(Config(b, t) for b, t in TILES if out_blocks % b == 0 and tiles % t == 0)


def matches(sch: s_tir.Schedule) -> bool:
    names = block_names(sch)
    return winograd.PRODUCT in names and winograd.ANCHOR in names


def schedule(sch: s_tir.Schedule, vector_bits: int, config: Config | None = None) -> bool:
    """Apply the rule in place; False (``sch`` untouched) when ``sch`` is not an INT8 Winograd kernel or
    ``config`` does not divide it."""
    if not matches(sch):
        return False
    product = sch.get_sblock(winograd.PRODUCT)
    e, u, ob, p, oi, rcb, rk = sch.get_loops(product)
    cfg = config or default_config(int(sch.get(ob).extent), int(sch.get(p).extent), vector_bits)
    if int(sch.get(ob).extent) % cfg.oc_blocks or int(sch.get(p).extent) % cfg.tile_block:
        return False
    inline_views(sch)
    epilogue = inline_epilogue(sch, winograd.ANCHOR)
    conv2d_winograd._input_transform(sch)
    ob_o, ob_i = sch.split(ob, [None, cfg.oc_blocks])
    p_o, p_i = sch.split(p, [None, cfg.tile_block])
    sch.reorder(e, u, ob_o, p_o, rcb, ob_i, p_i, oi, rk)
    sch.unroll(ob_i)
    sch.unroll(p_i)
    consumer = accumulate_in_registers(sch, product, None, p_o)
    vectorize_tile(sch, consumer, p_o)
    sch.parallel(sch.fuse(e, u, ob_o))
    vectorize_tile(sch, sch.decompose_reduction(product, rcb), p_o)
    sch.tensorize(oi, madd_pairs.ensure(cfg.dot or madd_pairs.kind_for(vector_bits), "int16"))
    conv2d_winograd._output_transform(sch, epilogue, int8_winograd.TILE)
    return True
