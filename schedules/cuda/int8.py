"""The INT8 kernels (``computes.int8``, ``computes.int8_depthwise``: uint8 codes in, int8 weights, int32 sums,
the requantize epilogue) on CUDA, bit-exact against ``int8_ref`` like x86's.

- conv2d and dense: the implicit GEMM of :mod:`.conv2d` on the tensor cores (:mod:`.tensor_core`, s8 x s8
  into int32). Tensor cores multiply int8 by int8 only where the operands are the same type (wmma's s8 and u8
  fragments do not mix), so the backend asks these computes for ``signed_data`` (the input summed as
  ``x - 128``, the bias folded with ``za - 128``: the same integers). A one-pixel conv (squeeze-excite) and a
  dense of a few rows are a warp-per-output GEMV in int32 (:func:`.gemv.schedule_rows`).
- depthwise conv2d: :mod:`.depthwise_conv2d`'s shared-memory tile and register strips, summing uint8 x int8
  products in int32 on the CUDA cores. Not ``dp4a``: a depthwise output sums its channel's kh x kw taps
  only, so a 4-way dot product needs 4 taps of one channel in one aligned word (neighbouring pixels of a
  row, misaligned by every other output and by any stride), and the kernel is bound by its loads (9
  multiply-adds per input byte for 3x3), not by the multiplies ``dp4a`` would fold.

The epilogue (requantize, clip, residual, hardswish, and a table of output codes after it) is inlined into
the store, as in the FP32 rules.
"""

from __future__ import annotations

from tvm import s_tir

from .. import families
from ..common import block_names
from ..computes.int8_epilogue import TABLE_STAGE
from . import conv2d, depthwise_conv2d, gemv
from .dense import GEMM_ROWS

CONV, DENSE = families.CONV2D.int8.anchor_block, families.DENSE.int8.anchor_block
DEPTHWISE, DEPTHWISE_PAD = families.DEPTHWISE_CONV2D.int8.anchor_block, families.DEPTHWISE_CONV2D.int8.pad_block


def _gemv(sch: s_tir.Schedule, anchor: str) -> bool:
    """Whether the kernel of ``anchor`` is a GEMV: a conv whose output is one pixel, a dense of fewer than
    ``GEMM_ROWS`` rows."""
    block = sch.get(sch.get_sblock(anchor))
    if anchor == CONV:
        return conv2d.one_pixel(block)
    return int(block.iter_vars[0].dom.extent) < GEMM_ROWS


def _table_last(sch: s_tir.Schedule) -> None:
    """A table of output codes joins the epilogue: its lookup is inlined into the requantize stage, which then
    writes the table's code, so the rules place it as they place any epilogue (``common.inline_epilogue``
    leaves a table stage apart for x86's vector lookups)."""
    if TABLE_STAGE in block_names(sch):
        sch.reverse_compute_inline(sch.get_sblock(TABLE_STAGE))


def schedule(sch: s_tir.Schedule, sms: int, config=None) -> bool:
    """Schedule an INT8 partition kernel in place; False (``sch`` untouched) when it is not one.
    ``config``: a GEMM's tensor-core tile (:mod:`.tensor_core`) or a depthwise tile (:mod:`.depthwise_conv2d`)."""
    names = block_names(sch)
    if DEPTHWISE in names:
        if DEPTHWISE_PAD not in names:
            return False
        _table_last(sch)
        return depthwise_conv2d.schedule(sch, sms, config, DEPTHWISE, DEPTHWISE_PAD)
    anchor = next((a for a in (CONV, DENSE) if a in names), None)
    if anchor is None:
        return False
    _table_last(sch)
    if _gemv(sch, anchor):
        return gemv.schedule_rows(sch, anchor)
    return conv2d.schedule_gemm(sch, anchor, sms, config)


def kernel_candidates(func, sms: int) -> list:
    """The configs an offline tuning round times: a GEMM's tensor-core tiles, a depthwise kernel's tiles; none
    for a GEMV."""
    sch = s_tir.Schedule(func)
    names = block_names(sch)
    if DEPTHWISE in names:
        return depthwise_conv2d.kernel_candidates(func, sms, DEPTHWISE, DEPTHWISE_PAD)
    anchor = next((a for a in (CONV, DENSE) if a in names), None)
    if anchor is None or _gemv(sch, anchor):
        return []
    return conv2d.gemm_candidates(func, sms, anchor)
