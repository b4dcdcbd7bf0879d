"""Batched MatMul (attention's products) on CUDA: dlight's ``Matmul`` rule, the schedule TVM's default path
gave these products before they became a partition (shared-memory tiles, each thread a register tile). The
kernel is ``schedules.batch_matmul``'s; dlight inlines its transpose and pack stages into the tile loads."""

from __future__ import annotations

import tvm
from tvm import s_tir


def schedule(sch: s_tir.Schedule, sms: int) -> bool:
    """Replay dlight's Matmul schedule of ``sch``'s function onto ``sch``; False when the rule does not apply."""
    del sms
    from tvm.s_tir import dlight as dl

    target = tvm.target.Target.current(allow_none=True) or tvm.target.Target({"kind": "cuda"})
    planned = dl.gpu.Matmul().apply(sch.mod["main"], target, False)
    if not isinstance(planned, s_tir.Schedule):
        return False
    planned.trace.apply_to_schedule(sch, remove_postproc=False)
    return True
