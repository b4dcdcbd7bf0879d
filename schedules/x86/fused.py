"""A simple, correct default schedule for a fused partition on x86.

The epilogue (bias, residual add, activation) is inlined into one stage that runs right after each output
channel's accumulation, while that channel is still in cache; the channel loop is parallel. Per-family
schedules with blocking and vectorization replace this where they apply.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..compute import ANCHOR_BLOCK


def _blocks(sch: s_tir.Schedule):
    root = sch.get_sblock("root") if _has_root(sch) else None
    return sch.get_child_blocks(root) if root is not None else []


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:  # noqa: BLE001 - a func without a root block has nothing to schedule here
        return False


def schedule_fused(func: tirx.PrimFunc, family: str) -> tirx.PrimFunc | None:
    """Return the scheduled function, or None when its structure is not the expected one."""
    sch = s_tir.Schedule(func)
    anchor_name = ANCHOR_BLOCK.get(family)
    try:
        anchor = sch.get_sblock(anchor_name)
    except Exception:  # noqa: BLE001 - not our structure: leave the func to the default path
        return None
    blocks = _blocks(sch)
    names = [sch.get(b).name_hint for b in blocks]
    after = names[names.index(anchor_name) + 1:]
    # Inline every epilogue stage but the last into its consumer: one pass over the output.
    for name in after[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    loops = sch.get_loops(anchor)
    if family == "dense":
        sch.parallel(loops[1])
        if after:
            sch.reverse_compute_at(sch.get_sblock(after[-1]), loops[1])
        return sch.mod["main"]
    if after:
        sch.reverse_compute_at(sch.get_sblock(after[-1]), loops[1])
    if family == "depthwise_conv2d":
        # Depthwise reads only its own channel: pad that channel right before use.
        for name in names[:names.index(anchor_name)]:
            if name.startswith("PaddedInput"):
                sch.compute_at(sch.get_sblock(name), loops[1])
    sch.parallel(sch.fuse(loops[0], loops[1]))
    return sch.mod["main"]
