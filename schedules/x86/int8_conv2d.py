"""INT8 conv2d (:func:`tvmfuse.schedules.computes.int8.conv2d_compute`) on x86.

The accumulator tile is ``oc_blocks`` x 16 output channels by ``ow_block`` output pixels of one row, kept in
vector registers over the whole reduction (input-channel blocks of 4, kernel rows, kernel columns) and
requantized straight from the registers into the NCHW or NCHW16c output. An NCHW input is first repacked to
NCHW4c and padded with the zero point (``data_pack``, one parallel pass), so the 4 input channels of a step
are one 32-bit word; an NCHW16c input already is, and is read in place when there is no padding.

- With AVX512-VNNI the 16x4 inner step is tensorized with :mod:`tvmfuse.schedules.x86.intrin.vnni` (one
  ``vpdpbusd`` per pixel and block: the 64 weight bytes of the step loaded once, the pixel's 4 bytes
  broadcast).
- Without VNNI but with AVX2, the same step is tensorized with the intrinsic's exact AVX2 variant
  (``vpmaddwd`` on bytes widened to int16). AVX2, 2 cores, ResNet layers: 75-110 GOP/s, 0.7-0.9x the
  FP32 kernels' time (``bench/int8_kernels.py``): without a byte dot product AVX2 does no more INT8 work
  per instruction than FP32 FMAs.
- Narrower targets: the step's plain description (``"generic"``), which LLVM vectorizes (with AVX2: 55-70
  GOP/s; int32 vectors over the 16 channels instead, whose weight loads are stride-4 gathers: 15).

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
from ..common import accumulate_in_registers, block_names, inline_epilogue, iterations, largest_divisor, vectorize_tile
from .intrin import vnni

ANCHOR, PAD = families.CONV2D.int8.anchor_block, families.CONV2D.int8.pad_block
# Multiply-adds below which the kernel runs serial. Zen 4, x86-avx512, 2 threads, 1x1 map with NCHW input
# (us, parallel -> serial): 88 -> 22 channels 0.92 -> 0.17, 8 -> 2 0.87 -> 0.14; each parallel loop costs
# about 0.7 us of thread wake-up. 8 -> 8 channels at 24x96 (147k) stays parallel.
SERIAL_MACS = 1 << 16


@dataclasses.dataclass(frozen=True)
class Config:
    """``oc_blocks`` 16-channel blocks x ``ow_block`` pixels accumulate in registers.

    ``dot`` forces the 16x4 step's implementation (a kind of :mod:`~tvmfuse.schedules.x86.intrin.vnni`:
    ``"vnni"``, ``"avx2"``, ``"generic"``); None picks it from the target (:func:`dot_kind`). The tests run
    the VNNI tiling with ``"generic"`` to check it on any CPU.
    """

    oc_blocks: int
    ow_block: int
    dot: str | None = None


def dot_kind(vector_bits: int, has_vnni: bool) -> str:
    """VNNI where the target has it, the exact AVX2 step on 256-bit targets, the generic step below."""
    if has_vnni:
        return "vnni"
    return "avx2" if vector_bits >= 256 else "generic"


def accumulators(vector_bits: int, dot: str) -> int:
    """Vector registers the tile may use for accumulators.

    16 ymm (AVX2): 8; the AVX2 step keeps 4 widened weight vectors and 3 temporaries besides. 32 zmm: 24
    with VNNI (one weight and one broadcast register per step), 20 otherwise (not measured: no AVX-512
    machine here).
    """
    if vector_bits < 512:
        return 8
    return 24 if dot == "vnni" else 20


def default_config(out_channel_blocks: int, out_width: int, vector_bits: int, has_vnni: bool) -> Config:
    """Two channel blocks when they divide and fit, then the widest row tile (a divisor) that fits."""
    dot = dot_kind(vector_bits, has_vnni)
    per_block = max(1, int8.BLOCK_O * 32 // vector_bits)  # vector registers per 16 int32 accumulators
    budget = accumulators(vector_bits, dot)
    oc_blocks = 2 if out_channel_blocks % 2 == 0 and 2 * per_block * 4 <= budget else 1
    pixels = max(1, budget // (oc_blocks * per_block))
    ow_block = largest_divisor(out_width, pixels)
    if ow_block == 1 and out_width <= 2 * pixels:
        ow_block = out_width  # a short row with a prime width (7): one tile, a few spills beat 1-pixel tiles
    return Config(oc_blocks, ow_block)


def apply(func: tirx.PrimFunc, vector_bits: int, has_vnni: bool, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule an INT8 conv2d kernel; None when ``func`` is not one (or ``config`` does not divide it)."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_bits, has_vnni, config) else None


def schedule(sch: s_tir.Schedule, vector_bits: int, has_vnni: bool, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it does not match."""
    names = block_names(sch)
    if ANCHOR not in names or PAD not in names:
        return False
    anchor = sch.get_sblock(ANCHOR)
    loops = sch.get_loops(anchor)
    if len(loops) != 9:
        return False
    n, ob, oh, ow, oi, rcb, ry, rx, rci = loops
    o_blocks, out_width = int(sch.get(ob).extent), int(sch.get(ow).extent)
    cfg = config or default_config(o_blocks, out_width, vector_bits, has_vnni)
    dot = cfg.dot or dot_kind(vector_bits, has_vnni)
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
    sch.tensorize(oi, vnni.ensure(dot, "local"))
    if not reindex:
        _schedule_pack(sch, serial)
    return True


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

