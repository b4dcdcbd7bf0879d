"""Winograd F(2x2, 3x3) and F(4x4, 3x3) conv2d (:mod:`..winograd`) on x86: three stages, each vectorized over
channels.

- input transform: per tile and channel block, column by column, the window's column copied (zero where it
  leaves the map) and its rows transformed into a local buffer; then the columns into the (m+2)^2 transformed
  vectors; all unrolled (sums, differences and multiplications by the matrix's integers), stored once;
- products: per transform position, the register tile of the blocked conv2d (``oc_vectors`` output
  channel vectors x ``tile_block`` tiles, one broadcast per tile and input channel);
- output transform: per m x m output tile, the products' rows transformed into a local buffer, then each
  output pixel from m + 2 of them, unrolled and kept in registers; the partition's epilogue applied to them in
  a loop under the same tile (one copy of its code) before the single store.

Two stages per transform instead of one expression per value: F(4x4)'s sums of sums, unrolled, were too large
for TVM's simplifier and LLVM (a 256-channel kernel built in 15 s, 0.6 s this way).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..computes import winograd
from ..common import accumulate_in_registers, block_names, inline_epilogue, loops_below, register_tile, vectorize_tile
from .conv2d_nchwc import inline_views

ANCHOR = winograd.ANCHOR


@dataclasses.dataclass(frozen=True)
class Config:
    """``oc_vectors`` output channel vectors x ``tile_block`` tiles of accumulators in the products."""

    oc_vectors: int = 2
    tile_block: int = 4


def default_config(out_blocks: int, vector_lanes: int) -> Config:
    """2 x 4 on AVX2 (256ch at 14x14: 141 GFLOP/s in the products; 1 x 7 and 4 x 2 were slower), 4 x 4 on
    AVX-512 where the channel count allows (not measured: no AVX-512 machine here)."""
    vectors = 4 if vector_lanes >= 16 and out_blocks % 4 == 0 else 2 if out_blocks % 2 == 0 else 1
    return Config(vectors, 4)


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, config) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    names = block_names(sch)
    if ANCHOR not in names or winograd.PRODUCT not in names:
        return False
    for name in ("A", "B"):
        if name in names:
            sch.compute_inline(sch.get_sblock(name))
    inline_views(sch)
    epilogue = inline_epilogue(sch, ANCHOR)
    product = sch.get_sblock(winograd.PRODUCT)
    e, _, ob = sch.get_loops(product)[:3]
    out_blocks, tile = int(sch.get(ob).extent), int(sch.get(e).extent) - winograd.KERNEL + 1
    cfg = config or default_config(out_blocks, vector_lanes)
    _input_transform(sch)
    _products(sch, product, cfg)
    _output_transform(sch, epilogue, tile)
    return True


def _input_transform(sch: s_tir.Schedule) -> None:
    block = sch.get_sblock(winograd.INPUT)
    e, u, cb, p, c = sch.get_loops(block)
    sch.reorder(cb, p, e, u, c)
    tile = sch.fuse(cb, p)
    sch.parallel(tile)
    vectorize_tile(sch, block, tile)
    rows = sch.get_sblock(winograd.INPUT_ROWS)
    sch.compute_at(rows, tile, preserve_unit_loops=True)
    e, column, *_ = loops_below(sch, rows, tile)
    sch.reorder(column, e)
    vectorize_tile(sch, rows, tile)
    # The window's column, zero-padded at the map's edge, copied once and transformed from the copy: read
    # through the padding's bounds tests inside the unrolled sums, a kernel took TVM 2-3x longer to build
    # (256 channels at 14x14: 0.57 -> 0.20 s) and ran no faster (0.374 -> 0.370 ms).
    pad = sch.get_sblock("pad_temp")
    sch.compute_at(pad, column, preserve_unit_loops=True)
    vectorize_tile(sch, pad, column)


def _products(sch: s_tir.Schedule, block, cfg: Config) -> None:
    e, u, ob, p, o, rco, rci = sch.get_loops(block)
    ob_o, ob_i = sch.split(ob, [None, cfg.oc_vectors])
    p_o, p_i = sch.split(p, [None, cfg.tile_block])
    sch.reorder(e, u, ob_o, p_o, rco, rci, p_i, ob_i, o)
    register_tile(sch, block, None, p_o, [p_i, ob_i], o)
    sch.parallel(sch.fuse(e, u, ob_o))
    vectorize_tile(sch, sch.decompose_reduction(block, rco), p_o)


def _output_transform(sch: s_tir.Schedule, epilogue, tile: int) -> None:
    block = sch.get_sblock(ANCHOR)
    n, ob, y, x, o = sch.get_loops(block)
    yt, yi = sch.split(y, [None, tile])
    xt, xi = sch.split(x, [None, tile])
    sch.reorder(n, ob, yt, xt, yi, xi, o)
    sch.parallel(sch.fuse(n, ob, yt))
    sch.unroll(yi)
    sch.unroll(xi)
    sch.vectorize(o)
    rows = sch.get_sblock(winograd.OUTPUT_ROWS)
    sch.compute_at(rows, xt, preserve_unit_loops=True)
    vectorize_tile(sch, rows, xt)
    if epilogue is None:
        return
    # the tile's m x m output vectors kept in registers and the epilogue applied to them in a loop: unrolled
    # with them, a SiLU's exp was four copies of its code (YOLOv8n's Winograd kernels 0.43 -> 0.62 s to build)
    consumer = accumulate_in_registers(sch, block, epilogue, xt)
    sch.vectorize(sch.get_loops(consumer)[-1])