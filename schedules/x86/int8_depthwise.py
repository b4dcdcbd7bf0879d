"""INT8 depthwise conv2d (:func:`tvmfuse.schedules.computes.int8_depthwise.depthwise_conv2d_compute`) on x86.

Without taps in fours (NCHW, a dilated row, a target below AVX2) the kernel sums int32 products: a
depthwise conv has no channel reduction for a dot-product step, so the taps of a row stand in for it.

- NCHW: int32 vectors along the output row. Channels run in parallel; each channel's plane is padded with
  the input zero point right before use (it stays in cache), ``ow_block`` pixels of a row accumulate in
  registers with the kernel window unrolled, and the requantize epilogue runs on the registers before the
  store.
- NCHW16c (:func:`schedule_blocked`): the 16 channels of a pixel are the vector, as in the FP32
  ``depthwise_nchwc`` rule: ``ow_block`` pixels x 16 channels accumulate in registers, each tap one 16-byte
  load widened to int32; (channel block, output row) in parallel.
- NCHW16c with taps in fours (:func:`schedule_taps`): 4 taps of a row per ``vpdpbusd`` with AVX512-VNNI
  (:mod:`.intrin.depthwise_vnni`), or per two ``vpmaddwd`` on int16 weight pairs without it
  (:mod:`.intrin.depthwise_pairs`), the same register tile, channel blocks in parallel; each block's plane
  is padded right before use, its loops partitioned at the borders so the copy of the interior is plain
  vector moves.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from .. import families, padding_taps
from ..computes import int8
from ..computes import int8_depthwise as int8_dw
from ..common import (accumulate_in_registers, anchor_loops, depthwise_row_tiles, inline_epilogue, largest_divisor,
                      loops_below, register_tile, vectorize_tile)
from .int8_conv2d import dot_kind, weight_pairs
from .intrin import depthwise_pairs, depthwise_vnni

ANCHOR, PAD = families.DEPTHWISE_CONV2D.int8.anchor_block, families.DEPTHWISE_CONV2D.int8.pad_block


@dataclasses.dataclass(frozen=True)
class Config:
    """``ow_block`` output pixels (int32 lanes) per register tile. ``dot`` forces the taps-in-fours step's
    implementation (a kind of :mod:`.intrin.depthwise_vnni` for int8 weights, of :mod:`.intrin.depthwise_pairs`
    for int16 pairs; None: from the target and the layout, :func:`.int8_conv2d.dot_kind`)."""

    ow_block: int
    dot: str | None = None


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
    """Schedule an INT8 depthwise kernel; None when ``func`` is not one. ``has_vnni`` picks the step of a
    kernel whose taps are in fours."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_bits, has_vnni, config) else None


