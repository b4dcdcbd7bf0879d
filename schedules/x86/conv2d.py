"""conv2d (groups == 1, NCHW/OIHW) on x86: a register-blocked direct convolution.

Each output tile is ``oc_block`` channels x ``ow_block`` pixels of one output row, accumulated in vector
registers over (input channel, kernel row, kernel column): per step, one vector load of the input row and
``oc_block`` broadcast FMAs. The fused epilogue is applied to the registers before the only store. The
parallel axis is (batch, channel block, output row).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..common import accumulate_in_registers, block_names, inline_epilogue, largest_divisor, vectorize_tile

ANCHOR = "conv2d_nchw"


@dataclasses.dataclass(frozen=True)
class Config:
    """Tile sizes: ``oc_block`` output channels x ``ow_block`` output pixels live in registers."""

    oc_block: int
    ow_block: int
    ic_unroll: int = 1


def default_config(out_channels: int, out_width: int, vector_lanes: int, in_channels: int = 1,
                   kernel_size: int = 3) -> Config:
    """One vector of pixels and as many channels as leave ~3 registers for loads and broadcasts.

    Measured on AVX2 (16 ymm registers): 8 channels x 8 pixels beat 4x14, 4x16 and 8x14 by 1.3-4x on
    every ResNet-50 layer; with 32 zmm registers (AVX-512) 16 channels fit.
    """
    ow_block = largest_divisor(out_width, vector_lanes, multiple_of=8) if out_width % 8 == 0 else \
        largest_divisor(out_width, vector_lanes)
    registers = 32 if vector_lanes >= 16 else 16
    vectors_per_row = -(-ow_block // vector_lanes)
    cap = max(1, (registers - 3) // vectors_per_row)
    oc_block = next(c for c in (16, 8, 4, 2, 1) if c <= cap and out_channels % c == 0)
    # 1x1 kernels have no kernel-window loop to hide the input-channel loop's overhead: unrolling it by 4
    # gave +20-30% on ResNet-50/MobileNetV2 1x1 layers (AVX2); it did not help 3x3.
    ic_unroll = 4 if kernel_size == 1 and in_channels % 4 == 0 else 1
    return Config(oc_block, ow_block, ic_unroll)


def weight_block(out_channels: int, out_width: int, vector_lanes: int) -> int:
    """The oc_block the weights are packed with at compile time (the same choice the schedule makes)."""
    return default_config(out_channels, out_width, vector_lanes).oc_block


def _packed_block(func: tirx.PrimFunc) -> int | None:
    """oc_block of a packed (5-D) weight parameter, if the kernel reads one."""
    for param in func.params:
        shape = getattr(param.ty, "shape", None)
        if shape is not None and len(shape) == 5:
            return int(shape[-1])
    return None


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule a fused conv2d partition; None when ``func`` is not one."""
    sch = s_tir.Schedule(func)
    names = block_names(sch)
    if ANCHOR not in names:
        return None
    anchor = sch.get_sblock(ANCHOR)
    loops = sch.get_loops(anchor)
    if len(loops) != 7:
        return None
    n, oc, oh, ow, rc, ry, rx = loops
    out_channels, out_width, in_channels, kernel_h, kernel_w = (int(sch.get(loop).extent)
                                                               for loop in (oc, ow, rc, ry, rx))
    cfg = config or default_config(out_channels, out_width, vector_lanes, in_channels, max(kernel_h, kernel_w))
    packed = _packed_block(func)
    if packed is not None and packed != cfg.oc_block:
        cfg = dataclasses.replace(cfg, oc_block=packed)  # the weight layout fixes the channel tile
    epilogue = inline_epilogue(sch, ANCHOR)
    oc_o, oc_i = sch.split(oc, [None, cfg.oc_block])
    ow_o, ow_i = sch.split(ow, [None, cfg.ow_block])
    rc, rc_i = sch.split(rc, [None, cfg.ic_unroll])
    sch.reorder(n, oc_o, oh, ow_o, rc, ry, rx, rc_i, oc_i, ow_i)
    sch.unroll(rc_i)
    sch.unroll(oc_i)
    sch.vectorize(ow_i)
    consumer = accumulate_in_registers(sch, anchor, epilogue, ow_o)
    vectorize_tile(sch, consumer, ow_o)
    # Parallel before decompose_reduction: afterwards the loop nest no longer has compact dataflow.
    sch.parallel(sch.fuse(n, oc_o, oh))
    vectorize_tile(sch, sch.decompose_reduction(anchor, rc), ow_o)
    if "pad_temp" in names:
        pad_loops = sch.get_loops(sch.get_sblock("pad_temp"))
        sch.parallel(sch.fuse(pad_loops[0], pad_loops[1]))
        sch.vectorize(pad_loops[-1])
    return sch.mod["main"]
