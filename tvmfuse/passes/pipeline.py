"""Per-target pass lists: the graph passes tvmfuse runs, and the Relax pipeline handed to tvm.compile."""

from __future__ import annotations

import dataclasses

from ..targets import TargetSpec


@dataclasses.dataclass
class PassRecord:
    """What the graph passes found, for reports and op-check.

    Attributes
    ----------
    partitioned : tvm.IRModule or None
        The module right after partitioning (partition functions still in Relax).
    rejections : dict
        Anchor var name -> why a candidate group was refused.
    kernels : dict
        Kernel (PrimFunc) name -> (the partition's Relax function it was lowered from,
        {parameter index: oc_block} of weights the kernel takes pre-packed).
    """

    partitioned: object = None
    rejections: dict = dataclasses.field(default_factory=dict)
    kernels: dict = dataclasses.field(default_factory=dict)


def canonicalize_passes() -> list:
    """Fold constants, restore R.clip, fold batch-norm into convs: the shapes the patterns expect."""
    from tvm import relax

    from .canonicalize import CanonicalizeClip
    from .fold_bn import FoldBatchNorm

    # CanonicalizeClip first: it folds the importer's Clip guards cheaply before FoldConstant sees them.
    return [CanonicalizeClip, relax.transform.FoldConstant(), FoldBatchNorm, relax.transform.FoldConstant()]


def run_graph_passes(mod, spec: TargetSpec, target, record: PassRecord | None = None, partition: bool = True):
    """Canonicalize, partition and lower partitions to fused kernels, under the target context."""
    import tvm

    from .lower import LowerPartitions
    from .partition import Partition

    record = record if record is not None else PassRecord()
    with target, tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(canonicalize_passes(), name="tvmfuse.Canonicalize")(mod)
        if not partition:
            return mod
        mod = Partition(record.rejections)(mod)
        record.partitioned = mod
        return LowerPartitions(spec, record.kernels)(mod)


def relax_pipeline(spec: TargetSpec, target):
    """The Relax pipeline for ``tvm.compile``.

    On CPU TVM's ``"default"`` pipeline only legalizes (no fusion); the generic CPU pipeline fuses
    elementwise ops into their producers, so it is used instead. CUDA's default pipeline adds dlight
    schedules. Either way the result is a module pass that lowers to VM code plus PrimFuncs.
    """
    from tvm import relax

    return relax.get_default_pipeline(target)
