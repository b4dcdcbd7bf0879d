"""Pooling of NCHW[b]c activations on x86.

- :func:`..blocked.pool2d` (max / average): the depthwise kernel's register tile. Each window tap is one
  vector load of ``b`` channels; ``ow_block`` output pixels are reduced in registers with the window
  unrolled and stored once (an average divided first); channel blocks and rows run in parallel. The zero
  (max: lowest float) border is read through a bounds check, no padded copy.
- :func:`..blocked.spatial_mean` (global average): one channel block per parallel iteration, summed over
  the map in a vector register.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..computes.blocked import POOL_ANCHORS, SPATIAL_SUM
from ..common import block_names, largest_divisor, register_tile, vectorize_tile


def default_ow_block(out_width: int) -> int:
    """Pixels per register tile: the largest divisor of the row up to 8 (7 on 56/28/14/7-wide rows)."""
    return 7 if out_width % 7 == 0 else largest_divisor(out_width, 8)


def apply(func: tirx.PrimFunc, vector_lanes: int, ow_block: int | None = None) -> tirx.PrimFunc | None:
    """Schedule a blocked pooling kernel; None when ``func`` is not one."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, vector_lanes, ow_block) else None


def schedule(sch: s_tir.Schedule, vector_lanes: int, ow_block: int | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it is not a blocked pooling."""
    del vector_lanes  # the vector is the channel block, whatever the target's width
    names = block_names(sch)
    if names == [SPATIAL_SUM, "spatial_mean"]:
        _spatial_mean(sch)
        return True
    anchors = [name for name in POOL_ANCHORS.values() if name in names]
    if len(anchors) != 1:
        return False
    anchor = sch.get_sblock(anchors[0])
    loops = sch.get_loops(anchor)
    if len(loops) != 7:
        return False
    n, c, oh, ow, c_i, ry, rx = loops
    for name in names[:names.index(anchors[0])]:
        sch.compute_inline(sch.get_sblock(name))  # the padded view: a bounds check per tap
    after = names[names.index(anchors[0]) + 1:]
    epilogue = sch.get_sblock(after[-1]) if after else None  # the average's division
    ow_o, ow_i = sch.split(ow, [None, ow_block or default_ow_block(int(sch.get(ow).extent))])
    sch.reorder(n, c, oh, ow_o, ry, rx, ow_i, c_i)
    register_tile(sch, anchor, epilogue, ow_o, [ry, rx, ow_i], c_i)
    sch.parallel(sch.fuse(n, c, oh))
    vectorize_tile(sch, sch.decompose_reduction(anchor, ry), ow_o)
    return True


def _spatial_mean(sch: s_tir.Schedule) -> None:
    total = sch.get_sblock(SPATIAL_SUM)
    n, c, c_i, ry, rx = sch.get_loops(total)
    sch.reorder(n, c, ry, rx, c_i)
    channel = sch.fuse(n, c)
    sch.parallel(channel)
    sch.vectorize(c_i)
    sums = sch.cache_write(total, 0, "local")
    sch.reverse_compute_at(sums, channel)
    sch.vectorize(sch.get_loops(sums)[-1])
    init = sch.decompose_reduction(total, ry)
    sch.vectorize(sch.get_loops(init)[-1])
    mean = sch.get_sblock("spatial_mean")
    block = int(sch.get(c_i).extent)
    _, channels, *units = sch.get_loops(mean)  # units: the kept H, W
    outer, inner = sch.split(channels, [None, block])
    sch.reorder(outer, *units, inner)
    sch.vectorize(inner)
