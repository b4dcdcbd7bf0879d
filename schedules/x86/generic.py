"""The default x86 schedule for the kernels TVM's default path lowers: every op outside a partition that
tvmfuse has no kernel for (concat, softmax, transpose, elementwise ops the patterns leave, pools of plain
tensors, ...). Unscheduled, such a kernel runs on one core, one scalar at a time.

Elementwise producers are inlined into their consumers; each remaining stage runs its data-parallel loops
fused and in parallel (when there is enough work to share), and a stage without a reduction is vectorized
along its fused loop when the vector width divides it. Tuning logs replace it where they have a record.
"""

from __future__ import annotations

import itertools
import math

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad  # what tirx.BufferLoad builds

from ..common import dividing_vector, largest_divisor, vectorize_steps
from ..computes.resize import KEEP

PARALLEL_MIN = 4096  # iterations below which a parallel loop costs more than it saves (thread wake-up)
TAIL_ROW = 8  # rows of at least this many vectors take whole vectors and a scalar tail over partial vectors
PLANES = True  # elementwise stages whose (h, w) planes are contiguous everywhere vectorize along the plane


CONCAT = "T_concat"  # topi's concatenate stage ...
HEAVY_PART = 40  # ... stores a part whose value takes at least this many expression nodes instead of inlining it
_CHILDREN = ("a", "b", "value", "condition", "true_value", "false_value")


def walk(expr):
    """Every node of ``expr``, loads' indices included (depth first)."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(getattr(node, "args", ()) or ())
        stack.extend(getattr(node, "indices", ()) or ())
        stack.extend(child for name in _CHILDREN if (child := getattr(node, name, None)) is not None
                     and isinstance(child, tvm.ir.expr.Expr))


def _nodes(expr, limit: int) -> int:
    """Expression nodes of ``expr`` (loads count their indices), counted up to ``limit``."""
    return sum(1 for _ in itertools.islice(walk(expr), limit))


def heavy_concat_part(sch: s_tir.Schedule, block) -> bool:
    """Whether a concatenate reads ``block`` and computing it takes ``HEAVY_PART`` nodes or more."""
    if not any(sch.get(c).name_hint.startswith(CONCAT) for c in sch.get_consumers(block)):
        return False
    store = sch.get(block).body
    return isinstance(store, tirx.BufferStore) and _nodes(store.value, HEAVY_PART) >= HEAVY_PART


def _inline(sch: s_tir.Schedule) -> None:
    """Inline every stage that can be (elementwise, padding, broadcast views) into its consumers, except a
    costly part of a concatenate. Inlined there, each output element selects its part with
    ``if_then_else``, which in vector code computes every part for every element (and reads through
    nearest-resize indices are gathers): a quantized PP-OCRv5 det's FPN neck, simulated in float between
    its QDQ pairs and fused by TVM into one kernel ending in a 4-way concat, took 20 ms of the model's 63;
    stored part by part, the model takes 44 ms. A cheap part (a copy, a cast) stays inlined: storing
    YOLOv8n's head parts cost 1.4%. A stage marked ``KEEP`` stays too (a two-pass resize's rows, which
    inlined would be recomputed for every output row)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    for block in list(blocks)[:-1]:
        if heavy_concat_part(sch, block) or KEEP in sch.get(block).annotations:
            continue
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            pass  # a reduction, or a stage read by more than one loop nest: it stays a stage


def _full_reduction(sch: s_tir.Schedule, block, loops, vector_lanes: int) -> None:
    """A reduction of a whole tensor to one value (ReduceMin/ReduceMax of dynamic quantization, a global
    sum). The innermost loop is split into vector lanes and the others fused and split into up to 64
    chunks; ``chunks x lanes`` partial results (rfactor) are computed in parallel over chunks and
    vectorized over lanes, reading whole vectors, then combined by the original block. Unscheduled, it is
    one scalar loop on one core (0.5 ms for a 1.2 M-element activation)."""
    extents = [int(sch.get(loop).extent) for loop in loops]
    lanes = dividing_vector(extents[-1], vector_lanes)
    chunks = largest_divisor(math.prod(extents[:-1]), 64)
    if math.prod(extents) < PARALLEL_MIN or lanes is None or len(loops) < 2 or chunks < 2:
        return
    outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    chunk, row = sch.split(outer, [chunks, None])
    column, lane = sch.split(loops[-1], [None, lanes])
    sch.reorder(chunk, lane, row, column)
    partial = sch.rfactor(sch.fuse(chunk, lane), 0)
    spatial, row, column = sch.get_loops(partial)
    chunk, lane = sch.split(spatial, [chunks, lanes])
    sch.reorder(chunk, row, column, lane)
    sch.vectorize(lane)
    sch.parallel(chunk)


