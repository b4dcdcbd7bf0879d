"""Dense (``data[M, K] x weight[K, N]``, constant weight) on x86.

At batch 1 this is a matrix-vector product bound by reading the weight once: each task owns ``n_block``
output columns held in registers and streams the matching weight columns row by row (contiguous
vector loads), the fused epilogue applied before the store. With more rows (a recognizer's per-timestep
classifier, ``[40, 120] x [120, 18720]``) ``m_block`` rows share each weight vector loaded: an
``m_block x n_block`` register tile, one broadcast per row and one load per weight vector. The weight is
packed at compile time in panels of ``n_block`` columns (``[N/n_block, K, n_block]``), so a tile streams one
contiguous panel; read from a row-major ``[K, N]`` it touched K rows ``4 N`` bytes apart, too many streams for
the prefetcher once the weight is not in cache: cold, ``[1, 1280] x [1280, 1000]`` took 279 us plain and
120 us packed, the ``[40, 120] x [120, 18720]`` head 1475 and 1158 us (Zen 4). Columns are
unrolled whole vectors: one 48- or 80-lane vector (what LLVM gets from a vectorized 48-wide loop) ran the
``[40, 80] x [80, 6912]`` head 3.5x (48) and 12x (80) slower than 32 or 64 columns (Zen 4).
"""

from __future__ import annotations

import dataclasses

from tvm import s_tir, tirx

from ..common import (accumulate_in_registers, anchor_loops, dividing_vector, inline_epilogue, largest_divisor,
                      vectorize_tile)
from .conv2d import _accumulators as accumulators

ANCHOR = "T_matmul_NN"
PANEL_BYTES = 16 * 1024
ROWS_BYTES = 32 * 1024  # the m_block x K data rows a tile reads for every column panel: one L1d
PARALLEL_MACS = 1 << 16


@dataclasses.dataclass(frozen=True)
class Config:
    n_block: int
    k_unroll: int
    m_block: int = 1


def default_config(n: int, k: int, vector_lanes: int, m: int = 1) -> Config:
    """One row: up to 5 whole vectors of outputs per task (else the largest divisor of N up to 4 vectors).
    More rows: see :func:`_row_tile`. K unrolled by 8.

    Whole vectors matter: N = 1000 split 25 wide streams 100-byte row pieces in 3 partial vectors, 1.5x slower
    than 40 wide (measured on MobileNetV2's classifier, 1280 x 1000).
    """
    if m > 1 and (tile := _row_tile(m, n, k, vector_lanes)) is not None:
        return tile
    whole = [d for d in range(vector_lanes, 5 * vector_lanes + 1, vector_lanes) if n % d == 0]
    return _config(whole[-1] if whole else largest_divisor(n, 4 * vector_lanes), vector_lanes, k, m, vector_lanes)


def _row_tile(m: int, n: int, k: int, vector_lanes: int) -> Config | None:
    """Several rows: 1, 2 or 4 whole vectors of columns (the widest vector dividing N, down to 4 lanes), the
    widest whose ``K x n_block`` weight panel stays in L1 (16 KB: half of a 32 KB L1d), and as many rows as
    the accumulator budget holds. None when no vector of 4 or more divides N.

    Measured on Zen 4 (AVX-512): ``[40, 120] x [120, 18720]`` took 3.6-4.0 ms with 80 columns x 1 row (a 38 KB
    panel re-read from L2 per row), 1.4-1.7 ms with 32 x 10. Three or five vectors ran 2x slower than two
    or four on ``[40, 80] x [80, 6912]`` (unexplained); a 60-column tile of ``[40, 120] x [120, 360]``
    (partial vectors) 5x slower than 8-lane vectors.
    """
    vector = dividing_vector(n, vector_lanes)
    if vector is None:
        return None
    widths = [vector * v for v in (1, 2, 4) if n % (vector * v) == 0 and (v == 1 or vector * v * k * 4 <= PANEL_BYTES)]
    return _config(widths[-1], vector, k, m, vector_lanes)


def _config(n_block: int, vector: int, k: int, m: int, vector_lanes: int) -> Config:
    """``n_block`` columns (``vector``-lane vectors), K unrolled by up to 8, and as many rows as the conv
    kernel's accumulator budget holds beside the column vectors, and as fit in L1 with their K values
    (``ROWS_BYTES``): 16 rows of K = 1024 (64 KB, one stream per row from L2) ran ConvNeXt's
    ``[16, 1024] x [1024, 256]`` in 90 us, 8 rows in 38 us (Zen 4, kernel alone)."""
    vectors = -(-n_block // vector)
    budget = min(accumulators(vector_lanes) // vectors, ROWS_BYTES // (4 * k))
    return Config(n_block, largest_divisor(k, 8), row_block(m, max(1, budget)))


def row_block(m: int, budget: int) -> int:
    """Rows per register tile: the largest divisor of M within ``budget``; when that is under half the budget
    (a prime M, such as a 31-step LSTM's input projection), M split evenly into ``ceil(M / budget)`` tiles,
    the last one short (its missing rows are a predicate on the unrolled row loop; the column vectors stay
    whole). One row at a time, ``[31, 256] x [256, 384]`` re-streamed its 384 KB weight from L2 per row:
    112 us, against 34 us in two tiles of 16 rows (Zen 4)."""
    divisor = largest_divisor(m, budget)
    if 2 * divisor >= budget:
        return divisor
    return -(-m // -(-m // budget))


def packed_block(sch: s_tir.Schedule, anchor) -> int | None:
    """The column panel of a weight read packed ``[N/n_block, K, n_block]`` (None: a plain ``[K, N]``)."""
    shapes = [[int(d) for d in region.source.shape] for region in sch.get(anchor).reads]
    return next((shape[2] for shape in shapes if len(shape) == 3), None)


def whole_panels(n_block: int, panel: int | None) -> int:
    """The tile's columns: ``n_block`` when it covers whole panels of a packed weight (or the weight is plain),
    else one panel (a tile of another width would read parts of two)."""
    return n_block if panel is None or n_block % panel == 0 else panel


def apply(func: tirx.PrimFunc, vector_lanes: int, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule ``func`` (a fused partition kernel); None when it is not this rule's kernel."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, config) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place (also the body of the MetaSchedule template); False if no match."""
    match = anchor_loops(sch, ANCHOR, 3)
    if match is None:
        return False
    anchor, (i, j, k) = match
    n, k_extent, m = (int(sch.get(loop).extent) for loop in (j, k, i))
    cfg = config or default_config(n, k_extent, vector_lanes, m)
    cfg = dataclasses.replace(cfg, n_block=whole_panels(cfg.n_block, packed_block(sch, anchor)))
    epilogue = inline_epilogue(sch, ANCHOR)
    i_o, i_i = sch.split(i, [None, cfg.m_block])
    vector = dividing_vector(cfg.n_block, vector_lanes) or cfg.n_block
    j_o, j_v, j_i = sch.split(j, [None, cfg.n_block // vector, vector])
    k_o, k_i = sch.split(k, [None, cfg.k_unroll])
    sch.reorder(j_o, i_o, k_o, k_i, i_i, j_v, j_i)
    for loop in (k_i, i_i, j_v):
        sch.unroll(loop)
    sch.vectorize(j_i)
    consumer = accumulate_in_registers(sch, anchor, epilogue, i_o)
    vectorize_tile(sch, consumer, i_o, vector_lanes)
    tile = sch.fuse(j_o, i_o)
    if m * n * k_extent >= PARALLEL_MACS:
        sch.parallel(tile)
    vectorize_tile(sch, sch.decompose_reduction(anchor, k_o), tile, vector_lanes)
    return True
