"""conv2d (groups 1) writing NCHW[b]c on x86: register-blocked direct convolution, channels in vectors.

The accumulators are ``oc_vectors`` output-channel blocks (one vector each) x ``ow_block`` output pixels.
Per reduction step (input channel, kernel row, kernel column): ``oc_vectors`` contiguous weight vector
loads (weights packed ``[O/b, I/bi, kh, kw, bi, b]``), ``ow_block`` scalar input broadcasts (the ``bi``
channels of a pixel are adjacent), ``oc_vectors x ow_block`` FMAs. The fused epilogue runs on the
accumulators and each vector is stored whole: no transpose on the way out, unlike the NCHW kernel.

Measured against the NCHW kernel on ResNet-50 / MobileNetV2 layers (AVX2, 2 threads): 1.2-2.0x, at
143-192 GFLOP/s of a ~190 peak (e.g. 64ch 3x3 at 56x56: 124 -> 185; 2048->512 1x1 at 7x7: 86 -> 149).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..computes.blocked import CONV_ANCHOR, NARROW_GROUP, PLAIN_CROP, SUBSAMPLE
from ..common import accumulate_in_registers, anchor_loops, block_names, inline_epilogue, register_tile, vectorize_tile
from ..computes.channel_scale import SCALED_WEIGHT
from .intrin import group_shuffle

ANCHOR = CONV_ANCHOR


@dataclasses.dataclass(frozen=True)
class Config:
    """``oc_vectors`` channel blocks x ``ow_block`` pixels of accumulators; ``ic_unroll`` unrolls the
    input channels within a block; ``row_block`` output rows form one parallel task (the parallel axis:
    1 spreads every row, the output height leaves only channel blocks in parallel)."""

    oc_vectors: int
    ow_block: int
    ic_unroll: int = 1
    row_block: int = 1


def plain_window(in_block: int, kernel_width: int) -> bool:
    """Whether a conv's window (kw > 1) reads plain input (``bi = 1``): see :func:`accumulators`."""
    return in_block == 1 and kernel_width > 1


def accumulators(vector_lanes: int, plain_window: bool = False) -> int:
    """Accumulator vectors a tile may hold. AVX2 (16 ymm): 8 + weights + a broadcast. AVX-512 (32 zmm): 24,
    but 16 for a window (kw > 1) over plain input (``bi = 1``: a stem's 3 channels, or a conv after a plain-layout
    op such as ConvNeXt's downsampling after its channels-first LayerNorm): there LLVM keeps input broadcasts
    that neighbouring taps share live across the unrolled taps and spills. Measured on Zen 4 (one kernel alone,
    2 threads): ResNeXt's 7x7 stride-2 stem, 3 -> 64 channels at 128x128, ran 4x6 in 543 us with 98 zmm spills
    in its code, 4x5 in 355 (11), 4x4 in 345-354 (none); a 2x2 stride-2 96 -> 192 conv on a plain 64x64 map
    2x11 in 1197 us, 2x8 in 664; PP-OCRv6's 3x3 stride-2 stem at 640x640 3x8 in 1559-1649, 3x5 in 1364-1516.
    The 3x3 stride-2, 4x4 stride-4 and 7x7 stride-1 stems measured the same at 16 and 24, as did 1x1 convs on
    blocked input (which do not spill)."""
    if vector_lanes < 16:
        return 8
    return 16 if plain_window else 24


