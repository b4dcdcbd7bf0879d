"""Scheduled kernels reused: the result of the scheduling passes (tuning logs, then the default rules) per kernel.

Scheduling is the part of a compile that runs once per kernel in Python (a rule's loop splits, or a tuning
record's trace decoded and replayed, then the backend's passes over the scheduled kernel): 3-8 ms a kernel,
0.15-0.25 s of a model whose kernels all come from the object cache. A kernel's scheduled form is stored as
TVM's JSON under a key of what decides it: the kernel as lowered (its TIR, name included), the target and
pass context, the versions (tvmfuse's source digest among them), and the tuning records filed under the
kernel's workload hash, so that a new or better record misses. The stored form is the kernel after the
backend's kernel passes too (``Backend.kernel_passes``: the steps of padded convs that read only padding
skipped, 0.1 s of a detector); the passes run on the other kernels alone.
"""

from __future__ import annotations

from .kernels import derived_key, kernel_key, pass_options
from .store import Store

FORMAT = "scheduled-kernel-1"


def schedule_key(func, target, context: str, records: str) -> str:
    """The key of ``func`` scheduled for ``target`` under pass options ``context`` with tuning ``records`` (its
    blocks' names keyed with their value numbers only where a record could find blocks by them)."""
    return kernel_key(func, target, context, records, fmt=FORMAT, block_numbers=not records)


def cached(scheduling, store: Store | None, database, applied: list | None, known: dict | None = None) -> list:
    """The passes ``scheduling(applied)`` makes (:func:`tvmfuse.passes.pipeline.scheduling_passes`) as one pass
    that reuses and fills ``store``; those passes as they are where nothing can be keyed: no store, or a
    tuning database that is not the lazily decoded logs (its records are not known line by line).
    ``applied`` gets the names of the kernels a tuning record scheduled, cached or not, sorted. ``known``: lowered
    kernel -> its key (:class:`.lowered.LoweredKernels`), which keys its schedule without serializing it; every
    scheduled kernel's key is added to it, for its object's key."""
    import tvm
    from tvm import tirx
    from tvm_ffi.serialization import from_json_graph_str  # tvm.ir.load_json first "upgrades" the JSON in Python:
    # 6 ms a kernel, more than scheduling it; these entries were written by this TVM (the versions are keyed)

    from ..schedules.backend import SCHEDULED_BY, is_scheduled

    records_for = getattr(database, "records_for", None) if database is not None else (lambda _func: "")
    if store is None or records_for is None:
        return scheduling(applied)

    @tvm.transform.module_pass(opt_level=0, name="tvmfuse.CachedScheduling")
    def _pass(mod, _ctx):
        target, context = tvm.target.Target.current(), pass_options()
        kernels = {gv: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}  # in its order
        keys = {}
        for gv, f in kernels.items():
            if not is_scheduled(f):
                records = records_for(f)
                keys[gv] = (derived_key(known, f, str(target), context, records, fmt=FORMAT)
                            or schedule_key(f, target, context, records))
        found, from_log = {}, []
        for gv, key in keys.items():
            data = store.get(key)
            if data is not None:
                found[gv] = from_json_graph_str(data.decode())
                if str(found[gv].attrs.get(SCHEDULED_BY, "")) == "tuning_log":
                    from_log.append(gv.name_hint)
        # the passes read and change PrimFuncs only: they run on the kernels not found, alone
        inner: list = []
        rest = tvm.transform.Sequential(scheduling(inner))(
            tvm.IRModule({gv: f for gv, f in kernels.items() if gv not in found}))
        out = mod.clone()
        # in the module's order, found or not: CUDA's function table lists the kernels in the order they were
        # put back, so a build from the cache is byte for byte the build without it
        for gv in kernels:
            func = found.get(gv) or rest[gv.name_hint]
            out.update_func(gv, func)
            if gv not in found and gv in keys and not func.same_as(kernels[gv]):  # scheduled here: stored
                store.put(keys[gv], tvm.ir.save_json(func).encode())
        if applied is not None:
            applied.extend(sorted(inner + from_log))
        if keys:
            store.log_run("schedules", len(found), len(keys) - len(found))
        if known is not None:
            for gv, key in keys.items():
                known[out[gv.name_hint]] = key
        return out

    return [_pass]
