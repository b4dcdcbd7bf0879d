"""Scheduling after fusion: tuned schedules from tuning logs first, then tvmfuse's default schedules.

Both passes run on the module after TVM's legalize/fuse passes, the state MetaSchedule extracts tuning
tasks from, so a kernel's workload here is the one that was tuned.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..targets import TargetSpec


def _prim_funcs(mod: tvm.IRModule) -> dict:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def _is_scheduled(func) -> bool:
    return bool(func.attrs) and bool(func.attrs.get("tirx.is_scheduled", False))


def ApplyTuningLogs(database, applied: list | None = None) -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Replace every kernel that has a record in ``database`` by its best tuned schedule.

    ``applied`` (optional list) receives the names of the kernels that were replaced. Needs the target in
    the context (``with target:``).
    """
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="ApplyTuningLogs")
    def _apply(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        before = _prim_funcs(mod)
        with database:
            mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
        if applied is not None:
            after = _prim_funcs(mod)
            applied.extend(sorted(n for n, f in after.items()
                                  if _is_scheduled(f) and not _is_scheduled(before.get(n, f))))
        return mod

    return _apply


INT8_FAMILIES = ("int8_conv2d", "int8_depthwise_conv2d", "int8_dense")  # QuantizeGraph's kernels


def _schedule_int8(func, family: str, vector_bits: int, has_vnni: bool):
    """An INT8 kernel's x86 schedule (VNNI where the target has it); unscheduled when the rule does not fit."""
    from tvmfuse.schedules.x86 import int8_conv2d, int8_dense, int8_depthwise

    rule = {"int8_conv2d": int8_conv2d, "int8_depthwise_conv2d": int8_depthwise, "int8_dense": int8_dense}[family]
    scheduled = rule.apply(func, vector_bits, has_vnni)
    return scheduled if scheduled is not None else func


def ScheduleKernels(spec: TargetSpec) -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Give every kernel that tuning logs did not schedule its default schedule for ``spec``: tvmfuse's
    kernels their family's rule, the kernels of TVM's default path the generic one (``x86.generic``)."""

    @tvm.transform.module_pass(opt_level=0, name="ScheduleKernels")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not spec.is_cpu:
            return mod
        from tvmfuse.schedules import x86
        from tvmfuse.schedules.x86 import generic

        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
                continue
            family = func.attrs.get("tvmfuse.family") if func.attrs else None
            if family is not None and str(family) in INT8_FAMILIES:
                updates[gv] = _schedule_int8(func, str(family), spec.vector_bits(), "avx512vnni" in spec.features())
            elif family is not None:
                updates[gv] = x86.schedule(func, str(family), spec.vector_bits())
            else:  # a kernel of TVM's default path (an op outside every partition)
                updates[gv] = generic.apply(func, spec.vector_bits() // 32) or func
        if updates:
            mod = mod.clone()
            for gv, func in updates.items():
                mod.update_func(gv, func)
        return mod

    return _schedule