def _row_reduction(sch: s_tir.Schedule, block, loops, spatial: int, vector_lanes: int) -> None:
    """A reduction along rows (Softmax's max and sum, LayerNorm's moments, ReduceMean over the last axis):
    the innermost reduction loop split into vector lanes and factored out (rfactor), so each row keeps a
    vector of partial results, updated with whole-vector loads, and sums its lanes once at the end (under
    the same row loops, which the caller fuses and runs in parallel).
    Unscheduled, each row is one scalar chain: a 40 x 18720 Softmax (a recognizer's CTC head) took 1.9 ms.

    A row no vector width divides takes its largest divisor below the vector width as a partial vector (an
    18710-wide row: 10 lanes); a split with a tail would carry a predicate, and a predicated vector loop is
    scalarized (a 40 x 18710 sum: 132 us predicated, 37 us in 10 lanes, 22 us for 18720 in 16 lanes).
    """
    extent = int(sch.get(loops[-1]).extent)
    lanes = row_lanes(extent, vector_lanes)
    if lanes < 4 or extent < 2 * lanes:
        return
    _, lane = sch.split(loops[-1], [None, lanes])
    partial = sch.rfactor(lane, spatial)
    partial_loops = sch.get_loops(partial)  # rfactor builds new loops for the partial results
    sch.vectorize(partial_loops[-1])
    sch.reverse_compute_at(block, partial_loops[spatial - 1])


def row_lanes(extent: int, vector_lanes: int) -> int:
    """The vector for a row of ``extent``: a whole vector width dividing it, else its largest divisor up to the
    vector width (a partial vector: no predicated tail, which would scalarize the loop)."""
    return dividing_vector(extent, vector_lanes) or largest_divisor(extent, vector_lanes)


def _vectorize_spatial(sch: s_tir.Schedule, loops, extents: list[int], vector_lanes: int):
    """Vectorize an elementwise stage: the fused loop in whole vectors when the innermost extent divides into
    them (each vector stays inside a row); else the innermost loop alone in its row vector (:func:`row_lanes`);
    else, as the last resort, the fused loop across rows. A vector across rows indexes each lane by
    ``(i * lanes + l) % width``: a gather per operand (Softmax's normalization over 40 x 18710: 0.8 ms
    gathered). Returns the fused outer loop, or None when nothing was vectorized."""
    total, inner = math.prod(extents), extents[-1]
    whole = total % vector_lanes == 0 and total >= vector_lanes
    in_rows = inner % vector_lanes == 0 or len(extents) == 1
    lanes = row_lanes(inner, vector_lanes)
    if 2 * lanes < vector_lanes and inner >= TAIL_ROW * vector_lanes:
        return _vector_rows_and_tail(sch, loops, inner, vector_lanes)
    if not (whole and in_rows) and lanes >= 4 and inner >= lanes:
        column, lane = sch.split(loops[-1], [None, lanes])
        sch.vectorize(lane)
        return sch.fuse(*loops[:-1], column) if len(loops) > 1 else column
    if not whole:
        return None
    outer, lane = sch.split(sch.fuse(*loops) if len(loops) > 1 else loops[0], [None, vector_lanes])
    sch.vectorize(lane)
    return outer


def _vector_rows_and_tail(sch: s_tir.Schedule, loops, inner: int, vector_lanes: int):
    """A long row no useful vector divides (a recognizer's 18385 classes, 5 x 3677): the row's whole vectors
    in one loop, the last ``inner % vector_lanes`` elements in a scalar loop after it (``loop_partition``:
    no predicate in the vector loop, which would scalarize it). The rows run in parallel. Slicing a padded
    ``[40, 18400]`` dense output to ``[40, 18385]``: 189 -> 87 us alone (Zen 4), in 5-lane vectors before."""
    body = inner - inner % vector_lanes
    if body < inner:
        body_loop, _ = sch.loop_partition(loops[-1], [body, None])
    else:
        body_loop = loops[-1]
    _, lane = sch.split(body_loop, [None, vector_lanes])
    sch.vectorize(lane)
    return sch.fuse(*loops[:-1]) if len(loops) > 2 else (loops[0] if len(loops) == 2 else None)


