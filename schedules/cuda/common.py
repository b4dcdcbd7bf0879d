"""What the CUDA rules share: the target's limits, block lookups, epilogue placement, cooperative copies."""

from __future__ import annotations

from tvm import s_tir

from ..common import block_names, loops_below

WARP = 32
# Every rule stays within these, whatever the target says: the limits of every NVIDIA GPU since sm_30
# (48 KiB of static shared memory per block, 1,024 threads per block).
MAX_THREADS = 1024
MAX_SHARED_BYTES = 48 * 1024
# Streaming multiprocessors by compute capability, for grid-size choices (data-centre parts: A100, H100).
SM_COUNT = {"sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132, "sm_90a": 132}


def sm_count(arch: str) -> int:
    return SM_COUNT.get(arch, 80)


def producers_of(sch: s_tir.Schedule, anchor: str) -> list[str]:
    names = block_names(sch)
    return names[:names.index(anchor)]


def inline_producers(sch: s_tir.Schedule, anchor: str, keep: tuple = ()) -> None:
    """Inline every stage before ``anchor`` (weight reshapes, padding) except those named in ``keep``."""
    for name in producers_of(sch, anchor):
        if not name.startswith(keep) or not keep:
            sch.compute_inline(sch.get_sblock(name))


def cooperative_copy(sch: s_tir.Schedule, block, at, threads: int) -> None:
    """Spread a shared-memory fill (``block``, placed under loop ``at``) over the ``threads`` threads of the
    block: its loops below ``at`` fused, split by the thread count, bound to ``threadIdx.x``."""
    fused = sch.fuse(*loops_below(sch, block, at))
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def launch_shape(func) -> dict:
    """``{"blockIdx.x": n, "threadIdx.x": m, ...}`` of a scheduled kernel (for tests and reports)."""
    from tvm import tirx

    found = {}

    def visit(node):
        if isinstance(node, tirx.For) and node.thread_binding is not None:
            found[str(node.thread_binding.thread_tag)] = int(node.extent)

    tirx.stmt_functor.post_order_visit(func.body, visit)
    return found
