"""conv2d (groups == 1, NCHW activations, weights pre-packed) on x86: register-blocked direct convolution.

Two micro-kernels, both accumulating an output tile in vector registers over (input channel, kernel
row, kernel column) and applying the fused epilogue to the registers before the only store:

- ``"oc"`` (default): vectors run along output channels. Per step: ``oc_block`` packed weights
  (1-4 vectors) and ``ow_block`` scalar input broadcasts. Any output width and stride works, since inputs are
  broadcast, not vector-loaded. On AVX2 this reached 133-156 GFLOP/s on ResNet-50 layers at 16 channels
  x 4 pixels, 118-147 at 8 x 7 on 14- and 7-wide maps (the pixel-vector kernel: 67-124).
- ``"ow"``: vectors run along output pixels of one row (``oc_block`` broadcast weights per input vector);
  the fallback when the channel count is not a multiple of the vector width.

The parallel axis is (batch, channel block, output row).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..common import block_names, inline_epilogue, largest_divisor, register_tile, row_vector, vectorize_tile

ANCHOR = "conv2d_nchw"


@dataclasses.dataclass(frozen=True)
class Config:
    """``kind`` picks the micro-kernel; ``oc_block`` x ``ow_block`` outputs live in registers."""

    kind: str  # "oc" or "ow"
    oc_block: int
    ow_block: int
    ic_unroll: int = 1


def _accumulators(vector_lanes: int) -> int:
    # AVX2 (16 ymm): 8 accumulators measured best (16x4 and 8x7 or 8x8; 16x7 and 8x14 spilled, 10x slower).
    # AVX-512 has 32 zmm registers: the same headroom scaled (not measured: no AVX-512 machine here).
    return 8 if vector_lanes < 16 else 20


def default_config(out_channels: int, out_width: int, vector_lanes: int, in_channels: int = 1,
                   kernel_size: int = 3, packed: bool = True) -> Config:
    """The analytical choice for the target's vector width (measured on AVX2, see the module doc).

    ``packed=False`` (weights left OIHW) rules out the channel-vector kernel, whose weight loads would
    then be gathers.
    """
    # 1x1 kernels have no window loop to hide the input-channel loop's overhead: unroll it by 4.
    ic_unroll = 4 if kernel_size == 1 and in_channels % 4 == 0 else 1
    budget = _accumulators(vector_lanes)
    wide = 4 * vector_lanes
    if packed and kernel_size == 1 and in_channels <= 96 and out_channels % wide == 0:
        # Short reductions (MobileNet expansions): 4 weight vectors x 2 pixels beat 16x4 / 8x7 by 15-40%
        # (64->384 ch at 14x14: 147 vs 103 GFLOP/s; 96->576: 160 vs 118; AVX2).
        ow_block = largest_divisor(out_width, budget // 4)
        if ow_block >= 2:
            return Config("oc", wide, ow_block, ic_unroll)
    if packed and out_channels % vector_lanes == 0:
        best = None
        for oc_vectors in (2, 1):
            if out_channels % (oc_vectors * vector_lanes):
                continue
            ow_block = largest_divisor(out_width, budget // oc_vectors)
            used = oc_vectors * ow_block
            if best is None or used > best[0]:
                best = (used, oc_vectors * vector_lanes, ow_block)
        if best[2] >= 4 or best[2] == out_width:
            return Config("oc", best[1], best[2], ic_unroll)
    ow_block = row_vector(out_width, vector_lanes)
    vectors_per_row = -(-ow_block // vector_lanes)
    cap = max(1, (16 if vector_lanes < 16 else 32) - 3) // vectors_per_row
    if vector_lanes >= 16:
        # Any divisor up to the cap: ShuffleNet's 58 and 116 channels got 2- and 4-channel tiles from the
        # powers of two; 29 channels ran 24->58 1x1 at 56x56 2.4x and 116->116 at 28x28 1.7x faster (Zen 4).
        oc_block = largest_divisor(out_channels, cap)
    else:
        oc_block = next(c for c in (16, 8, 4, 2, 1) if c <= cap and out_channels % c == 0)
    return Config("ow", oc_block, ow_block, ic_unroll)


def weight_block(out_channels: int, out_width: int, vector_lanes: int, in_channels: int = 1,
                 kernel_size: int = 3) -> int:
    """The oc_block the weights are packed with at compile time (the same choice the schedule makes)."""
    return default_config(out_channels, out_width, vector_lanes, in_channels, kernel_size).oc_block


def config_for(out_channels: int, out_width: int, vector_lanes: int, in_channels: int, kernel_size: int,
               packed: int | None) -> Config:
    """The default config, with the channel tile fixed by the weight's packing when it is packed."""
    cfg = default_config(out_channels, out_width, vector_lanes, in_channels, kernel_size, packed=packed is not None)
    if packed is None or packed == cfg.oc_block:
        return cfg
    if packed % vector_lanes == 0:
        vectors = packed // vector_lanes
        return Config("oc", packed, largest_divisor(out_width, max(1, _accumulators(vector_lanes) // vectors)),
                      cfg.ic_unroll)
    return dataclasses.replace(cfg, kind="ow", oc_block=packed)


def _packed_block(func: tirx.PrimFunc) -> int | None:
    """oc_block of a packed (5-D) weight parameter, if the kernel reads one."""
    for param in func.params:
        shape = getattr(param.ty, "shape", None)
        if shape is not None and len(shape) == 5:
            return int(shape[-1])
    return None


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule ``func`` (a fused partition kernel); None when it is not this rule's kernel."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, config) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    names = block_names(sch)
    if ANCHOR not in names:
        return False
    anchor = sch.get_sblock(ANCHOR)
    loops = sch.get_loops(anchor)
    if len(loops) != 7:
        return False
    n, oc, oh, ow, rc, ry, rx = loops
    out_channels, out_width, in_channels, kernel_h, kernel_w = (int(sch.get(loop).extent)
                                                               for loop in (oc, ow, rc, ry, rx))
    packed = _packed_block(sch.mod["main"])
    cfg = config or config_for(out_channels, out_width, vector_lanes, in_channels, max(kernel_h, kernel_w), packed)
    if packed is not None and packed != cfg.oc_block:
        return False  # an explicit config for another channel tile than the weight was packed for
    epilogue = inline_epilogue(sch, ANCHOR)
    oc_o, oc_i = sch.split(oc, [None, cfg.oc_block])
    ow_o, ow_i = sch.split(ow, [None, cfg.ow_block])
    rc, rc_i = sch.split(rc, [None, cfg.ic_unroll])
    unrolled, vector = (ow_i, oc_i) if cfg.kind == "oc" else (oc_i, ow_i)
    sch.reorder(n, oc_o, oh, ow_o, rc, ry, rx, rc_i, unrolled, vector)
    # The store runs along output pixels (NCHW rows) for both kernels.
    register_tile(sch, anchor, epilogue, ow_o, [unrolled, rc_i], vector)
    if cfg.kind == "oc":
        # The accumulator tile is [channel][pixel] in NCHW order: its vectors (along channels) would be strided,
        # which LLVM keeps in memory on AVX-512 (64->64 3x3 56x56: 24.7 ms). Channels innermost: 1.1 ms.
        sch.transform_layout(anchor, ("write", 0), lambda b, o, y, x: (b, y, x, o))
    # Parallel before decompose_reduction: afterwards the loop nest no longer has compact dataflow.
    sch.parallel(sch.fuse(n, oc_o, oh))
    vectorize_tile(sch, sch.decompose_reduction(anchor, rc), ow_o)
    if "pad_temp" in names:
        pad_loops = sch.get_loops(sch.get_sblock("pad_temp"))
        sch.parallel(sch.fuse(pad_loops[0], pad_loops[1]))
        sch.vectorize(pad_loops[-1])
    return True
