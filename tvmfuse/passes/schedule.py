"""Scheduling after fusion: tuned schedules from tuning logs first, then tvmfuse's default schedules.

Both passes run on the module after TVM's legalize/fuse passes, the state MetaSchedule extracts tuning
tasks from, so a kernel's workload here is the one that was tuned.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from ..schedules.backend import SCHEDULED_BY, is_scheduled
from ..targets import TargetSpec


def _prim_funcs(mod: tvm.IRModule) -> dict:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def ApplyTuningLogs(database, applied: list | None = None) -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Replace every kernel that has a record in ``database`` (a MetaSchedule database, or
    :class:`tvmfuse.tune.lazy_logs.LazyLogs`) by its best tuned schedule.

    ``applied`` (optional list) receives the names of the kernels that were replaced. Needs the target in
    the context (``with target:``).
    """
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="ApplyTuningLogs")
    def _apply(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        before = _prim_funcs(mod)
        db = database
        if hasattr(db, "database_for"):  # LazyLogs: decode the records of these kernels only
            from ..tune.records import kernel_hash

            db = db.database_for({kernel_hash(f) for f in before.values() if not is_scheduled(f)})
        with db:
            mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
        tuned = sorted(n for n, f in _prim_funcs(mod).items() if is_scheduled(f) and not is_scheduled(before.get(n, f)))
        if tuned:
            mod = mod.clone()
            for name in tuned:
                mod.update_func(mod.get_global_var(name), mod[name].with_attr(SCHEDULED_BY, "tuning_log"))
        if applied is not None:
            applied.extend(tuned)
        return mod

    return _apply


def ScheduleKernels(spec: TargetSpec) -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """Give every kernel that tuning logs did not schedule the default schedule of ``spec``'s backend
    (:meth:`tvmfuse.schedules.backend.Backend.schedule`): tvmfuse's kernels their family's rule, the
    kernels of TVM's default path the backend's generic one. Each scheduled kernel records it in its
    ``tvmfuse.scheduled_by`` attribute (the backend's rule name where it gives one, else ``tvmfuse.<backend>``)."""

    @tvm.transform.module_pass(opt_level=0, name="ScheduleKernels")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        backend = spec.backend()
        updates = {}
        for gv, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc) and not is_scheduled(func):
                scheduled = backend.schedule(func)
                if not scheduled.same_as(func):
                    if SCHEDULED_BY not in scheduled.attrs:
                        scheduled = scheduled.with_attr(SCHEDULED_BY, f"tvmfuse.{backend.name}")
                    updates[gv] = scheduled
        if updates:
            mod = mod.clone()
            for gv, func in updates.items():
                mod.update_func(gv, func)
        return mod

    return _schedule
