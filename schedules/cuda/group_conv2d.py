"""Grouped conv2d (ResNeXt, RegNet, grouped transposed convs) as a batched implicit GEMM: the compute gives
the groups an axis of their own (``computes.anchors.group_conv2d`` without vector lanes), so each group is
``C[g, I, J] += A[g, I, K] * B[g, J, K]`` (I the output pixels, J the group's output channels, K its input
channels x window) and the tiles of :mod:`.conv2d` (fp32, CUDA cores) or :mod:`.tensor_core` (fp16) apply
per group, the group folded into the grid. Only tiles that divide J do (:func:`.conv2d.schedule_gemm`: a padded
column's store would land in the next group's channels); a group narrower than every tile (ResNeXt's first
stages: 4 and 8 channels) keeps the thread-per-output fallback."""

from __future__ import annotations

from tvm import s_tir

from .. import families
from . import conv2d

ANCHOR = families.GROUP_CONV2D.anchor_block


def kernel_candidates(func, sms: int) -> list:
    """The tiles an offline tuning round times (:func:`.conv2d.gemm_candidates`)."""
    return conv2d.gemm_candidates(func, sms, ANCHOR)


def schedule(sch: s_tir.Schedule, sms: int, config=None) -> bool:
    """Schedule a grouped conv2d partition kernel in place; False (``sch`` untouched) when its anchor is not
    the batched form (the CPU's compute, or a shape it does not fit)."""
    return conv2d.schedule_gemm(sch, ANCHOR, sms, config)
