"""The CUDA fallback for a partition kernel no rule of its family fits (a group no tile divides, a shape a rule refuses): one thread per output element, its reduction serial in a register, padding read through a
bounds check, the epilogue applied before the single store. Correct for every family; the family rules
are the fast paths."""

from __future__ import annotations

from tvm import s_tir

from ..common import block_names, inline_epilogue, inline_producers
from .. import families

THREADS = 256


def schedule(sch: s_tir.Schedule, family: str) -> bool:
    """Schedule the partition kernel of ``family`` in place; False (``sch`` untouched) when its anchor block
    is missing."""
    entry = families.FAMILIES.get(family.replace("_nchwc", ""))  # the family a (blocked) kernel is named after
    anchor_name = entry.anchor_block if entry else None
    names = block_names(sch)
    if anchor_name not in names:
        return False
    inline_producers(sch, anchor_name)
    anchor = sch.get_sblock(anchor_name)
    out = inline_epilogue(sch, anchor_name)
    if out is None:
        out = sch.cache_write(anchor, 0, "local")
    else:
        sch.set_scope(anchor, 0, "local")
    bx, tx = sch.split(sch.fuse(*sch.get_loops(out)), [None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(anchor, tx)
    return True
