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
    :class:`tvmfuse.tune.lazy_logs.LazyLogs`) by its best tuned schedule: an exact record first, else one filed
    under the kernel's shared form (:mod:`tvmfuse.tune.shared_form`; LazyLogs look only where its target's
    backend files records that way, ``shared``).

    ``applied`` (optional list) receives the names of the kernels that were replaced. Needs the target in
    the context (``with target:``).
    """
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="ApplyTuningLogs")
    def _apply(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        from ..tune.records import kernel_hash
        from ..tune.shared_form import shared_form

        before = _prim_funcs(mod)
        todo = {n: f for n, f in before.items() if not is_scheduled(f)}
        shared = {n: shared_form(f) for n, f in todo.items()} if getattr(database, "shared", True) else {}
        db = database
        if hasattr(db, "database_for"):  # LazyLogs: decode the records of these kernels only
            db = db.database_for({kernel_hash(f) for f in todo.values()} | {kernel_hash(f) for f in shared.values()})
        with db:
            mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
        after = _prim_funcs(mod)
        updates = {n: _from_shared_record(db, f, shared[n]) for n, f in after.items()
                   if n in shared and not is_scheduled(f)}
        updates = {n: f for n, f in updates.items() if f is not None}
        tuned = sorted({n for n, f in after.items() if is_scheduled(f) and not is_scheduled(before.get(n, f))}
                       | set(updates))
        if tuned:
            mod = mod.clone()
            for name in tuned:
                func = updates.get(name, mod[name])
                mod.update_func(mod.get_global_var(name), func.with_attr(SCHEDULED_BY, "tuning_log"))
        if applied is not None:
            applied.extend(tuned)
        return mod

    return _apply


def _from_shared_record(db, func, shared):
    """``func`` scheduled by the record filed under its shared form (:mod:`tvmfuse.tune.shared_form`: the same
    kernel with other constants, e.g. another calibration table's), as MetaScheduleApplyDatabase applies an exact
    one; None without such a record."""
    import tvm_ffi
    from tvm import s_tir
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    if tvm_ffi.structural_equal(func, shared):
        return None  # no constants to share over: the exact lookup was this one
    # the module kernel_hash files the shared form under, so the lookup meets the workload the record was filed with
    workload = tvm.IRModule({"main": shared.with_attr("global_symbol", "main")})
    record = db.query_tuning_record(workload, tvm.target.Target.current(), "main")
    if record is None:
        return None
    sch = s_tir.Schedule(_normalize_mod(func))
    try:
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except Exception:  # noqa: BLE001 - a record that does not replay here leaves the kernel to its default rule
        return None
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


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
