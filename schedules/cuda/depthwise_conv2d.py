"""Depthwise conv2d (NCHW, any window, stride, dilation and channel multiplier) on CUDA.

The kernel TensorFlow's ``DepthwiseConv2dGPUKernel`` and TVM's old topi/cuda template converged on, with no
cross-thread reduction anywhere:

- a thread block owns a tile of ``channels x tile_h x tile_w`` outputs; it first copies the padded input
  tile those outputs read (the halo included, zero padding written there) into shared memory, each thread
  a share of it, so every input element is read from global memory once per tile;
- each thread then computes ``strip`` neighbouring outputs of one row: the window is unrolled (taps are
  compile-time offsets, stride and dilation included), the accumulators stay in registers and neighbouring
  outputs reuse the loaded inputs; in fp16 it computes them for two channels at once, read as ``half2`` from a
  tile whose channel pairs are interleaved (:func:`pairs_for`);
- the epilogue (bias, folded batch-norm, activation, residual add) is applied to the registers before the
  single store.

Channels share a block when a channel's plane alone would leave most of a block's threads idle (7x7
maps); tiles shrink when the grid would leave streaming multiprocessors idle.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir

from ..common import (anchor_loops, inline_epilogue, inline_producers, largest_divisor, loops_below,
                      read_coefficients)
from .common import MAX_SHARED_BYTES, cooperative_copy

ANCHOR = "DepthwiseConv2d"
PAD = "PaddedInput"
TARGET_THREADS = 256


@dataclasses.dataclass(frozen=True)
class Config:
    channels: int  # output channels per thread block
    tile_h: int  # output rows per thread block
    tile_w: int  # output columns per thread block (a multiple of strip)
    strip: int  # neighbouring outputs of a row per thread
    pairs: int = 1  # channels per thread (2: their inputs interleaved in shared memory, read as one vector)

    @property
    def threads(self) -> int:
        return self.channels // self.pairs * self.tile_h * (self.tile_w // self.strip)

    def shared_bytes(self, kernel: tuple, stride: tuple, dilation: tuple) -> int:
        """Of the input tile, counted in float32 words (an INT8 kernel's uint8 tile takes a quarter)."""
        rows = (self.tile_h - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1
        cols = (self.tile_w - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1
        return 4 * self.channels * rows * cols


def default_config(channels: int, out_h: int, out_w: int, kernel=(3, 3), stride=(1, 1), dilation=(1, 1),
                   sms: int = 132, pairs: int = 1, widest: int = 4) -> Config | None:
    """Strips of ``widest`` (:func:`widest_strip`; else 2, 1) outputs along whole rows (at most 32 threads a row),
    rows up to 256 threads a block, channels (``pairs`` at a time: see :func:`pairs_for`) stacked while a block has
    fewer than 128 threads; then tiles halved while the grid is under two blocks per SM or the input tile does not
    fit in shared memory. None when not even one row of one channel fits (a window dilated past shared memory)."""
    units = channels // pairs
    strip = next(s for s in (4, 2, 1) if s <= widest and (out_w % s == 0 and out_w // s >= 4 or s == 1))
    tile_w = out_w if out_w // strip <= 32 else largest_divisor(out_w, 32 * strip, strip)
    row_threads = tile_w // strip
    tile_h = largest_divisor(out_h, max(1, TARGET_THREADS // row_threads))
    per_channel = tile_h * row_threads
    stacked = largest_divisor(units, max(1, TARGET_THREADS // per_channel)) if per_channel < 128 else 1
    config = Config(stacked * pairs, tile_h, tile_w, strip, pairs)

    def blocks(c: Config) -> int:
        return (channels // c.channels) * -(-out_h // c.tile_h) * -(-out_w // c.tile_w)

    def smaller(c: Config) -> Config | None:
        if c.channels > pairs:
            return dataclasses.replace(c, channels=largest_divisor(units, c.channels // pairs // 2) * pairs)
        if c.tile_h > 1:
            return dataclasses.replace(c, tile_h=largest_divisor(out_h, c.tile_h // 2))
        return None

    while config.shared_bytes(kernel, stride, dilation) > MAX_SHARED_BYTES:
        config = smaller(config)
        if config is None:
            return None
    while blocks(config) < 2 * sms:
        nxt = smaller(config)
        if nxt is None or nxt.threads < 64:
            break
        config = nxt
    return config


def pairs_for(channels: int, dtype: str, multiplier: int = 1) -> int:
    """Channels a thread computes by default: 2 for an even number of float16 channels, each reading its own input
    channel (``multiplier``, output channels per input channel, 1), else 1. A pair's inputs
    are interleaved in the shared tile, so each tap is one aligned ``half2`` read for both channels where it was
    a 2-byte read per channel (half the shared-memory reads, and the copy stores ``half2``); each channel still
    sums in float32, as every fp16 kernel does (the issue asks fp32 accumulation), so the outputs are those of
    the one-channel kernel. float32 keeps 1 by default: its one-channel tiles were measured on an H100, the pairs
    not yet (tuning offers them)."""
    return 2 if dtype == "float16" and channels % 2 == 0 and multiplier == 1 else 1


def widest_strip(dtype: str) -> int:
    """The widest strip a default tile takes: 2 outputs a thread for fp16 and INT8 (uint8) inputs, 4 for FP32. On an
    H200 (2026-11-30) the offline candidates of MobileNetV2's 20 fp16 and INT8 depthwise layers never had a strip
    of 4 fastest, and strips of 4 were up to 1.6x slower on the large maps (INT8 144 x 56 x 56: 6.02 against 3.79
    us; fp16 96 x 112 x 112: 6.99 against 4.25); strips of 2 took these layers' time from 136 to 126 us. FP32's
    strips of 4 were timed on an H100 and stay until its candidates are timed."""
    return 4 if dtype == "float32" else 2


def candidates(channels: int, out_h: int, out_w: int, kernel=(3, 3), stride=(1, 1), dilation=(1, 1),
               sms: int = 132, dtype: str = "float32", multiplier: int = 1) -> list[Config]:
    """The configs an offline tuning round times: the default first, then for each of 1 and 2 channels a thread
    (2 for an even number of float channels) and each strip (4, 2, 1 outputs a thread) blocks of about 64, 128,
    256 and 512 threads built as the default builds its one (whole rows up to 32 threads, then rows, then stacked
    channels), each that fits shared memory and 1,024 threads, once. ``dtype``: the input's; ``multiplier``:
    output channels per input channel (pairs need 1: a pair reads two channels of the tile)."""
    default = default_config(channels, out_h, out_w, kernel, stride, dilation, sms,
                             pairs_for(channels, dtype, multiplier), widest_strip(dtype))
    found = [default] if default is not None else []
    paired = channels % 2 == 0 and dtype.startswith("float") and multiplier == 1
    for per_thread in (1, 2) if paired else (1,):
        units = channels // per_thread
        for strip in (s for s in (4, 2, 1) if out_w % s == 0):
            tile_w = out_w if out_w // strip <= 32 else largest_divisor(out_w, 32 * strip, strip)
            row_threads = tile_w // strip
            for threads in (64, 128, 256, 512):
                tile_h = largest_divisor(out_h, max(1, threads // row_threads))
                per_channel = tile_h * row_threads
                stacked = largest_divisor(units, max(1, threads // per_channel)) if per_channel < threads else 1
                config = Config(stacked * per_thread, tile_h, tile_w, strip, per_thread)
                if config.threads <= 1024 and config.shared_bytes(kernel, stride, dilation) <= MAX_SHARED_BYTES:
                    found.append(config)
    return list(dict.fromkeys(found))


def kernel_candidates(func, sms: int, anchor_name: str = ANCHOR, pad: str = PAD) -> list[Config]:
    """:func:`candidates` for a depthwise partition kernel (its blocks ``anchor_name`` and ``pad``); [] when
    ``func`` is not one."""
    layer = _layer(func, anchor_name, pad)
    return candidates(*layer[:-2], sms, *layer[-2:]) if layer is not None else []


def kernel_default(func, sms: int, pairs: int | None = None, anchor_name: str = ANCHOR,
                   pad: str = PAD) -> Config | None:
    """:func:`default_config` for a depthwise partition kernel, with ``pairs`` channels a thread where given
    (else :func:`pairs_for`'s); None when ``func`` is not one or no tile fits."""
    layer = _layer(func, anchor_name, pad)
    if layer is None:
        return None
    return default_config(*layer[:-2], sms, pairs if pairs is not None else pairs_for(layer[0], *layer[-2:]),
                          widest_strip(layer[-2]))


def _layer(func, anchor_name: str, pad: str) -> tuple | None:
    """(channels, out_h, out_w, window, stride, dilation, input dtype, channel multiplier) of a depthwise
    partition kernel."""
    sch = s_tir.Schedule(func)
    found = anchor_loops(sch, anchor_name, 6, needs=(pad,))
    if found is None:
        return None
    anchor, loops = found
    shape = [int(sch.get(loop).extent) for loop in loops]
    return (*shape[1:4], *_conv_attrs(sch, anchor, pad), *_input(sch, pad, shape[1]))


def _input(sch: s_tir.Schedule, pad: str, channels: int) -> tuple[str, int]:
    """The input's dtype and the channel multiplier (output channels per input channel)."""
    padded = sch.get(sch.get_sblock(pad)).writes[0].source
    return str(padded.dtype), channels // int(padded.shape[1])


def _conv_attrs(sch: s_tir.Schedule, anchor, pad: str = PAD) -> tuple:
    """(window, stride, dilation) read off the anchor block's input index ``y * stride + ry * dilation``."""
    block = sch.get(anchor)
    window = tuple(int(iv.dom.extent) for iv in block.iter_vars[4:6])
    pixel, tap = block.iter_vars[2:4], block.iter_vars[4:6]
    steps = [read_coefficients(block, pad, 2 + axis, [pixel[axis].var, tap[axis].var]) for axis in (0, 1)]
    return window, tuple(s[0] for s in steps), tuple(s[1] for s in steps)


def schedule(sch: s_tir.Schedule, sms: int, config: Config | None = None, anchor_name: str = ANCHOR,
             pad_name: str = PAD) -> bool:
    """Schedule a depthwise partition kernel in place; False (``sch`` untouched) when it is not one. The INT8
    kernel (int32 sums of uint8 x int8) names its blocks ``anchor_name`` and ``pad_name``."""
    found = anchor_loops(sch, anchor_name, 6, needs=(pad_name,))
    if found is None:
        return False
    anchor, loops = found
    shape = [int(sch.get(loop).extent) for loop in loops]
    kernel, stride, dilation = _conv_attrs(sch, anchor, pad_name)
    dtype, multiplier = _input(sch, pad_name, shape[1])
    if config is None:
        config = default_config(shape[1], shape[2], shape[3], kernel, stride, dilation, sms,
                                pairs_for(shape[1], dtype, multiplier), widest_strip(dtype))
    if config is None or config.pairs > 1 and multiplier != 1:
        return False
    inline_producers(sch, anchor_name, keep=(pad_name,))  # the weight's reshape to topi's filter layout
    out = inline_epilogue(sch, anchor_name)
    if out is None:
        out = sch.cache_write(anchor, 0, "local")
    else:
        sch.set_scope(anchor, 0, "local")
    n, c, h, w = sch.get_loops(out)
    co, ci, cp = sch.split(c, [None, config.channels // config.pairs, config.pairs])
    ho, hi = sch.split(h, [None, config.tile_h])
    wo, wt, ws = sch.split(w, [None, config.tile_w // config.strip, config.strip])
    sch.reorder(n, co, ho, wo, ci, hi, wt, cp, ws)
    bx = sch.fuse(n, co, ho, wo)
    tx = sch.fuse(ci, hi, wt)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.unroll(cp)
    sch.unroll(ws)
    # The strip's accumulators in registers: the window unrolled outside the strip, so each tap's weight is
    # loaded once and the inputs neighbouring outputs share are loaded once.
    sch.compute_at(anchor, tx, preserve_unit_loops=True)
    an, ac, ah, aw, ry, rx = sch.get_loops(anchor)[-6:]
    sch.reorder(ry, rx, aw, ac)
    for loop in (ry, rx, aw):
        sch.unroll(loop)
    pad = sch.get_sblock(pad_name)
    if config.pairs > 1:
        # A channel pair's sums as one vector (vectorized before the reduction is split from its init, which
        # TVM requires): one read of the interleaved tile and of the pair's weights per tap.
        sch.vectorize(ac)
    else:
        sch.unroll(ac)
    sch.decompose_reduction(anchor, ry)
    sch.set_scope(pad, 0, "shared")
    sch.compute_at(pad, bx, preserve_unit_loops=True)
    if config.pairs > 1:
        _interleave_pairs(sch, pad, bx, config)
    else:
        cooperative_copy(sch, pad, bx, config.threads)
    return True


def _interleave_pairs(sch: s_tir.Schedule, pad, bx, config: Config) -> None:
    """The shared input tile laid out ``[channel // 2, row, column, channel % 2]``, so a thread reads its pair's
    inputs at a tap as one aligned vector; the copy fills it a pair at a time (two reads of the NCHW input, one
    vector store), the pairs spread over the block's threads."""
    sch.transform_layout(pad, ("write", 0), lambda n, c, h, w: (n, c // 2, h, w, c % 2))
    loops = loops_below(sch, pad, bx)
    c, rest = loops[1], loops[2:]
    cp, pair = sch.split(c, [None, 2])
    sch.reorder(cp, *rest, pair)
    sch.vectorize(pair)
    fused = sch.fuse(loops[0], cp, *rest)
    _, tx = sch.split(fused, [None, config.threads])
    sch.bind(tx, "threadIdx.x")