def _accesses(block) -> list | None:
    """``(buffer, indices)`` of a block's store and of every load in the stored value; None when its body is
    not one store."""
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return None
    return [(store.buffer, store.indices)] + [(node.source, node.indices) for node in walk(store.value)
                                              if isinstance(node, TensorLoad)]


def _plane_runs(sch: s_tir.Schedule, block) -> bool:
    """Whether every buffer the block stores or loads is indexed by the block's last two axes as they are,
    and has them as its last two dimensions (or is read at one point of the plane, a per-channel operand):
    each (h, w) plane is one contiguous run in all of them. A
    channel shuffle (concat, reshape, transpose, reshape, split) is such a block once its index arithmetic
    is simplified over the axes' ranges: each output plane copies one input plane."""
    b = sch.get(block)
    accesses = _accesses(b)
    if accesses is None or len(b.iter_vars) < 3:
        return False
    analyzer = tvm.sym.Analyzer()
    for iv in b.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    h, w = b.iter_vars[-2], b.iter_vars[-1]
    plane = [int(h.dom.extent), int(w.dom.extent)]

    def runs(buf, idx) -> bool:
        if len(idx) < 2:
            return False
        y, x = analyzer.simplify(idx[-2]), analyzer.simplify(idx[-1])
        if isinstance(y, tirx.IntImm) and isinstance(x, tirx.IntImm):
            return True  # the same value over the plane (a per-channel operand): a broadcast
        return [int(d) for d in buf.shape[-2:]] == plane and y.same_as(h.var) and x.same_as(w.var)

    return all(runs(buf, idx) for buf, idx in accesses)


def _vector_plane(sch: s_tir.Schedule, loops, plane: int, vector_lanes: int):
    """The last two loops fused into one plane, its whole vectors in one loop and the partial last step in a
    scalar one after it (:func:`..common.vectorize_steps`). Returns the outer loops fused."""
    vectorize_steps(sch, sch.fuse(loops[-2], loops[-1]), vector_lanes, plane if plane % vector_lanes else None)
    return sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]


def _column_factor(sch: s_tir.Schedule, block) -> int | None:
    """``k`` when every buffer the block reads is indexed by its last axis ``x`` only as ``x // k`` or
    ``x % k`` (one constant ``k >= 2``, indices simplified over the axes' ranges): a depth-to-space or pixel
    shuffle (reshape, transpose, reshape) or a nearest upsampling. None otherwise."""
    b = sch.get(block)
    if not isinstance(b.body, tirx.BufferStore) or not b.iter_vars:
        return None
    analyzer = tvm.sym.Analyzer()
    for iv in b.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    x, factors = b.iter_vars[-1].var, set()

    def uses_bare(expr) -> bool:  # x outside a // k or % k, recording each k
        if isinstance(expr, (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)) and expr.a.same_as(x) \
                and isinstance(expr.b, tirx.IntImm):
            factors.add(int(expr.b.value))
            return False
        if isinstance(expr, tirx.Var):
            return expr.same_as(x)
        children = [getattr(expr, name, None) for name in _CHILDREN] + list(getattr(expr, "args", ()) or ())
        return any(uses_bare(c) for c in children if isinstance(c, tvm.ir.expr.Expr))

    for node in walk(b.body.value):
        if isinstance(node, TensorLoad) and any(uses_bare(analyzer.simplify(i)) for i in node.indices):
            return None
    k = factors.pop() if len(factors) == 1 else None
    return k if k is not None and k >= 2 else None


def _split_columns(sch: s_tir.Schedule, loops, k: int, vector_lanes: int, work: int) -> bool:
    """Columns ``x = k * xs + t`` with ``t`` outside ``xs`` (see :func:`_column_factor`): for each ``t`` the
    reads are whole vectors along ``xs`` and the stores go ``k`` apart, instead of a vector loop whose lanes
    each divide and take the remainder of their own index. PP-OCRv4 det's head, kernel alone (AVX2 code, Zen 4):
    depth-to-space + ReLU + quantize to 24 x 320 x 320 codes 1766 -> 987 us; depth-to-space + sigmoid to
    640 x 640, 414 -> 348 us. False (nothing changed) when the row does not divide into ``k`` vectors."""
    if int(sch.get(loops[-1]).extent) % (k * vector_lanes):
        return False
    columns, tap = sch.split(loops[-1], [None, k])
    sch.reorder(tap, columns)
    _, lane = sch.split(columns, [None, vector_lanes])
    sch.vectorize(lane)
    outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0] if len(loops) == 2 else None
    if outer is not None and work >= PARALLEL_MIN and int(sch.get(outer).extent) > 1:
        sch.parallel(outer)
    return True


