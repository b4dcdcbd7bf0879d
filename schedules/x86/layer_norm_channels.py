"""LayerNorm over the channels of NCHW on x86 (the compute is :func:`..layer_norm.layer_norm_channels`): a run
of pixels per task.

A pixel's channels lie a plane apart, but a run of consecutive pixels is consecutive in every plane. So each
task takes a run of pixels (part of a row, or whole rows: one to four vectors), and for it: the sums over the channels (one vector load and add
per channel), the sums of squared deviations (the deviation recomputed, not stored), one reciprocal square
root per pixel, then the normalized, scaled and shifted output, channel plane by channel plane. The runs
go in parallel. Elementwise consumers are inlined into the output; anything else is left to :mod:`.generic`.

ConvNeXt's channels-first LayerNorms (stem and downsampling layers, spelt out in its export) were three
kernels of TVM's default path: mean, subtract; the square; mean, add, sqrt, divide, scale, shift.
"""

from __future__ import annotations

import dataclasses
import math

from tvm import s_tir

from ..common import block_names
from ..computes.layer_norm import CHANNEL_STAGES
from . import rows
from .generic import PARALLEL_MIN

SUM, DELTA, SQSUM, RSTD, NORM = CHANNEL_STAGES
ANCHOR = NORM  # the block its template's mark is on (the legalization puts it there)


@dataclasses.dataclass(frozen=True)
class Config:
    """A task's run of pixels: ``rows`` whole rows each (``factor`` rows) or part of one row (``factor``
    pixels). :func:`default_config` picks it; the template samples ``factor`` among :func:`runs` of the same
    kind."""

    rows: bool
    factor: object


def runs(height: int, width: int, vector_lanes: int) -> dict:
    """The runs a task can take, ``{"part": [pixels of one row], "rows": [rows]}``: 1, 2 or 4 whole vectors of
    a row dividing it (else one vector of 8 or 4 lanes that divides it), or whole rows dividing the map that
    make exactly 1, 2 or 4 vectors. Only power-of-two runs: LLVM builds a 56- or 7-lane vector an element at
    a time (``vinsertps``; 56 x 56 x 96 took 1.7x TVM's generic schedule that way)."""
    vectors = [vector_lanes * v for v in (1, 2, 4)]
    part = [r for r in vectors if width % r == 0] or [v for v in (8, 4) if v < vector_lanes and width % v == 0][:1]
    rows = [r for r in range(1, height + 1) if height % r == 0 and r * width in vectors]
    return {"part": part, "rows": rows}


def default_config(height: int, width: int, vector_lanes: int) -> Config | None:
    """The longest run (whole rows on a tie): fewer, longer tasks won at every size measured (Zen 4: 8 x 8 x
    128 in one task of 64 pixels 1.0 us, in four of 16 2.4 us; 16 x 16 x 64 in four tasks 6.3 us, in
    sixteen 8.8 us). None: no run is a vector (the rule then leaves the kernel to the generic schedule)."""
    options = runs(height, width, vector_lanes)
    pixels = [(f, False, f) for f in options["part"]] + [(r * width, True, r) for r in options["rows"]]
    if not pixels:
        return None
    _, rows, factor = max(pixels)
    return Config(rows, factor)


def _vectorize_statistic(sch: s_tir.Schedule, name: str, reduction: bool) -> None:
    """A statistic's loops under the task: its pixels fused innermost and vectorized, the channel reduction
    outside them (the reduction's initialization split off)."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)[1:]  # under the task: unit batch loop, pixel loops, [channel]
    if reduction:
        sch.reorder(loops[-1], *loops[:-1])
        loops = sch.get_loops(block)[2:]
    pixel = sch.fuse(*loops)
    sch.vectorize(pixel)  # a reduction while its block still has its init; the init then moves out
    if reduction:
        sch.decompose_reduction(block, sch.get_loops(block)[1])


def schedule(sch: s_tir.Schedule, vector_lanes: int, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False when the kernel is not this LayerNorm of an NCHW or NCL
    tensor (``sch`` may then be partly changed: the backend starts afresh). The deviation (``lnc_delta``)
    and other producers are inlined into their readers, consumers into the output. ``config``: the run of
    pixels per task (:func:`default_config` when None)."""
    names = block_names(sch)
    if not all(name in names for name in CHANNEL_STAGES) or names.count(NORM) != 1:
        return False
    if not rows.inline_neighbours(sch, NORM, (SUM, SQSUM, RSTD)):
        return False
    norm = sch.get_sblock(NORM)
    batch, channel, *pixels = sch.get_loops(norm)
    extents = [int(sch.get(loop).extent) for loop in sch.get_loops(norm)]
    if len(pixels) not in (1, 2):
        return False
    height, width = (extents[2], extents[3]) if len(pixels) == 2 else (1, extents[2])
    config = config or default_config(height, width, vector_lanes)
    if config is None:
        return False
    if config.rows:
        outer, inner_rows = sch.split(pixels[0], [None, config.factor])
        sch.reorder(batch, outer, channel, inner_rows, pixels[1])
        task, inner = sch.fuse(batch, outer), sch.fuse(inner_rows, pixels[1])
    else:
        outer, inner = sch.split(pixels[-1], [None, config.factor])
        sch.reorder(batch, *pixels[:-1], outer, channel, inner)
        task = sch.fuse(batch, *pixels[:-1], outer)
    for name in (RSTD, SQSUM, SUM):
        sch.compute_at(sch.get_sblock(name), task, preserve_unit_loops=True)
    if int(sch.get(task).extent) > 1 and math.prod(extents) >= PARALLEL_MIN:
        sch.parallel(task)  # before decompose_reduction, which leaves the task without compact dataflow
    for name, reduction in ((SUM, True), (SQSUM, True), (RSTD, False)):
        _vectorize_statistic(sch, name, reduction)
    sch.vectorize(inner)
    return True
