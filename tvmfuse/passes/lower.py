"""LowerPartitions: replace each partition call by one ``call_tir`` to a fused TE kernel.

The kernel is interpreted from the partition body (``tvmfuse.schedules.compute``), carries what schedules
and reports need (``tvmfuse.partition``, ``tvmfuse.family``, ``tvmfuse.layout``, ``tvmfuse.ops``), is marked
opaque so TVM's FuseOps leaves it whole. Scheduling comes later (``passes.schedule``), after tuning logs.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmfuse.schedules.compute import pack_weight, partition_compute

from ..targets import TargetSpec
from .partition import is_partition
from .utils import const_array

# AnnotateTIROpPattern leaves a func with op_pattern set alone; kOpaque keeps FuseOps from merging
# neighbours into the kernel (the epilogue is already inside).
OPAQUE = 8


def kernel_name(partition: str) -> str:
    return partition.replace(".", "_")


def make_kernel(fn: relax.Function, spec: TargetSpec | None, schedule: bool = True) -> tuple[tvm.tirx.PrimFunc, dict]:
    """The fused PrimFunc for one partition function.

    On CPU targets the anchor block is marked for its MetaSchedule template (the mark is part of the
    kernel's identity in tuning logs). With ``schedule`` the kernel also gets the target's default schedule;
    LowerPartitions passes False and leaves scheduling to ``ScheduleKernels``, after tuning logs are applied.

    Returns the kernel and ``{parameter index: oc_block}`` for weights it reads pre-packed.
    """
    oc_block, lanes = None, None
    if spec is not None and spec.is_cpu:
        from tvmfuse.schedules import x86

        oc_block = x86.weight_block(fn, spec.vector_bits())
        lanes = spec.vector_bits() // 32
    pc = partition_compute(fn, oc_block, lanes)
    func = pc.prim_func()
    if spec is not None and spec.is_cpu:
        from tvmfuse.schedules.x86 import templates

        func = templates.annotate(func, pc.family) or func
        if schedule:
            func = x86.schedule(func, pc.family, spec.vector_bits())
    name = str(fn.attrs["Composite"])
    layout = "NCHW" if pc.family != "dense" else "NC"
    if pc.packed:
        layout += f", weight OIHW{next(iter(pc.packed.values()))}o"
    return func.with_attrs({"tvmfuse.partition": name, "tvmfuse.family": pc.family, "tvmfuse.layout": layout,
                            "tvmfuse.ops": ",".join(pc.ops), "op_pattern": OPAQUE}), pc.packed


def _pack_args(args: list, packed: dict) -> list:
    """Call arguments with the weights the kernel reads packed, packed in numpy at compile time.

    Every anchor pattern requires a constant weight and the partition keeps it a call argument
    (``bind_constants=False``), so the weight is always a constant here.
    """
    args = list(args)
    for index, oc_block in packed.items():
        args[index] = relax.const(pack_weight(const_array(args[index]), oc_block))
    return args


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, spec: TargetSpec | None, record: dict | None):
        super().__init__(mod)
        self.mod_, self.spec, self.record = mod, spec, record

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.GlobalVar):
            return call
        fn = self.mod_[call.op]
        if not is_partition(fn):
            return call
        kernel, packed = make_kernel(fn, self.spec, schedule=False)
        args = _pack_args(call.args, packed)
        gv = self.builder_.add_func(kernel, kernel_name(str(fn.attrs["Composite"])))
        if self.record is not None:
            self.record[gv.name_hint] = (fn, packed)
        return relax.call_tir(gv, args, fn.ret_ty)


def LowerPartitions(spec: TargetSpec | None = None, record: dict | None = None) -> tvm.transform.Pass:  # noqa: N802
    """Lower every partition call to ``call_tir``; the partition functions are then dropped.

    ``record`` (optional dict) receives kernel name -> (the partition function it came from,
    {parameter index: oc_block} of the weights passed pre-packed).
    """

    @tvm.transform.module_pass(opt_level=0, name="LowerPartitions")
    def _lower(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        lower = _Lower(mod, spec, record)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and not is_partition(func):
                lower.builder_.update_func(gv, lower.visit_expr(func))
        return relax.transform.DeadCodeElimination()(lower.builder_.get())

    return _lower
