"""Depthwise conv2d (groups == channels, NCHW) on x86: memory bound, so one pass over each plane.

Channels run in parallel; each channel's padded plane is built right before use (it stays in L1/L2),
each output row is computed ``ow_block`` pixels at a time in vector registers with the kernel window
unrolled, and the fused epilogue is applied before the store.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..common import anchor_loops, block_names, depthwise_row_tiles, inline_epilogue, largest_divisor, vectorize_tile
from ..computes.anchors import PHASE_SPLIT

ANCHOR = "DepthwiseConv2d"


@dataclasses.dataclass(frozen=True)
class Config:
    """``ow_block`` output pixels per register tile; ``pad_at`` builds the padded input per ``"channel"``
    plane or per output ``"row"`` (only the input rows that row reads)."""

    ow_block: int
    pad_at: str = "channel"


def default_config(out_width: int, vector_lanes: int, kernel: int = 3, stride: int = 1,
                   phase_split: bool = False) -> Config:
    """Tile and pad placement from a sweep of MobileNetV2 / EfficientNet-Lite0 layers (AVX2, 2 cores).

    Phase-split input (stride 2): the taps are contiguous loads as for stride 1; pad and split each
    channel plane once, one vector per tile (3x3) or two (5x5: 0.28 -> 0.24 ms at 144x56x56, 1 thread).
    Stride-2 3x3 read directly: pad per output row and take the widest tile (0.127 -> 0.071 ms at
    144x56x56, 0.050 -> 0.030 ms at 192x28x28). Stride 1: pad each channel plane once; one full vector per
    tile on 56/112-wide rows, 4 pixels (3x3) or the whole row (5x5) on 28-wide rows, whole rows below that.
    """
    if phase_split:
        return Config(largest_divisor(out_width, vector_lanes * (2 if kernel >= 5 else 1)))
    if stride == 2 and kernel == 3:
        if out_width <= 28:
            return Config(out_width, "row")
        return Config(largest_divisor(out_width, vector_lanes), "row")
    if out_width % vector_lanes == 0 and out_width > 28:
        return Config(vector_lanes)
    if out_width == 28 and kernel == 3:
        return Config(4)
    return Config(largest_divisor(out_width, 28))


def is_phase_split(sch: s_tir.Schedule) -> bool:
    """Whether the kernel reads its input split into even/odd columns (``anchors.PHASE_SPLIT``)."""
    return PHASE_SPLIT in block_names(sch)


def stride_of(sch: s_tir.Schedule, out_width: int, kernel: int) -> int:
    """The horizontal stride: 2 when the input is phase-split, else from the padded input's width
    ((padded - kernel) / (out - 1) is the stride for dilation 1 and rounds down to 1 for dilation 2)."""
    if is_phase_split(sch):
        return 2
    padded_width = int(sch.get(sch.get_sblock("PaddedInput")).writes[0].source.shape[3])
    return (padded_width - kernel) // (out_width - 1) if out_width > 1 else 1


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule ``func`` (a fused partition kernel); None when it is not this rule's kernel."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, config) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    match = anchor_loops(sch, ANCHOR, 6, needs=("PaddedInput",))
    if match is None:
        return False
    anchor, loops = match
    names = block_names(sch)
    n, c, oh, ow, ry, rx = loops
    out_width, kernel = int(sch.get(ow).extent), int(sch.get(rx).extent)
    cfg = config or default_config(out_width, vector_lanes, kernel, stride_of(sch, out_width, kernel),
                                   is_phase_split(sch))
    epilogue = inline_epilogue(sch, ANCHOR)
    for name in names[:names.index(ANCHOR)]:
        if name.startswith("T_reshape"):  # the (C*M,1,kh,kw) -> (C,M,kh,kw) filter view
            sch.compute_inline(sch.get_sblock(name))
    channel, ow_o = depthwise_row_tiles(sch, anchor, epilogue, loops, cfg.ow_block)
    if PHASE_SPLIT in names:
        _place_phase_split(sch, channel if cfg.pad_at == "channel" else oh)
    pad = sch.get_sblock("PaddedInput")
    sch.compute_at(pad, channel if cfg.pad_at == "channel" else oh)
    sch.vectorize(sch.get_loops(pad)[-1])
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ow_o)
    return True


def _place_phase_split(sch: s_tir.Schedule, loop) -> None:
    """Build the even/odd split under ``loop``, from a padded copy made there too (by the caller).

    Inlining the padding's bounds checks into the split compiles to a branch per element (the kernel was
    1.4x slower at 144x56x56 than with a padded copy); from a padded copy the split has no condition and
    LLVM turns each row into vector loads and shuffles, given the phase as the innermost (unrolled) loop.
    """
    split = sch.get_sblock(PHASE_SPLIT)
    sch.compute_at(split, loop)
    *_, phase, column = sch.get_loops(split)
    sch.reorder(column, phase)
    sch.unroll(phase)