def default_config(out_blocks: int, out_width: int, vector_lanes: int, plain_window: bool = False,
                   dividing: bool = False) -> Config:
    """The tile with the most useful FMAs per load: ``v * w / (v + w)`` times the share of the row's
    tiles that is real pixels (a width that does not divide the row computes a predicated tail), then the
    most accumulators, then the widest row. Measured (AVX2, 2 threads): 2x4 on 56/28-wide maps (64ch 3x3:
    185 GFLOP/s, 4x2: 160, 1x8: 153); 4x2 on 14-wide (1024->256 1x1: 175; 2x4: 164); 2x4 on 7-wide, one
    pixel of 8 wasted (2048->512 1x1: 165 against 147 for the dividing 1x7; 1024->2048 1x1 stride 2: 159
    against 108; 512ch 3x3: 160 against 156); 3x2 for 24 channels (147; 1x8: 139). ``dividing``: widths that
    divide the row only (a kernel written NCHW, :func:`schedule_plain`)."""
    budget = accumulators(vector_lanes, plain_window)
    best = None
    for vectors in range(1, 5):
        if out_blocks % vectors:
            continue
        for width in range(1, min(budget // vectors, out_width) + 1):
            if dividing and out_width % width:
                continue
            used = out_width / (-(-out_width // width) * width)
            score = (vectors * width / (vectors + width) * used, vectors * width, width)
            if best is None or score > best[0]:
                best = (score, vectors, width)
    return Config(best[1], best[2])


def narrow_group(sch: s_tir.Schedule, anchor) -> int | None:
    """The channels per group of a narrow-group conv (:func:`..blocked.conv2d`), None for any other."""
    group = sch.get(anchor).annotations.get(NARROW_GROUP)
    return int(group) if group is not None else None


def narrow_config(out_width: int, group: int) -> Config:
    """A narrow-group conv's tile: one block by the widest divisor of the row up to ``32 / group`` pixels (8
    at most), fewer accumulators than :func:`default_config`'s as each step also keeps ``group`` shuffled
    inputs and weight vectors live. The width divides the row: tensorize does not take the predicated tail
    block of a width that does not. Measured (Zen 4, 2 threads, kernel alone, 3x3): 128 channels in groups
    of 4 at 32x32, 1x8 53-57 us, 1x4 66, 1x16 65, 2x8 105; 256 in groups of 8 at 16x16, 1x4 75, 1x8 87, 1x16
    143; the same stride 2 from 32x32, 1x4 87, 1x8 85, 2x8 156."""
    cap = min(8, 32 // group)
    return Config(1, max(d for d in range(1, cap + 1) if out_width % d == 0))


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule ``func`` (a fused partition kernel); None when it is not this rule's kernel."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, config) else None


def inline_views(sch: s_tir.Schedule) -> None:
    """Inline the NCHW -> NCHW[b]c views of epilogue operands (bias, a plain residual) into their readers."""
    for name in block_names(sch):
        if name.startswith("T_blocked_view"):
            sch.compute_inline(sch.get_sblock(name))


def _parallel_inputs(sch: s_tir.Schedule) -> None:
    """The padded or gathered copy of the input (``pad_temp``, :data:`SUBSAMPLE`), when the kernel makes one:
    its outer loops in parallel, its rows vectorized."""
    for name in ("pad_temp", SUBSAMPLE):
        if name in block_names(sch):
            loops = sch.get_loops(sch.get_sblock(name))
            sch.parallel(sch.fuse(*loops[:3]))
            sch.vectorize(loops[-1])


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    match = anchor_loops(sch, ANCHOR, 9)
    if match is None:
        return False
    if PLAIN_CROP in block_names(sch):
        return schedule_plain(sch, vector_lanes, config)
    anchor, (n, ob, oh, ow, oc_i, rco, ry, rx, rci) = match
    group = narrow_group(sch, anchor)
    window = plain_window(int(sch.get(rci).extent), int(sch.get(rx).extent))
    out_width = int(sch.get(ow).extent)
    cfg = config or (narrow_config(out_width, group) if group else
                     default_config(int(sch.get(ob).extent), out_width, vector_lanes, window))
    inline_views(sch)
    epilogue = inline_epilogue(sch, ANCHOR)
    ob_o, ob_i = sch.split(ob, [None, cfg.oc_vectors])
    oh_o, oh_i = sch.split(oh, [None, cfg.row_block])
    ow_o, ow_i = sch.split(ow, [None, cfg.ow_block])
    if group:  # the group's input channels innermost but the lanes: one shuffle step each pixel, tap, block
        sch.reorder(n, ob_o, oh_o, oh_i, ow_o, rco, ry, rx, ow_i, ob_i, rci, oc_i)
        sch.unroll(ow_i)
        sch.unroll(ob_i)
        vectorize_tile(sch, accumulate_in_registers(sch, anchor, epilogue, ow_o), ow_o)
    else:
        rci_o, rci_i = sch.split(rci, [None, cfg.ic_unroll])
        sch.reorder(n, ob_o, oh_o, oh_i, ow_o, rco, ry, rx, rci_o, rci_i, ow_i, ob_i, oc_i)
        register_tile(sch, anchor, epilogue, ow_o, [ob_i, ow_i, rci_i], oc_i)
    # Parallel before decompose_reduction: afterwards the loop nest no longer has compact dataflow.
    sch.parallel(sch.fuse(n, ob_o, oh_o))
    vectorize_tile(sch, sch.decompose_reduction(anchor, rco), ow_o)
    if group:
        sch.tensorize(rci, group_shuffle.ensure(group, int(sch.get(oc_i).extent)))
    _parallel_inputs(sch)
    if SCALED_WEIGHT in block_names(sch):  # a squeeze-and-excitation scale applied to the weight, once per call
        loops = sch.get_loops(sch.get_sblock(SCALED_WEIGHT))
        sch.parallel(sch.fuse(*loops[:2]))
        sch.vectorize(loops[-1])
    return True


def schedule_plain(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """The rule for a conv computed in blocks and written NCHW (:func:`..blocked.plain_crop`, channels padded
    to whole blocks): the same register tile, built from the output side. The epilogue and the crop form one
    NCHW stage; its channels split into tiles of ``oc_vectors`` blocks and its rows into tiles of ``ow_block``
    pixels (a width that divides the row: the channel split's tail is already predicated), the conv computed
    at each tile into a tile-sized local buffer, stored from it along rows (``ow_block`` pixels of one channel
    per vector; the padded channels are never stored); ``row_block`` rows per parallel task, as in
    :func:`schedule`. False when ``config``'s tile does not divide the output."""
    anchor = sch.get_sblock(ANCHOR)
    n, ob, oh, ow, oc_i, rco, ry, rx, rci = sch.get_loops(anchor)
    out_width, block = int(sch.get(ow).extent), int(sch.get(oc_i).extent)
    cfg = config or default_config(int(sch.get(ob).extent), out_width, vector_lanes,
                                   plain_window(int(sch.get(rci).extent), int(sch.get(rx).extent)), dividing=True)
    extents = [int(sch.get(loop).extent) for loop in (ow, ob, oh)]
    # (a template's knobs are random variables, sampled from divisors)
    if any(isinstance(part, int) and extent % part
           for extent, part in zip(extents, (cfg.ow_block, cfg.oc_vectors, cfg.row_block))):
        return False
    inline_views(sch)
    out = inline_epilogue(sch, ANCHOR)
    b, c, y, x = sch.get_loops(out)
    c_o, c_v, c_i = sch.split(c, [None, cfg.oc_vectors, block])
    y_o, y_i = sch.split(y, [None, cfg.row_block])
    x_o, x_i = sch.split(x, [None, cfg.ow_block])
    sch.reorder(b, c_o, y_o, y_i, x_o, c_v, c_i, x_i)
    sch.compute_at(anchor, x_o, preserve_unit_loops=True)
    # the anchor's own loops, now a tile's extents
    n_t, ob_t, oh_t, ow_t, oc_t, rco_t, ry_t, rx_t, rci_t = sch.get_loops(anchor)[-9:]
    rci_o, rci_i = sch.split(rci_t, [None, cfg.ic_unroll])
    sch.reorder(rco_t, ry_t, rx_t, rci_o, rci_i, n_t, oh_t, ow_t, ob_t, oc_t)
    for loop in (n_t, oh_t, ow_t, ob_t, rci_i):
        sch.unroll(loop)
    sch.vectorize(oc_t)
    sch.set_scope(anchor, 0, "local")
    sch.parallel(sch.fuse(b, c_o, y_o))
    init = sch.decompose_reduction(anchor, rco_t)
    vectorize_tile(sch, init, x_o)
    vectorize_tile(sch, out, x_o)
    _parallel_inputs(sch)
    return True
