"""A simple, correct default schedule for a fused partition on x86.

The epilogue (bias, residual add, activation) is inlined into one stage that runs right after each output
channel's accumulation, while that channel is still in cache; the channel loop is parallel. Per-family
schedules with blocking and vectorization replace this where they apply.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..common import block_names, inline_epilogue
from .. import families


def schedule_fused(func: tirx.PrimFunc, family: str) -> tirx.PrimFunc | None:
    """Return the scheduled function, or None when its structure is not the expected one."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, family) else None


def schedule(sch: s_tir.Schedule, family: str) -> bool:
    """Apply the schedule to ``sch`` in place; False (``sch`` untouched) when the kernel of ``family`` does
    not have the expected structure."""
    entry = families.FAMILIES.get(family)  # an NCHW kernel is named after its family
    anchor_name = entry.anchor_block if entry else None
    names = block_names(sch)
    if anchor_name not in names:
        return False  # not our structure: leave the func to the default path
    anchor = sch.get_sblock(anchor_name)
    # Every epilogue stage but the last inlined into its consumer: one pass over the output.
    last = inline_epilogue(sch, anchor_name)
    loops = sch.get_loops(anchor)
    if last is not None:
        sch.reverse_compute_at(last, loops[1])
    if entry is families.DENSE:
        sch.parallel(loops[1])
        return True
    if entry is families.DEPTHWISE_CONV2D:
        # Depthwise reads only its own channel: pad that channel right before use.
        for name in names[:names.index(anchor_name)]:
            if name.startswith("PaddedInput"):
                sch.compute_at(sch.get_sblock(name), loops[1])
    sch.parallel(sch.fuse(loops[0], loops[1]))
    return True
