"""Depthwise conv2d (groups == channels, NCHW) on x86: memory bound, so one pass over each plane.

Channels run in parallel; each channel's padded plane is built right before use (it stays in L1/L2),
each output row is computed ``ow_block`` pixels at a time in vector registers with the kernel window
unrolled, and the fused epilogue is applied before the store.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..common import accumulate_in_registers, block_names, inline_epilogue, largest_divisor, vectorize_tile

ANCHOR = "DepthwiseConv2d"


@dataclasses.dataclass(frozen=True)
class Config:
    ow_block: int


def default_config(out_width: int, vector_lanes: int) -> Config:
    """A full vector of pixels where the row allows (8 beat 4, 14, 16 and 28 on 56-wide rows, AVX2)."""
    if out_width % 8 == 0:
        return Config(largest_divisor(out_width, vector_lanes, multiple_of=8))
    return Config(largest_divisor(out_width, 2 * vector_lanes))


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    sch = s_tir.Schedule(func)
    names = block_names(sch)
    if ANCHOR not in names or "PaddedInput" not in names:
        return None
    anchor = sch.get_sblock(ANCHOR)
    loops = sch.get_loops(anchor)
    if len(loops) != 6:
        return None
    n, c, oh, ow, ry, rx = loops
    cfg = config or default_config(int(sch.get(ow).extent), vector_lanes)
    epilogue = inline_epilogue(sch, ANCHOR)
    for name in names[:names.index(ANCHOR)]:
        if name.startswith("T_reshape"):  # the (C*M,1,kh,kw) -> (C,M,kh,kw) filter view
            sch.compute_inline(sch.get_sblock(name))
    ow_o, ow_i = sch.split(ow, [None, cfg.ow_block])
    sch.reorder(n, c, oh, ow_o, ry, rx, ow_i)
    sch.unroll(ry)
    sch.unroll(rx)
    sch.vectorize(ow_i)
    consumer = accumulate_in_registers(sch, anchor, epilogue, ow_o)
    vectorize_tile(sch, consumer, ow_o)
    channel = sch.fuse(n, c)
    sch.parallel(channel)
    pad = sch.get_sblock("PaddedInput")
    sch.compute_at(pad, channel)
    sch.vectorize(sch.get_loops(pad)[-1])
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ow_o)
    return sch.mod["main"]