def schedule(sch: s_tir.Schedule, vector_bits: int, has_vnni: bool = False, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it does not match."""
    match = anchor_loops(sch, ANCHOR, 8, needs=(PAD,))
    if match is not None:
        pairs = weight_pairs(sch, match[0])
        # int8 taps need the zmm vpdpbusd with its vpermb transpose: 256-bit VNNI targets take pairs
        dot = (config.dot if config else None) or dot_kind(vector_bits, has_vnni and vector_bits >= 512, pairs)
        return schedule_taps(sch, dot, config.ow_block if config else None)
    if anchor_loops(sch, ANCHOR, 7, needs=(PAD,)) is not None:
        if float_sums(sch):
            return schedule_float(sch, vector_bits, config.ow_block if config else None)
        return schedule_blocked(sch, config.ow_block if config else None)
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


def float_sums(sch: s_tir.Schedule) -> bool:
    """Whether the kernel sums its taps in float32 (``int8_depthwise.pack_weight_float``)."""
    return str(sch.get(sch.get_sblock(ANCHOR)).writes[0].source.dtype) == "float32"


def schedule_float(sch: s_tir.Schedule, vector_bits: int, ow_block: int | None = None) -> bool:
    """The NCHW16c kernel summing in float32 (anchor loops ``n, cb, oh, ow, ci, ry, rx``): the padding stage
    converts each channel block's plane once (its interior plain vector conversions, :func:`_copy_by_parts`),
    every tap is one multiply-add per vector of channels, ``ow_block`` pixels (:func:`blocked_ow_block`) by
    one vector of channels in registers. Where enough row steps read only padding rows (a 5x5 kernel on a
    2-row map: 60%), the kernel rows stay a loop for ``padding_taps`` to skip them (AVX2 code, ppocrv5_cls INT8
    0.65 -> 0.47 ms); elsewhere they are unrolled too (EfficientNet-Lite0 1.02x slower with the loop). False
    when ``ow_block`` does not divide the row."""
    anchor, (n, cb, oh, ow, ci, ry, rx) = anchor_loops(sch, ANCHOR, 7, needs=(PAD,))
    ow_block = ow_block or blocked_ow_block(int(sch.get(ow).extent))
    if int(sch.get(ow).extent) % ow_block:
        return False
    lanes = min(vector_bits // 32, int8.BLOCK_O)
    epilogue = inline_epilogue(sch, ANCHOR)
    ow_o, ow_i = sch.split(ow, [None, ow_block])
    ci_o, ci_i = sch.split(ci, [None, lanes])
    sch.reorder(n, cb, oh, ow_o, ci_o, ry, rx, ow_i, ci_i)
    skips = float(sch.get(anchor).annotations[int8_dw.PADDING_ROWS]) >= padding_taps.MIN_SKIPPED
    register_tile(sch, anchor, epilogue, ci_o, [rx, ow_i] if skips else [ry, rx, ow_i], ci_i)
    channel = sch.fuse(n, cb)
    sch.parallel(channel)
    pad = sch.get_sblock(PAD)
    sch.compute_at(pad, channel, preserve_unit_loops=True)
    _copy_by_parts(sch, pad, channel)
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ci_o)
    return True


# Pixels per register tile of the taps-in-fours kernel, at most. 12 zmm accumulators spill since (AVX512-VNNI,
# 200x2x96 5x5: 220 stack accesses against 43 with 8). Zen 4, 2 threads, u8 out, kernel alone, 9 interleaved
# rounds (us; tiles 12 / 8 / 6 / 4): 200x2x96 5x5 31.6, 9.7, 10.3, 11.2; 88x3x96 5x5 20.8, 6.3, 6.8, 7.5;
# 32x12x96 3x3 24.6, 5.1, 6.3, 5.2; 64x24x96 3x3 105.9, 23.0, 29.1, 20.9; 128x12x48 3x3 48.8, 9.0, 9.3, 9.8.
TAPS_PIXELS = 8


def taps_ow_block(out_width: int, most: int = TAPS_PIXELS) -> int:
    """Pixels per register tile of the taps-in-fours kernel: the largest divisor of the row up to ``most``
    (:data:`TAPS_PIXELS`). AVX2 pair step (ymm, run on Zen 4; tiles 2 / 4 / 7 / 8): 576x14x14 30.9, -, 26.0, -;
    192x28x28 39.3, 37.3, 32.7, -; 144x56x56 127.4, 120.9, 105.4, 102.4; 960x7x7 17.2 (1) against 13.3 (7)."""
    return largest_divisor(out_width, most)


def schedule_taps(sch: s_tir.Schedule, dot: str = "vnni", ow_block: int | None = None) -> bool:
    """The NCHW16c kernel with taps in fours (anchor loops ``n, cb, oh, ow, ci, ry, rg, rk``), the step
    ``dot`` of :mod:`.intrin.depthwise_pairs` for int16 weight pairs, else of :mod:`.intrin.depthwise_vnni`;
    False when ``ow_block`` does not divide the row."""
    match = anchor_loops(sch, ANCHOR, 8, needs=(PAD,))
    if match is None:
        return False
    anchor, (n, cb, oh, ow, ci, ry, rg, rk) = match
    pairs = weight_pairs(sch, anchor)
    ow_block = ow_block or taps_ow_block(int(sch.get(ow).extent), TAPS_PIXELS)
    if int(sch.get(ow).extent) % ow_block:
        return False
    epilogue = inline_epilogue(sch, ANCHOR)
    ow_o, ow_i = sch.split(ow, [None, ow_block])
    sch.reorder(n, cb, oh, ow_o, ry, rg, ow_i, ci, rk)
    sch.unroll(ow_i)
    sch.unroll(rg)
    consumer = accumulate_in_registers(sch, anchor, epilogue, ow_o)
    vectorize_tile(sch, consumer, ow_o)
    channel = sch.fuse(n, cb)
    sch.parallel(channel)
    pad = sch.get_sblock(PAD)
    sch.compute_at(pad, channel, preserve_unit_loops=True)  # rows, columns, channels: a 1x1 plane too
    _copy_by_parts(sch, pad, channel)
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ow_o)
    sch.tensorize(ci, depthwise_pairs.ensure(dot) if pairs else depthwise_vnni.ensure(dot))
    return True


def _copy_by_parts(sch: s_tir.Schedule, pad, channel) -> None:
    """Partition the padding stage's row and column loops (it sits under ``channel``) at the data's borders
    and vectorize each part's channels: in every part the loop bounds decide the zero-point select, so the
    interior is plain 16-byte moves (Zen 4, 144x56x56 3x3: 62 -> 56 us; stride 2: 33 -> 18 us; a masked
    blend per pixel before)."""
    top, left, height, width = (int(v) for v in sch.get(pad).annotations[int8_dw.BORDER])
    inside = pad
    if _partition(sch, sch.get_loops(pad)[-3], top, height):
        inside = _leaves(sch, channel)[1 if top else 0]
    _partition(sch, sch.get_loops(inside)[-2], left, width)
    for block in _leaves(sch, channel):
        sch.vectorize(sch.get_loops(block)[-1])


def _partition(sch: s_tir.Schedule, loop, before: int, inside: int):
    """Split ``loop`` (from 0) into ``[0, before)``, ``[before, before + inside)`` and the rest, leaving out
    empty parts; None (untouched) when there is a single part."""
    extent = int(sch.get(loop).extent)
    factors = [f for f in (before, min(inside, extent - before)) if f > 0]
    if sum(factors) < extent:
        factors.append(None)
    if len(factors) < 2:
        return None
    factors[-1] = None  # the last part takes the rest (loop_partition refuses factors that fill the loop)
    return sch.loop_partition(loop, factors)


def _leaves(sch: s_tir.Schedule, parent) -> list:
    """The padding stage's blocks under ``parent`` (a block or loop), in order: a partitioned loop nests one
    block per part."""
    found = []
    for child in sch.get_child_blocks(parent):
        if sch.get(child).name_hint.startswith(PAD):
            found += _leaves(sch, child) if sch.get_child_blocks(child) else [child]
    return found
