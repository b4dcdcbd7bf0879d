"""INT8 conv2d (:func:`tvmfuse.schedules.computes.int8.conv2d_compute`) on x86.

The accumulator tile is ``oc_blocks`` x 16 output channels by ``ow_block`` output pixels of one row, kept in
vector registers over the whole reduction (input-channel blocks of 4, kernel rows, kernel columns) and
requantized straight from the registers into the NCHW or NCHW16c output. An NCHW input is first repacked to
NCHW4c and padded with the zero point (``data_pack``, one parallel pass), so the 4 input channels of a step
are one 32-bit word; an NCHW16c input already is, and is read in place when there is no padding.

- With AVX512-VNNI the 16x4 inner step is tensorized with :mod:`tvmfuse.schedules.x86.intrin.vnni` (one
  ``vpdpbusd`` per pixel and block: the 64 weight bytes of the step loaded once, the pixel's 4 bytes
  broadcast); with AVX-VNNI (256-bit, no AVX-512) two ``vpdpbusd`` on ymm (``"vnni256"``).
- Without VNNI, 7-bit weights (what the INT8 passes quantize to there) stay in the int8 16x4 blocks, and
  the kernel is marked exact for int16 pair sums (``int8.EXACT_PAIRS_ATTR``): the step is
  :mod:`tvmfuse.schedules.x86.intrin.maddubs` (``vpmaddubsw``, then ``vpmaddwd`` with ones). Codes that do not
  fit come packed as int16 pairs (``int8_ref.to_pairs``) and the step is
  :mod:`tvmfuse.schedules.x86.intrin.madd_pairs`: ``vpmaddwd`` on the pixel's zero-extended byte pairs, no
  horizontal adds. AVX2 code on Zen 4, 2 threads, ResNet-50 INT8 / FP32: 0.94x on pairs, 0.62x on 7-bit.
- unmarked int8 weights without VNNI, or a target below AVX2: the step's plain description (``"generic"``), which
  LLVM vectorizes.

The parallel axis is (batch, channel tile, output row). Tiles that divide the row are chosen (a split with
a remainder puts predicates in the inner loop). A conv of fewer than :data:`SERIAL_MACS` multiply-adds
(squeeze-and-excitation convs on a 1x1 map) runs on one thread, its repacking too: waking the pool's other
thread costs more than the whole kernel.
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from .. import families
from ..computes import int8
from ..common import (SERIAL_MACS, accumulate_in_registers, block_names, inline_epilogue, iterations,
                      largest_divisor, read_coefficients, vectorize_tile)
from . import int8_amx, int8_winograd
from .intrin import madd_pairs, maddubs, vnni

ANCHOR, PAD = families.CONV2D.int8.anchor_block, families.CONV2D.int8.pad_block
# The AVX2 pair step's tiles (channel blocks, pixels) for stride-1 convs, in order of preference: each pixel's
# broadcast and two shuffles then serve 2-3 blocks (12 or 8 of the 16 ymm). AVX2 code on Zen 4, 2 threads,
# NCHW16c, kernel alone (us, the width-first tile -> this): 1x1 24->144 at 56x56 152 -> 130, 96->576 at 14x14
# 117 -> 94, 64->384 at 14x14 124 -> 98, 32->192 at 28x28 139 -> 114, 16->96 at 112x112 274 -> 283; 2x2:
# 3x3 64->64 at 56x56 1010 -> 822, 256->256 at 14x14 771 -> 745, 1x1 384->64 at 14x14 42 -> 39, 144->24 at
# 56x56 124 -> 120. Stride-2 3x3 convs lose with 2x2 (128->256 at 28x28 411 -> 438): they keep the row tile.
PAIR_TILES = ((3, 2), (2, 2))
# The vpmaddubsw step's tiles for 1x1 convs over maps at most BYTE_PAIR_WIDTH wide, first: more channel
# blocks of one pixel (each step's weights then stream as memory operands, one broadcast per step, nothing
# spilled). AVX2 code on Zen 4, 2 threads, NCHW16c, kernel alone, 9 interleaved rounds (us, PAIR_TILES'
# choice -> this): 32->192 at 28x28 47 -> 36, 64->384 at 14x14 33 -> 30, 384->64 32 -> 30, 96->576 67 -> 63,
# 256->1024 337 -> 317, 1024->256 363 -> 344, 160->960 at 7x7 49 -> 41. Wider maps keep PAIR_TILES (24->144
# at 56x56: 91 there, 98 with (3, 1)), and so do 3x3 convs: ResNet-18 INT8 took 1.16x as long with them.
BYTE_PAIR_TILES = ((6, 1), (4, 1))
BYTE_PAIR_WIDTH = 28
# AVX512-VNNI: 8 or more pixels of 2 channel blocks spill (ResNet-50's 64->64 1x1 at 56x56: 195 stack
# accesses in the kernel against 55 with 4 blocks of 4, 129 us against 55), so a row tile takes at most
# VNNI_PIXELS; and 1x1 convs reading at most VNNI_POINTWISE_K channels take more blocks of 2-4 pixels first.
# Zen 4, 2 threads, NCHW16c, kernel alone, 7 interleaved rounds (us, 2 blocks of the widest row tile -> this):
# 64->64 at 56x56 129 -> 51, 64->256 471 -> 180, 24->144 411 -> 74, 16->96 at 112x112 586 -> 153, 48->96 at
# 96x96 772 -> 157, 128->512 at 28x28 200 -> 168, 96->576 at 14x14 62 -> 42, 256->1024 211 -> 173; 3x3
# 64->64 at 56x56 386 -> 324. Wider reductions keep 2 blocks of 7 (1024->256 at 14x14: 228, 248 with (4, 2)).
VNNI_PIXELS = 7
# Pixels per tile, at most, of a kernel writing NCHW (a float32 output for FP32 readers): each channel's
# pixels of the tile are one store, gathered from the lanes of the tile's registers, so a wide row of one
# channel block beats the NCHW16c tiles' 2-3 blocks of 2 pixels (2-pixel stores). 1x1 32->96 at 160x160,
# float32 NCHW out, kernel alone, 2 threads on Zen 4 (us): AVX2 pair step (3, 2) 5845 -> (1, 4) 1849, (1, 5)
# 1896, (1, 8) 2143 (spills); AVX512-VNNI (3, 2) 5552 -> (1, 8) 1166, (1, 10) 1208; uint8 NCHW out 2114 ->
# 1129. The NCHW16c output of the same conv: 995 and 462.
PLAIN_OUT_PIXELS = 8
VNNI_POINTWISE_TILES = ((6, 2), (4, 2), (3, 4), (2, 4))
VNNI_POINTWISE_K = 256


@dataclasses.dataclass(frozen=True)
class Config:
    """``oc_blocks`` 16-channel blocks x ``ow_block`` pixels accumulate in registers.

    ``dot`` forces the 16x4 step's implementation (a kind of :mod:`~tvmfuse.schedules.x86.intrin.vnni` for
    int8 weights, of :mod:`~tvmfuse.schedules.x86.intrin.madd_pairs` for int16 pairs; both have
    ``"generic"``); None picks it from the target and the layout (:func:`dot_kind`). The tests run
    the VNNI tiling with ``"generic"`` to check it on any CPU.
    """

    oc_blocks: int
    ow_block: int
    dot: str | None = None


def dot_kind(vector_bits: int, has_vnni: bool, pairs: bool = False, exact_pairs: bool = False) -> str:
    """The step for the weight layout: int16 ``pairs`` take :mod:`.intrin.madd_pairs` at the target's vector
    width; int8 16x4 blocks take VNNI where the target has it, else :mod:`.intrin.maddubs` where their pairs
    are marked exact for it (``exact_pairs``, :func:`exact_pairs_marked`); anything else the generic step."""
    if pairs:
        return madd_pairs.kind_for(vector_bits)
    if has_vnni:
        return "vnni" if vector_bits >= 512 else "vnni256"
    if exact_pairs and vector_bits >= 256:
        return "maddubs512" if vector_bits >= 512 else "maddubs"
    return "generic"


def intrinsic(dot: str, pairs: bool, data: str = "uint8") -> str:
    """The registered tensor intrinsic of step ``dot`` for the weight layout (and, with pairs, the dtype
    ``data`` the step reads the input in)."""
    if dot in maddubs.KINDS:
        return maddubs.ensure(dot)
    return madd_pairs.ensure(dot, data) if pairs else vnni.ensure(dot, "local")


def exact_pairs_marked(sch: s_tir.Schedule) -> bool:
    """Whether the kernel's int8 weights are marked exact for ``vpmaddubsw`` (``int8.EXACT_PAIRS_ATTR``, set by
    the INT8 passes after checking the codes): only then may a target without VNNI take that step."""
    attrs = sch.mod["main"].attrs
    return attrs is not None and int8.EXACT_PAIRS_ATTR in attrs and bool(attrs[int8.EXACT_PAIRS_ATTR])


def weight_pairs(sch: s_tir.Schedule, anchor) -> bool:
    """Whether the accumulation reads its weight as int16 pairs (else int8 16x4 blocks)."""
    return any(str(region.source.dtype) == "int16" for region in sch.get(anchor).reads)


def accumulators(vector_bits: int, dot: str) -> int:
    """Vector registers the tile may use for accumulators.

    16 ymm: 12 for the pair step, whose weights are memory operands (2 pair registers and 2 temporaries
    besides), and for 256-bit VNNI (a broadcast and a weight register), 8 otherwise. 32 zmm: 24 (one
    weight and one broadcast register per step; 2 pairs and temporaries with the pair step).
    """
    if vector_bits < 512:
        return 12 if dot in ("avx2", "vnni256", "maddubs") else 8
    return 24


def default_config(out_channel_blocks: int, out_width: int, vector_bits: int, has_vnni: bool,
                   pairs: bool = False, stride: int = 1, exact_pairs: bool = False, taps: int = 1,
                   in_channels: int = 0, plain_out: bool = False) -> Config:
    """Two channel blocks when they divide and fit, then the widest row tile (a divisor) that fits (with
    AVX512-VNNI at most :data:`VNNI_PIXELS`). The AVX2 pair step with a stride-1 conv takes 3 (else 2) channel
    blocks of 2 pixels first (:data:`PAIR_TILES`), after :data:`BYTE_PAIR_TILES` (``vpmaddubsw``) or
    :data:`VNNI_POINTWISE_TILES` (VNNI) for the 1x1 convs those name. An NCHW output (``plain_out``) takes
    one channel block of up to :data:`PLAIN_OUT_PIXELS` pixels (see there)."""
    dot = dot_kind(vector_bits, has_vnni, pairs, exact_pairs)
    per_block = max(1, int8.BLOCK_O * 32 // vector_bits)  # vector registers per 16 int32 accumulators
    budget = accumulators(vector_bits, dot)
    if plain_out:
        return Config(1, largest_divisor(out_width, min(PLAIN_OUT_PIXELS, budget // per_block)))
    preferred = ((BYTE_PAIR_TILES if dot == "maddubs" and taps == 1 and out_width <= BYTE_PAIR_WIDTH else ())
                 + (VNNI_POINTWISE_TILES if dot == "vnni" and taps == 1 and in_channels <= VNNI_POINTWISE_K else ())
                 + (PAIR_TILES if dot in ("avx2", "maddubs") and stride == 1 else ()))
    for oc_blocks, ow_block in preferred:  # the first that divides
        if out_channel_blocks % oc_blocks == 0 and out_width % ow_block == 0:
            return Config(oc_blocks, ow_block)
    oc_blocks = 2 if out_channel_blocks % 2 == 0 and 2 * per_block * 4 <= budget else 1
    pixels = max(1, budget // (oc_blocks * per_block))
    if dot == "vnni":
        pixels = min(pixels, VNNI_PIXELS)
    ow_block = largest_divisor(out_width, pixels)
    if ow_block == 1 and out_width <= 2 * pixels:
        ow_block = out_width  # a short row with a prime width (7): one tile, a few spills beat 1-pixel tiles
    return Config(oc_blocks, ow_block)


def apply(func: tirx.PrimFunc, vector_bits: int, has_vnni: bool, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule an INT8 conv2d kernel; None when ``func`` is not one (or ``config`` does not divide it)."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_bits, has_vnni, config) else None


def schedule(sch: s_tir.Schedule, vector_bits: int, has_vnni: bool, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it does not match. A kernel of the
    AMX form (weight in tiles) takes :mod:`.int8_amx`'s rule, a Winograd one :mod:`.int8_winograd`'s."""
    if int8_amx.matches(sch):
        return int8_amx.schedule(sch)
    if int8_winograd.matches(sch):
        return int8_winograd.schedule(sch, vector_bits)
    names = block_names(sch)
    if ANCHOR not in names or PAD not in names:
        return False
    anchor = sch.get_sblock(ANCHOR)
    loops = sch.get_loops(anchor)
    if len(loops) != 9:
        return False
    n, ob, oh, ow, oi, rcb, ry, rx, rci = loops
    o_blocks, out_width = int(sch.get(ob).extent), int(sch.get(ow).extent)
    pairs, exact = weight_pairs(sch, anchor), exact_pairs_marked(sch)
    taps = int(sch.get(ry).extent) * int(sch.get(rx).extent)
    plain_out = len(sch.mod["main"].params[-1].ty.shape) == 4  # NCHW, not NCHW16c
    cfg = config or default_config(o_blocks, out_width, vector_bits, has_vnni, pairs, _width_stride(sch, anchor),
                                   exact, taps, int(sch.get(rcb).extent) * int8.BLOCK_I, plain_out)
    dot = cfg.dot or dot_kind(vector_bits, has_vnni, pairs, exact)
    if o_blocks % cfg.oc_blocks or out_width % cfg.ow_block:
        return False
    epilogue = inline_epilogue(sch, ANCHOR)
    ob_o, ob_i = sch.split(ob, [None, cfg.oc_blocks])
    ow_o, ow_i = sch.split(ow, [None, cfg.ow_block])
    sch.reorder(n, ob_o, oh, ow_o, rcb, ry, rx, ob_i, ow_i, oi, rci)
    sch.unroll(ob_i)
    sch.unroll(ow_i)
    consumer = accumulate_in_registers(sch, anchor, epilogue, ow_o)
    vectorize_tile(sch, consumer, ow_o)
    # Parallel before decompose_reduction / tensorize: afterwards the nest no longer has compact dataflow.
    serial = iterations(sch, anchor) < SERIAL_MACS  # its multiply-adds
    rows = sch.fuse(n, ob_o, oh)
    if not serial:
        sch.parallel(rows)
    init = sch.decompose_reduction(anchor, rcb)
    vectorize_tile(sch, init, ow_o)
    reindex = _pack_is_reindex(sch)
    if reindex:
        sch.compute_inline(sch.get_sblock(PAD))
    data = "uint8" if reindex else str(sch.get(sch.get_sblock(PAD)).writes[0].source.dtype)
    sch.tensorize(oi, intrinsic(dot, pairs, data))
    if not reindex:
        _schedule_pack(sch, serial)
    return True