def _stage(sch: s_tir.Schedule, block, vector_lanes: int) -> None:
    loops = sch.get_loops(block)
    iters = sch.get(block).iter_vars
    extents = [sch.get(loop).extent for loop in loops]
    if len(loops) != len(iters) or not loops or not all(isinstance(e, tirx.IntImm) for e in extents):
        return
    spatial = 0
    while spatial < len(iters) and iters[spatial].iter_type == tirx.IterVar.DataPar:
        spatial += 1
    if spatial == 0 and all(it.iter_type == tirx.IterVar.CommReduce for it in iters):
        return _full_reduction(sch, block, loops, vector_lanes)
    if spatial == 0 or any(it.iter_type == tirx.IterVar.DataPar for it in iters[spatial:]):
        return  # not TE's order (data-parallel loops, then reductions)
    work = math.prod(int(e) for e in extents)
    if spatial < len(iters) - 1:
        # Several reduction loops (ReduceMean over H and W of NCHW): one row of H * W. rfactor takes one
        # loop; without the fuse the kernel fails to schedule and runs scalar on one core (an SE block's mean
        # over 64 x 160 x 160 in an INT8 PP-OCR detector: 1.35 ms).
        loops = loops[:spatial] + [sch.fuse(*loops[spatial:])]
    if spatial < len(iters):
        _row_reduction(sch, block, loops, spatial, vector_lanes)
        loops = sch.get_loops(block)
    outer = None
    sizes = [int(e) for e in extents]
    k = _column_factor(sch, block) if spatial == len(iters) else None
    if k and _split_columns(sch, loops, k, vector_lanes, work):
        return
    if spatial == len(iters) and PLANES and sizes[-1] % vector_lanes and len(sizes) in (3, 4) \
            and math.prod(sizes[:-2]) > 1 and sizes[-2] * sizes[-1] >= 2 * vector_lanes and _plane_runs(sch, block):
        # Rows that do not divide into vectors (ShuffleNet's 14 x 14 planes) but planes that run contiguously:
        # the plane's whole vectors, then its tail; the planes in parallel. Not a single plane (YOLOv8's
        # [1, 80, 2100] head: fused whole, it ran on one core, 56 -> 220 us), nor a blocked tensor, whose last
        # axis is a channel block (an NCHW8c concat on AVX-512: 8-lane vectors 430 us, the plane 480-510).
        outer = _vector_plane(sch, loops, sizes[-2] * sizes[-1], vector_lanes)
    elif spatial == len(iters):
        outer = _vectorize_spatial(sch, loops, sizes, vector_lanes)
    if outer is None:
        outer = sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0]
    if work >= PARALLEL_MIN and int(sch.get(outer).extent) > 1:
        sch.parallel(outer)


def _padded_window(sch: s_tir.Schedule) -> bool:
    """True when a padding stage feeds a reduction: a pool over a padded window."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint.startswith("pad") and any(
                any(it.iter_type != tirx.IterVar.DataPar for it in sch.get(c).iter_vars)
                for c in sch.get_consumers(block)):
            return True
    return False


def schedule(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    """Apply the schedule to ``sch`` in place; False when the kernel has no stage to schedule.

    A pool over a padded window (the plain-layout max-pool between ResNet-50's INT8 stem and layer1) is left
    as TVM lowers it: inlined, the padding's bounds test runs per window element in every lane and the
    fused parallel loop divides per element (768 us in the INT8 model against 451 us unscheduled).
    """
    if not sch.get_child_blocks(sch.get_sblock("root")) or _padded_window(sch):
        return False
    _inline(sch)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        _stage(sch, block, vector_lanes)
    return True


def scheduled(func: tirx.PrimFunc, vector_lanes: int) -> s_tir.Schedule | None:
    """A schedule of ``func`` with this default applied (its trace is what a tuning log records as the
    default), or None when the kernel is left as TVM lowered it."""
    try:
        sch = s_tir.Schedule(func)
        return sch if schedule(sch, vector_lanes) else None
    except s_tir.ScheduleError:
        return None


def apply(func: tirx.PrimFunc, vector_lanes: int) -> tirx.PrimFunc | None:
    """``func`` scheduled, or None when it is left as TVM lowered it."""
    sch = scheduled(func, vector_lanes)
    return sch.mod["main"] if sch is not None else None
