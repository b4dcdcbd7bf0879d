"""A channel concatenation of computed parts on x86 (TVM's default path: a detector's FPN neck, upsampled
branches added and concatenated, then quantized in an INT8 model), one part at a time.

TOPI's ``concatenate`` picks each output element's part with ``if_then_else(offset <= c, ...)``. Inlined into
one vector loop, every lane computes every part (and the nearest-resize reads of the upsampled ones are
gathers); :mod:`.generic` therefore stores a costly part in a buffer of its own and reads it back. Here every
stage is inlined into the output stage and its channel loop is split at the parts' borders
(``loop_partition``): in each part the loop bounds decide the select, so a part computes only its own
branch, straight into the output, rows in parallel and each row's pixels (NCHW) or channel lanes (NCHWc)
vectorized. PP-OCRv4 det's neck, kernel alone, 2 threads on Zen 4, AVX2 code (us): the INT8 model's
``dequantize, SE scale, resize x3, add, concatenate, quantize`` to 96 x 160 x 160 codes 3894 -> 1143; the FP32
model's NCHW8c form 1599 -> 260.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from ..common import iterations
from ..computes.resize import KEEP
from .generic import PARALLEL_MIN, heavy_concat_part, row_lanes, walk

CONCAT = "T_concat"  # topi's concatenate stage
_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")


def _borders(block) -> tuple[int, list[int]] | None:
    """``(axis, offsets)`` of the selects ``if_then_else(offset <= v, ...)`` in ``block``'s value, all on one
    block axis ``v``; None when there are none or they test more than one axis or another expression."""
    if not isinstance(block.body, tirx.BufferStore):
        return None
    found: dict = {}
    for node in walk(block.body.value):
        if isinstance(node, tvm.ir.Call) and node.op.same_as(_IF_THEN_ELSE):
            cond = node.args[0]
            if not (isinstance(cond, tirx.LE) and isinstance(cond.a, tirx.IntImm) and isinstance(cond.b, tirx.Var)):
                return None
            found.setdefault(cond.b, set()).add(int(cond.a.value))
    if len(found) != 1:
        return None
    var, offsets = next(iter(found.items()))
    axis = next((i for i, iv in enumerate(block.iter_vars) if iv.var.same_as(var)), None)
    return None if axis is None else (axis, sorted(offsets))


def channel_parts(sch: s_tir.Schedule, block, channels, sizes: list[int]) -> list:
    """Split ``block``'s channel loop ``channels`` into parts of ``sizes`` (``loop_partition``) and run each
    part's rows outermost, in parallel where there is work (a part's channel loop starts at its offset, which
    a fuse does not take). Returns each part's loops below its channel loop (columns, and the lanes of a
    blocked tensor), for the caller to vectorize."""
    parts = sch.loop_partition(channels, sizes[:-1] + [None]) if len(sizes) > 1 else [channels]
    inner_loops = []
    for part in parts:
        leaves = sch.get_child_blocks(part)
        leaf = leaves[0] if leaves else block
        loops = sch.get_loops(leaf)
        c = next(i for i, loop in enumerate(loops) if sch.get_sref(loop).same_as(sch.get_sref(part)))
        channel, row, *rest = loops[c:]
        sch.reorder(row, channel)
        if iterations(sch, leaf) >= PARALLEL_MIN:
            sch.parallel(row)
        inner_loops.append(rest)
    return inner_loops


def _vectorize_part(sch: s_tir.Schedule, inner, vector_lanes: int) -> None:
    """A part's innermost loop vectorized: NCHW, the row's pixels in whole vectors or its largest divisor up to
    the vector; NCHWc, the channel lanes."""
    width = int(sch.get(inner).extent)
    if width == vector_lanes:
        sch.vectorize(inner)
        return
    lanes = row_lanes(width, vector_lanes)
    if lanes >= 4:
        _, lane = sch.split(inner, [None, lanes])
        sch.vectorize(lane)


def schedule(sch: s_tir.Schedule, vector_lanes: int) -> bool:
    """Apply the schedule to ``sch`` (see the module); False when the kernel is not a channel concat with a
    costly part (:func:`.generic.heavy_concat_part`) that inlines into one NCHW or NCHWc stage (``sch`` may
    then be changed: use a fresh one, as :func:`scheduled`)."""
    root = sch.get_sblock("root")
    blocks = list(sch.get_child_blocks(root))
    if not any(sch.get(b).name_hint.startswith(CONCAT) for b in blocks):
        return False
    heavy = False
    for block in blocks[:-1]:
        if KEEP in sch.get(block).annotations:
            return False  # a two-pass resize's rows: a stage of their own (generic keeps it)
        heavy = heavy or heavy_concat_part(sch, block)  # its producers inlined by now, as generic sees it
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            return False  # a reduction, or a stage read twice
    if not heavy:
        return False  # parts that are copies or a cast: generic's one vector loop over them all
    remaining = sch.get_child_blocks(root)
    if len(remaining) != 1:
        return False
    last = remaining[0]
    loops = sch.get_loops(last)
    found = _borders(sch.get(last))
    if found is None or found[0] != 1 or len(loops) not in (4, 5) or len(loops) != len(sch.get(last).iter_vars):
        return False
    extent = int(sch.get(loops[1]).extent)
    cuts = [0] + [b for b in found[1] if 0 < b < extent] + [extent]
    sizes = [b - a for a, b in zip(cuts, cuts[1:])]
    if len(sizes) < 2:
        return False
    for rest in channel_parts(sch, last, loops[1], sizes):
        _vectorize_part(sch, rest[-1], vector_lanes)
    return True


def scheduled(func: tirx.PrimFunc, vector_lanes: int) -> s_tir.Schedule | None:
    """A schedule of ``func`` with this rule applied, or None when it does not fit (nothing changed)."""
    try:
        sch = s_tir.Schedule(func)
        return sch if schedule(sch, vector_lanes) else None
    except s_tir.ScheduleError:
        return None
