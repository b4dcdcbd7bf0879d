"""INT8 depthwise conv2d (:func:`tvmfuse.schedules.int8_depthwise.depthwise_conv2d_compute`) on x86.

Nine (or 25, 49) products per output leave nothing for VNNI's 4-wide dot product to do: the kernel sums
int32 products.

- NCHW: int32 vectors along the output row. Channels run in parallel; each channel's plane is padded with
  the input zero point right before use (it stays in cache), ``ow_block`` pixels of a row accumulate in
  registers with the kernel window unrolled, and the requantize epilogue runs on the registers before the
  store.
- NCHW16c (:func:`schedule_blocked`): the 16 channels of a pixel are the vector, as in the FP32
  ``depthwise_nchwc`` rule: ``ow_block`` pixels x 16 channels accumulate in registers, each tap one 16-byte
  load widened to int32; (channel block, output row) in parallel.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from .. import int8
from ..common import (anchor_loops, depthwise_row_tiles, inline_epilogue, largest_divisor, loops_below, register_tile,
                      vectorize_tile)

ANCHOR = int8.ANCHOR["depthwise_conv2d"]
PAD = int8.PAD["depthwise_conv2d"]


@dataclasses.dataclass(frozen=True)
class Config:
    """``ow_block`` output pixels (int32 lanes) per register tile."""

    ow_block: int


def default_config(out_width: int, vector_bits: int) -> Config:
    """One int32 vector of pixels per tile: the largest power-of-two divisor of the row up to the lane count
    (at least half a vector), else the largest divisor; a short row without a fitting divisor is one tile.

    AVX2, 2 cores, u8 + relu6 (ms): 144x56x56 3x3 tiles of 8: 0.24, 4: 0.33, 56: 0.27, 7/14/28: 0.36-0.60;
    28-wide rows (stride 2, or 5x5 at 28x28) 4: 0.33 / 0.52, 7: 0.40 / 0.75, 28: 0.41 / 0.60; 14-wide
    rows 7: 0.23, 14: 0.33. Vectors of 7 or 14 lanes cost extra shuffles.
    """
    lanes = vector_bits // 32
    power = largest_divisor(out_width & -out_width, lanes)  # out_width & -out_width: its power-of-two part
    if power >= max(4, lanes // 2):
        return Config(power)
    block = largest_divisor(out_width, lanes)
    return Config(out_width if block < lanes // 2 and out_width <= 2 * lanes else block)


def apply(func: tirx.PrimFunc, vector_bits: int, has_vnni: bool = False,
          config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule an INT8 depthwise kernel; None when ``func`` is not one. ``has_vnni`` is accepted for a
    uniform signature with the other INT8 rules and ignored."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_bits, has_vnni, config) else None


def schedule(sch: s_tir.Schedule, vector_bits: int, has_vnni: bool = False, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it does not match. ``has_vnni`` is
    ignored (a uniform signature with the other INT8 rules)."""
    del has_vnni
    if anchor_loops(sch, ANCHOR, 7, needs=(PAD,)) is not None:
        return schedule_blocked(sch)
    match = anchor_loops(sch, ANCHOR, 6, needs=(PAD,))
    if match is None:
        return False
    anchor, loops = match
    n, c, oh, ow, ry, rx = loops
    cfg = config or default_config(int(sch.get(ow).extent), vector_bits)
    if int(sch.get(ow).extent) % cfg.ow_block:
        return False
    epilogue = inline_epilogue(sch, ANCHOR)
    channel, ow_o = depthwise_row_tiles(sch, anchor, epilogue, loops, cfg.ow_block)
    pad = sch.get_sblock(PAD)
    sch.compute_at(pad, channel)
    pad_loops = loops_below(sch, pad, channel)
    if pad_loops:  # a 1x1 plane (1x1 kernel, 1x1 output) has none: never vectorize the parallel channel loop
        sch.vectorize(pad_loops[-1])
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ow_o)
    return True


def blocked_ow_block(out_width: int) -> int:
    """Pixels per NCHW16c register tile: 7 where the row allows (FP32 ``depthwise_nchwc``'s measured
    choice), else the largest divisor up to 8."""
    return 7 if out_width % 7 == 0 else largest_divisor(out_width, 8)


def schedule_blocked(sch: s_tir.Schedule, ow_block: int | None = None) -> bool:
    """The NCHW16c kernel (anchor loops ``n, cb, oh, ow, ci, ry, rx``); False when ``ow_block`` does not
    divide the row."""
    match = anchor_loops(sch, ANCHOR, 7, needs=(PAD,))
    if match is None:
        return False
    anchor, (n, cb, oh, ow, ci, ry, rx) = match
    ow_block = ow_block or blocked_ow_block(int(sch.get(ow).extent))
    if int(sch.get(ow).extent) % ow_block:
        return False
    epilogue = inline_epilogue(sch, ANCHOR)
    ow_o, ow_i = sch.split(ow, [None, ow_block])
    sch.reorder(n, cb, oh, ow_o, ry, rx, ow_i, ci)
    register_tile(sch, anchor, epilogue, ow_o, [ry, rx, ow_i], ci)
    row = sch.fuse(n, cb, oh)
    sch.parallel(row)
    sch.compute_inline(sch.get_sblock(PAD))  # the zero-point border is a select on the clamped read
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ow_o)
    return True