def _width_stride(sch: s_tir.Schedule, anchor) -> int:
    """The conv's stride along the output row, read off its input column index (1 where it cannot be)."""
    block = sch.get(anchor)
    found = read_coefficients(block, PAD, 3, [block.iter_vars[3].var])
    return found[0] if found else 1


def _pack_is_reindex(sch: s_tir.Schedule) -> bool:
    """Whether ``data_pack`` only reindexes NCHW16c data (no spatial padding): every 4 channels it hands the
    VNNI step already lie in one 32-bit word of the input, so the kernel reads the input in place. On Zen 4
    (x86-avx512, 2 threads, kernel alone): ResNet-50's 256->64 1x1 at 56x56 187 -> 133 us, 256->512 1x1
    stride 2 332 -> 277 us, 1024->256 1x1 at 14x14 140 -> 121 us."""
    pack = sch.get(sch.get_sblock(PAD))
    src, dst = ([int(d) for d in region.source.shape] for region in (pack.reads[0], pack.writes[0]))
    return len(src) == 5 and src[2:4] == dst[2:4]


def _schedule_pack(sch: s_tir.Schedule, serial: bool = False) -> None:
    """NCHW -> NCHW4c with padding: parallel over (batch, channel block, row) unless ``serial``, the 4
    channels of a pixel one 32-bit vector (64 channels 56x56: 0.09 ms; unrolled or serial 0.15-0.4 ms, fused
    (x, c) vectors 0.13)."""
    pack = sch.get_sblock(PAD)
    b, cb, y, x, ci = sch.get_loops(pack)
    rows = sch.fuse(b, cb, y)
    if not serial:
        sch.parallel(rows)
    sch.vectorize(ci)

