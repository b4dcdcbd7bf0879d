"""x86 schedules (LLVM targets): one rule per op family, tried in order; the first that applies wins.

``schedule(func, family, vector_bits)`` returns the scheduled PrimFunc. The generic fused schedule is the
catch-all for families without a rule of their own (grouped convolution); ``generic`` schedules the kernels
of TVM's default path (ops outside partitions).
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..common import block_names, lanes
from . import conv2d, conv2d_nchwc, conv2d_winograd, dense, depthwise_conv2d, depthwise_nchwc, fused, layout, pool

RULES = {
    "conv2d": conv2d.apply,
    "depthwise_conv2d": depthwise_conv2d.apply,
    "dense": dense.apply,
    "conv2d_nchwc": conv2d_nchwc.apply,
    "conv2d_winograd": conv2d_winograd.apply,
    "depthwise_conv2d_nchwc": depthwise_nchwc.apply,
    "layout_transform": layout.apply,
    "pool2d_nchwc": pool.apply,
}


def weight_block(fn, vector_bits: int) -> int | None:
    """oc_block to pre-pack a partition's conv2d weight with (None: keep OIHW)."""
    from ..compute import anchor_call

    call = anchor_call(fn)
    if call is None or getattr(call.op, "name", "") != "relax.nn.conv2d" or int(call.attrs.groups) != 1:
        return None
    out_channels, out_width = int(call.ty.shape[1]), int(call.ty.shape[3])
    weight = [int(d) for d in call.args[1].ty.shape]
    in_channels, kernel = weight[1], max(weight[2:])
    return conv2d.weight_block(out_channels, out_width, lanes(vector_bits), in_channels, kernel)


def strip_rule(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` without the blocks' ``schedule_rule`` marks (they only mean something to MetaSchedule)."""
    sch = s_tir.Schedule(func)
    marked = False
    for name in block_names(sch):
        block = sch.get_sblock(name)
        if "schedule_rule" in sch.get(block).annotations:
            sch.unannotate(block, "schedule_rule")
            marked = True
    return sch.mod["main"] if marked else func


def schedule(func: tirx.PrimFunc, family: str, vector_bits: int) -> tirx.PrimFunc:
    """The best schedule tvmfuse has for a fused partition of ``family`` (unscheduled when none fits).

    A kernel marked for a MetaSchedule template (``schedule_rule``) gets the template's default: the mark
    is dropped first, so the result is the same as for an unmarked kernel.
    """
    func = strip_rule(func)
    rule = RULES.get(family)
    if rule is not None:
        scheduled = rule(func, lanes(vector_bits))
        if scheduled is not None:
            return scheduled
    scheduled = fused.schedule_fused(func, family)
    return scheduled if scheduled is not None else func
