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
    """``ow_block`` output pixels per register tile; ``pad_at`` builds the padded input per ``"channel"``
    plane or per output ``"row"`` (only the input rows that row reads)."""

    ow_block: int
    pad_at: str = "channel"


def default_config(out_width: int, vector_lanes: int, kernel: int = 3, stride: int = 1) -> Config:
    """Tile and pad placement from a sweep of MobileNetV2 / EfficientNet-Lite0 layers (AVX2, 2 cores).

    Stride-2 3x3: pad per output row and take the widest tile (0.127 -> 0.071 ms at 144x56x56,
    0.050 -> 0.030 ms at 192x28x28). Stride 1: pad each channel plane once; one full vector per tile on
    56/112-wide rows, 4 pixels (3x3) or the whole row (5x5) on 28-wide rows, whole rows below that.
    """
    if stride == 2 and kernel == 3:
        if out_width <= 28:
            return Config(out_width, "row")
        return Config(largest_divisor(out_width, vector_lanes), "row")
    if out_width % vector_lanes == 0 and out_width > 28:
        return Config(vector_lanes)
    if out_width == 28 and kernel == 3:
        return Config(4)
    return Config(largest_divisor(out_width, 28))


def stride_of(sch: s_tir.Schedule, out_width: int, kernel: int) -> int:
    """The horizontal stride, from the padded input's width: (padded - kernel) / (out - 1) is the stride
    for dilation 1 and rounds down to 1 for dilation 2."""
    padded_width = int(sch.get(sch.get_sblock("PaddedInput")).writes[0].source.shape[3])
    return (padded_width - kernel) // (out_width - 1) if out_width > 1 else 1


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule ``func`` (a fused partition kernel); None when it is not this rule's kernel."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, config) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    names = block_names(sch)
    if ANCHOR not in names or "PaddedInput" not in names:
        return False
    anchor = sch.get_sblock(ANCHOR)
    loops = sch.get_loops(anchor)
    if len(loops) != 6:
        return False
    n, c, oh, ow, ry, rx = loops
    out_width, kernel = int(sch.get(ow).extent), int(sch.get(rx).extent)
    cfg = config or default_config(out_width, vector_lanes, kernel, stride_of(sch, out_width, kernel))
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
    sch.compute_at(pad, channel if cfg.pad_at == "channel" else oh)
    sch.vectorize(sch.get_loops(pad)[-1])
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ow_o)
    return True
