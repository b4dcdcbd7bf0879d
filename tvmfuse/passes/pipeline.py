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
        Kernel (PrimFunc) name -> (the partition's Relax function it was lowered from, its
        :class:`tvmfuse.schedules.computes.packing.KernelLayout`: packed weights, blocked activations).
    qdq : dict
        What ``FuseQDQ`` did with a quantized (QDQ) model: ``int8_kernels`` and ``kept_float`` (anchor, op,
        reason), see :func:`tvmfuse.passes.int8.qdq.FuseQDQ`.
    """

    partitioned: object = None
    rejections: dict = dataclasses.field(default_factory=dict)
    kernels: dict = dataclasses.field(default_factory=dict)
    qdq: dict = dataclasses.field(default_factory=dict)


def canonicalize_passes(spec: TargetSpec | None = None, qdq_report: dict | None = None, blocked: bool = True,
                        int8: bool = False) -> list:
    """Restore R.clip, map QDQ chains to INT8 kernels, fold constants, make a spelt-out tanh GELU and a spelt-out
    LayerNorm one op each, flatten N-D x constant matmuls to 2-D, pad dense weights whose column count has no
    vector-wide divisor (and, in FP32 graphs, a Softmax's rows over a dense's columns), turn transposed convs
    into stride-1 phase convs + depth-to-space, merge narrow conv groups, fold batch-norm and constant scales
    and shifts into convs, lay a conv over a one-pixel-wide map along the width: the shapes the patterns expect. ``spec``, ``qdq_report`` and ``blocked`` go to
    ``FuseQDQ`` (None: a CPU target, no report); ``int8``: the graph is calibrated or quantized."""
    from .canonicalize import CanonicalizeClip
    from .conv_transpose import TransposeConvToConv
    from .flatten_matmul import FlattenMatmul
    from .pad_dense import PadDenseColumns
    from .pad_softmax import PadSoftmaxRows
    from .fold_bn import FoldBatchNorm
    from .fold_constant import FoldConstant
    from .fold_layout import FoldConstantLayouts
    from .fold_scale import FoldScaleShift
    from .gelu import FuseGeluTanh
    from .layer_norm import FuseLayerNorm
    from .int8.qdq import FuseQDQ
    from .regroup_conv import RegroupConv
    from .tall_conv import TallConvToWide

    # CanonicalizeClip first: it folds the importer's Clip guards cheaply before FoldConstant sees them, and
    # leaves relu6 one relax.clip for FuseQDQ. FuseQDQ before FoldConstant, which would fold the
    # dequantize(int8 weight) of every QDQ chain into a float constant.
    # FlattenMatmul and TransposeConvToConv after FoldConstant: the weights they look for are constants by then.
    # RegroupConv leaves the narrow groups the blocked FP32 kernel runs as they are (x86; not in INT8 graphs).
    # TallConvToWide after the folds into convs, which match a conv followed directly by its batch norm.
    narrow_lanes = spec.backend().vector_lanes() if spec is not None and blocked and not int8 else None
    return [CanonicalizeClip, FuseQDQ(spec, qdq_report, blocked), FoldConstantLayouts, FoldConstant,
            FuseGeluTanh,
            FuseLayerNorm(spec is None or spec.backend().channel_layer_norm), FlattenMatmul,
            PadDenseColumns, *([] if int8 else [PadSoftmaxRows]), TransposeConvToConv, RegroupConv(narrow_lanes),
            FoldBatchNorm, FoldScaleShift, TallConvToWide, FoldConstant]


def run_graph_passes(mod, spec: TargetSpec, target, record: PassRecord | None = None, partition: bool = True,
                     quantize=None, blocked: bool = True, int8: bool = False, precision: str = "fp32",
                     make=None):
    """Canonicalize, partition and lower partitions to fused kernels, under the target context.

    ``quantize`` (optional): a function or module pass applied to the partitioned module before lowering,
    e.g. ``QuantizeGraph``; partitions it leaves are lowered to FP32 kernels. ``blocked``: see
    :func:`tvmfuse.passes.lower.LowerPartitions`. ``int8`` (implied by ``quantize``): partition with the
    INT8 pattern table (:func:`tvmfuse.patterns.table`), as calibration must to observe the same tensors.
    ``precision`` ``"fp16"``: the canonical graph computed in float16 (:class:`tvmfuse.passes.precision.ToFloat16`)
    before partitioning. ``make``: see :func:`tvmfuse.passes.lower.LowerPartitions`.
    """
    import tvm

    from .lower import LowerPartitions
    from .partition import Partition

    record = record if record is not None else PassRecord()
    with target, tvm.transform.PassContext(opt_level=3):
        int8 = int8 or quantize is not None
        passes = canonicalize_passes(spec, record.qdq, blocked, int8)
        mod = tvm.transform.Sequential(passes, name="tvmfuse.Canonicalize")(mod)
        if precision == "fp16":
            from .precision import ToFloat16

            mod = ToFloat16(mod)
        if not partition:
            return mod
        mod = Partition(record.rejections, int8, "float16" if precision == "fp16" else "float32")(mod)
        record.partitioned = mod
        if quantize is not None:
            mod = quantize(mod)
        return LowerPartitions(spec, record.kernels, blocked, make)(mod)


def scheduling_passes(spec: TargetSpec, database=None):
    """``applied -> passes``: the passes that schedule the kernels, records from ``database`` (a MetaSchedule
    database of tuning logs, optional; ``applied`` receives the kernel names it scheduled) then the backend's
    default schedules for the kernels left, then its passes over every scheduled kernel
    (:meth:`~tvmfuse.schedules.backend.Backend.kernel_passes`), then its fallback for kernels no rule took
    (:meth:`~tvmfuse.schedules.backend.Backend.fallback_passes`). They read and change PrimFuncs only."""
    from .schedule import ApplyTuningLogs, ScheduleKernels

    def make(applied: list | None) -> list:
        backend = spec.backend()
        return (([ApplyTuningLogs(database, applied)] if database is not None else []) + [ScheduleKernels(spec)]
                + backend.kernel_passes() + backend.fallback_passes())

    return make


def relax_pipeline(spec: TargetSpec, target, database=None, applied: list | None = None, reuse=None):
    """The Relax pipeline for ``tvm.compile``: the backend's (:meth:`~tvmfuse.schedules.backend.Backend.relax_pipeline`),
    with the passes of :func:`scheduling_passes` where the backend schedules kernels. ``reuse`` (optional):
    ``(make, applied) -> passes`` in their place, e.g. the same with scheduled kernels cached
    (:func:`tvmfuse.cache.schedules.cached`)."""
    from .kernel_names import StableKernelNames

    make = scheduling_passes(spec, database)
    scheduling = reuse(make, applied) if reuse is not None else make(applied)
    # TVM's numbered kernel names renamed before anything is keyed by them (scheduling, objects)
    return spec.backend().relax_pipeline(target, [StableKernelNames()] + scheduling)


def fused_module(mod, spec: TargetSpec, target):
    """``mod`` after the backend's legalize/fuse passes: the state tuning tasks are extracted from."""
    import tvm

    from .kernel_names import StableKernelNames

    with target, tvm.transform.PassContext(opt_level=3):  # the kernels named as compile names them
        return tvm.transform.Sequential(spec.backend().legalize_passes(target) + [StableKernelNames()])(mod)
