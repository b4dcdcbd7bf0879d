"""Kernels through TVM's TIR pipeline reused one by one, for targets built as one module (CUDA).

``tvm.tirx.build`` runs its pipeline (loop lowering, simplification, common subexpressions, the host/device
split, the packed API) over the whole module: 2.6 s of YOLOv8n's CUDA build on 2 cores, half of what a compile
whose device code all comes from the cache still costs. Those passes work on each PrimFunc alone (the split
names a kernel's device functions after it), so this pipeline, registered under the name of the one it wraps
(:func:`pipeline`), stores what they made of each kernel (its host function and device functions, as TVM's
JSON) under a key of the kernel, the target, the pass options and the base pipeline's name, and runs the base
pipeline only on the kernels not found, together. TVM's ``AnnotateEntryFunc`` marks the only function of a
module as its entry, so a lone kernel runs beside another of the module's, and a module of one kernel is not
cached. The kernels' results are put back in the order TVM's pipeline gives (every device function, then every
host function, each in the module's order); a test compares the library with TVM's own build byte for byte.
Where a result cannot be told apart by kernel (a function named after none of them), the base pipeline runs on
the whole module. The finalization passes run on the whole module as before (0.5 s of YOLOv8n's).
"""

from __future__ import annotations

import contextlib
import threading

from .kernels import derived_key, kernel_key, pass_options, _scheduled_forms

FORMAT = "lowered-tir-1"
_STATE = threading.local()  # .store and .known of the build under way on this thread


def pipeline(base: str) -> str:
    """The name of ``base`` (a TIR pipeline's name) with its results cached per kernel while :func:`storing`;
    registered with TVM once per process."""
    from tvm.tirx import compilation_pipeline

    name = f"tvmfuse_cached_{base}"
    if name not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline(name, lambda: _wrapped(base))
    return name


@contextlib.contextmanager
def storing(store, known: dict | None):
    """Builds on this thread through :func:`pipeline`'s pipelines reuse and fill ``store`` (None: they run the
    base pipeline). ``known``: kernel -> its schedule key, which the keys chain from."""
    saved = getattr(_STATE, "store", None), getattr(_STATE, "known", None)
    _STATE.store, _STATE.known = store, known
    try:
        yield
    finally:
        _STATE.store, _STATE.known = saved


def _wrapped(base: str):
    import tvm
    from tvm.tirx import compilation_pipeline

    inner, finalize_host, finalize_device = compilation_pipeline.get_tir_pipeline(base)

    @tvm.transform.module_pass(opt_level=0, name="tvmfuse.CachedTIRPipeline")
    def _pass(mod, _ctx):
        store = getattr(_STATE, "store", None)
        out = _cached(mod, inner, store, base) if store is not None else None
        return out if out is not None else inner(mod)

    return _pass, finalize_host, finalize_device


def _cached(mod, inner, store, base: str):
    """``inner(mod)`` from the kernels' stored results and ``inner`` run on the others; None where a result
    cannot be told apart by kernel."""
    import tvm
    from tvm import tirx
    from tvm_ffi.serialization import from_json_graph_str

    kernels = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]  # the module's order
    if len(kernels) != len(mod.functions) or len(kernels) < 2:  # alone, a kernel is the module's entry
        return None
    target, context = str(tvm.target.Target.current(allow_none=True)), pass_options() + base
    scheduled = _scheduled_forms(getattr(_STATE, "known", None), kernels)
    keys = {gv.name_hint: derived_key(scheduled, f, target, context, fmt=FORMAT)
            or kernel_key(f, target, context, fmt=FORMAT) for gv, f in kernels}
    results: dict = {}
    for gv, func in kernels:
        data = store.get(keys[gv.name_hint])
        if data is not None:
            try:
                results[gv.name_hint] = _bound(from_json_graph_str(data.decode()), func.attrs.get("target"))
            except Exception:  # noqa: BLE001 - an entry this TVM cannot read: run again
                pass
    missing = [(gv, f) for gv, f in kernels if gv.name_hint not in results]
    if missing:
        made = _run(kernels, missing, inner, mod.attrs)
        if made is None:
            return None
        for name, part in made.items():
            results[name] = part
            store.put(keys[name], tvm.ir.save_json(part).encode())
    # as TVM's pipeline orders them: every kernel's device functions, then every host function
    parts = [(gv.name_hint, list(results[gv.name_hint].functions.items())) for gv, _ in kernels]
    merged = {g: f for name, items in parts for g, f in items if g.name_hint != name}
    merged.update({g: f for name, items in parts for g, f in items if g.name_hint == name})
    return tvm.IRModule(merged, attrs=mod.attrs)


def _bound(part, target):
    """``part`` (a stored result) with its functions' targets the build's own: TVM's JSON of a target leaves out
    its host, and the device code is grouped by the target's text (``tvm.tirx.build``), so a stored kernel
    would land in a device module of its own."""
    import tvm

    if target is None:
        return part
    funcs = {}
    for gv, func in part.functions.items():
        old = func.attrs.get("target")
        if old is not None:
            func = func.with_attr("target", target if old.kind.name == target.kind.name else target.host)
        funcs[gv] = func
    return tvm.IRModule(funcs)


def _run(kernels: list, missing: list, inner, attrs) -> dict | None:
    """``inner`` on the kernels ``missing`` together: name -> the module of what it made of that kernel. A lone
    kernel runs beside another of the module's (whose result is dropped): TVM's ``AnnotateEntryFunc`` marks
    the only function of a module as its entry."""
    import tvm

    funcs = dict(missing)
    if len(funcs) == 1:
        funcs.update([next((gv, f) for gv, f in kernels if gv not in funcs)])
    made = inner(tvm.IRModule(funcs, attrs=attrs))
    names = sorted((gv.name_hint for gv, _ in missing), key=len, reverse=True)
    others = sorted((gv.name_hint for gv in funcs if gv.name_hint not in names), key=len, reverse=True)
    parts: dict = {name: {} for name in names}
    for gv, func in made.functions.items():
        owner = next((n for n in names + others if gv.name_hint == n or gv.name_hint.startswith(n + "_kernel")),
                     None)
        if owner is None:
            return None
        if owner in parts:
            parts[owner][gv] = func
    return {name: tvm.IRModule(part) for name, part in parts.items()}
