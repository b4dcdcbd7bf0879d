"""Layout transforms (NCHW <-> NCHW[b]c) on x86: transposed in ``b x v`` tiles, rows in parallel.

Each transform is a transpose of ``b`` channels against the pixels of a row. A tile takes ``v`` pixels (a
vector width dividing the row) of all ``b`` channels: the channel loop is unrolled and the pixel loop
vectorized, so each step moves whole vectors on the plain side (one channel, ``v`` pixels) and LLVM turns
the ``b`` strided accesses of the blocked side into loads/stores and shuffles.

Measured on Zen 4 (``x86-avx512``), 1x16x320x320 float32, the shape of PP-OCR detectors' first feature
map: to_plain 761 -> 157 us and to_blocked 476 -> 110 us. Vectorizing a whole 320-pixel row instead (the
previous schedule) also made LLVM legalize a 320-lane gather: 20 s of compile time for one such kernel,
most of the 57 s PP-OCRv6 tiny det took. A row whose width no vector divides keeps the old shape: to_blocked
vectorizes the block, to_plain the row when it is at most two vectors long (else it runs scalar).

INT8 codes (one byte, blocks of 16) back to NCHW go 16 pixels at a time through :mod:`.intrin.transpose_bytes`
(a 16 x 16 byte transpose in registers): 1x96x160x160 uint8 alone 351 -> 95 us with AVX2 code, 351 -> 80 us
with Zen 4's (the byte gathers LLVM made of the strided side, above, cost an extract and an insert per byte).
In a model the transforms are mostly bound by memory: ch_ppocrv4_det's INT8 to_plain kernels 720 -> 660 us per
inference (AVX2 code, 12 rounds of 20 runs, two builds each).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..computes.blocked import TO_BLOCKED, TO_PLAIN
from ..common import block_names, dividing_vector
from .intrin import transpose_bytes


def apply(func: tirx.PrimFunc, vector_lanes: int) -> tirx.PrimFunc | None:
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes) else None


def _to_plain(sch: s_tir.Schedule, block, vector_lanes: int) -> None:
    n, c, y, x = sch.get_loops(block)
    channels = int(sch.get(block).reads[0].source.shape[4])
    v = dividing_vector(int(sch.get(x).extent), vector_lanes)  # pixels per tile
    if v is None or int(sch.get(c).extent) % channels:
        # No vector divides the row, or the last block is padding (INT8 codes): the row as one vector where
        # that is short (7, 14, 25 pixels: a few registers), else scalar (a wide vector cost LLVM 20 s).
        sch.parallel(sch.fuse(n, c, y))
        if int(sch.get(x).extent) <= 2 * vector_lanes:
            sch.vectorize(x)
        return
    dtype = str(sch.get(block).reads[0].source.dtype)
    co, ci = sch.split(c, [None, channels])
    if dtype in transpose_bytes.DTYPES and channels == transpose_bytes.SIDE \
            and int(sch.get(x).extent) % transpose_bytes.SIDE == 0:
        # INT8 codes: 16 x 16 byte tiles transposed in registers (LLVM moved strided bytes one at a time)
        xo, xi = sch.split(x, [None, transpose_bytes.SIDE])
        sch.reorder(n, co, y, xo, ci, xi)
        sch.parallel(sch.fuse(n, co, y))
        sch.tensorize(ci, transpose_bytes.register(dtype))
        return
    xo, xi = sch.split(x, [None, v])
    sch.reorder(n, co, y, xo, ci, xi)
    sch.parallel(sch.fuse(n, co, y))
    sch.unroll(ci)
    sch.vectorize(xi)


def _to_blocked(sch: s_tir.Schedule, block, vector_lanes: int) -> None:
    n, cb, y, x, i = sch.get_loops(block)
    v = dividing_vector(int(sch.get(x).extent), vector_lanes)  # pixels per tile
    if v is None:
        sch.parallel(sch.fuse(n, cb, y))
        sch.vectorize(i)
        return
    xo, xi = sch.split(x, [None, v])
    sch.reorder(n, cb, y, xo, i, xi)
    sch.parallel(sch.fuse(n, cb, y))
    sch.unroll(i)
    sch.vectorize(xi)


def schedule(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it is not a layout transform."""
    names = block_names(sch)
    if names not in ([TO_BLOCKED], [TO_PLAIN]):
        return False
    block = sch.get_sblock(names[0])
    (_to_blocked if names[0] == TO_BLOCKED else _to_plain)(sch, block, vector_lanes)
    return True
