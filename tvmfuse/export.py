"""Build a Relax module into an executable, export it as a shared library with a JSON manifest."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Sequence

from . import link
from .errors import TvmfuseError
from .heap import build_heap
from .library_file import LibraryFile
from .runtime.integrity import MANIFEST_FORMAT, MANIFEST_VERSION, seal_manifest
from .passes.pipeline import relax_pipeline
from .runtime import manifest_path
from .targets import TargetSpec, required_cpu_flags
from .tensors import TensorInfo
from .runtime.tvm_log import quiet_tvm_warnings
from .version import __version__


def build(mod, spec: TargetSpec, database=None, applied: list | None = None, graph: bool = False, cache=None,
          known: dict | None = None):
    """Compile ``mod`` for ``spec``, with tuned schedules from ``database`` where it has them.

    ``applied`` (optional list) receives the names of the kernels a tuning record scheduled; ``graph``: capture
    the kernel launches in a graph where the backend can (``Backend.pass_config``); ``cache``: the kernel
    cache to reuse and fill (:func:`tvmfuse.cache.resolve`: None the default one, False none); ``known``: kernel ->
    its key, from the lowering (:class:`tvmfuse.cache.lowered.LoweredKernels`), which the cache's keys chain from.

    Returns
    -------
    executable : tvm.relax.VMExecutable
    lowered : tvm.IRModule
        The module after the Relax pipeline: its PrimFuncs are the kernels in the library.
    kernel_stats : tvmfuse.cache.kernels.KernelStats
        How many kernels there are and how many came from the cache (0 where it is off or does not apply).
    """
    import tvm

    from . import cache as kernel_cache
    from .cache import cuda_binaries, kernels, lowered_tir, schedules

    target = spec.tvm_target()
    store = kernel_cache.resolve(cache)
    known = dict(known or {}) if store is not None else None

    def reuse(make, names):
        return schedules.cached(make, store, database, names, known)

    with target, tvm.transform.PassContext(opt_level=3, config=spec.backend().pass_config(graph)):
        lowered = relax_pipeline(spec, target, database, applied, reuse)(mod)
        if kernels.cacheable(target):
            executable, stats = kernels.build_executable(lowered, target, store, known, spec.backend().tir_pipeline())
            return executable, lowered, stats
        count = len(kernel_names(lowered))
        # Built from one source for all kernels (CUDA): the cache keeps its device code (cuda_binaries)
        with cuda_binaries.storing(store) as device, lowered_tir.storing(store, known):
            executable = tvm.compile(lowered, target=target, relax_pipeline=None,
                                     tir_pipeline=lowered_tir.pipeline(spec.backend().tir_pipeline()))
        reused = count if device["hits"] and not device["builds"] else _reused(lowered, device)
        if device["hits"] or device["builds"]:
            store.log_run("kernels", reused, count - reused)
            if device["builds"]:
                store.evict()
        return executable, lowered, kernels.KernelStats(count, reused)


_DEVICE_SUFFIX = re.compile(r"_kernel(_\d+)?$")  # a kernel's device functions: NAME_kernel, NAME_kernel_1, ...


def _reused(lowered, device: dict) -> int:
    """The kernels (PrimFuncs) all of whose device kernels (``NAME_kernel``, ``NAME_kernel_1``, ...) had their
    code in the cache (:func:`tvmfuse.cache.cuda_binaries.storing`'s counts)."""
    built = {_DEVICE_SUFFIX.sub("", name) for name in device["kernels_built"]}
    found = {_DEVICE_SUFFIX.sub("", name) for name in device["kernels_found"]}
    return sum(1 for name in kernel_names(lowered) if name in found and name not in built)


def kernel_source(lowered, spec: TargetSpec, fmt: str = "asm") -> str:
    """The code of the kernels of ``lowered`` as text: for CPU targets ``"asm"`` or ``"ll"`` (LLVM IR), built
    again in one module with the options compile used (compile builds one object per kernel, which keeps
    no text); for CUDA targets ``"cu"``, the device source."""
    import tvm

    kernels = {gv: f for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    target = spec.tvm_target()
    with target, tvm.transform.PassContext(opt_level=3, config=spec.backend().pass_config(False)):
        lib = tvm.tirx.build(tvm.IRModule(kernels), target=target, pipeline=spec.backend().tir_pipeline())
    if spec.backend().device == "cuda":
        return lib.imports[0].inspect_source()
    return lib.inspect_source(fmt)


def kernel_names(lowered) -> list[str]:
    """Names of the PrimFuncs (kernels) in a lowered module, sorted."""
    import tvm

    return sorted(gv.name_hint for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def kernel_schedulers(lowered) -> dict[str, str]:
    """Kernel name -> who scheduled it: ``tvmfuse.<backend>[.<rule>]``, ``tuning_log``, ``dlight.<Rule>``, or
    ``none`` (lowered as TVM legalized it: the CPU backends' loops as they are)."""
    import tvm

    from .schedules.backend import SCHEDULED_BY

    return {gv.name_hint: str(f.attrs.get(SCHEDULED_BY, "none")) if f.attrs else "none"
            for gv, f in sorted(lowered.functions_items(), key=lambda item: item[0].name_hint)
            if isinstance(f, tvm.tirx.PrimFunc)}


@contextlib.contextmanager
def building():
    """What compile, quantize and export run inside (one decorator: one frame between them and their caller,
    where warnings point): TVM's warning lines dropped, freed memory reused (:mod:`tvmfuse.heap`)."""
    with quiet_tvm_warnings(), build_heap():
        yield


def output_infos(mod, names: Sequence[str]) -> list[TensorInfo]:
    """Output shapes/dtypes from the Relax signature; -1 marks a dim only known at run time (e.g. NonZero)."""
    from tvm import ir, tirx

    def dim(d) -> int:
        return int(d) if isinstance(d, (int, tirx.IntImm)) else -1

    ret = mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, ir.TupleType) else [ret]
    infos = []
    for name, f in zip(names, fields):
        shape = tuple(dim(d) for d in f.shape) if f.shape is not None else (-1,) * max(int(f.ndim), 0)
        infos.append(TensorInfo(name, shape, str(f.dtype)))
    return infos


def versions() -> dict:
    """Versions of tvmfuse and the TVM stack, recorded in every manifest."""
    import tvm
    import tvm_ffi

    return {"tvmfuse": __version__, "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__}


def target_fields(spec: TargetSpec) -> dict:
    """The manifest's fields that follow from the target and the TVM stack (recorded by
    :mod:`tvmfuse.cache.hits` so that a cached build is exported without TVM)."""
    return {"target": spec.to_json(), "cpu_flags": required_cpu_flags(spec),
            "device": spec.backend().device,  # what the runtime loads the library on (read without TVM's compiler)
            "versions": versions()}


def make_manifest(spec: TargetSpec, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
                  source: str, extra: dict | None = None) -> dict:
    """The manifest written beside every exported library (:func:`export_library` adds the seal: the library's
    size and sha256 and the manifest's digest, see :mod:`tvmfuse.runtime.integrity`)."""
    return manifest_of(target_fields(spec), [i.to_json() for i in inputs], [o.to_json() for o in outputs], source,
                       extra)


def manifest_of(fields: dict, inputs: list, outputs: list, source: str, extra: dict | None = None) -> dict:
    """:func:`make_manifest` from the target's fields (:func:`target_fields`) and the tensors as JSON."""
    manifest = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION, "model": source, "inputs": inputs,
                "outputs": outputs, **fields,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    manifest.update(extra or {})
    return manifest


def build_fields(kernel_info: dict, layout: str, precision: str, tuning_logs, build_info: dict, quantization,
                 pinned: dict) -> dict:
    """The manifest's fields that describe the build (kernels, layout, precision, logs, quantization)."""
    extra = {**kernel_info, "layout": layout, "precision": precision, "tuning_logs": tuning_logs, **build_info}
    if quantization is not None:
        extra["quantization"] = quantization
    if pinned:
        extra["pinned_inputs"] = pinned
    return extra


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@quiet_tvm_warnings()  # "Scope Saving:" per weight of an executable that has run
def export_library(executable, path: str | Path, manifest: dict) -> Path:
    """Write ``path`` (a ``.so``: ``executable`` exported, or a :class:`tvmfuse.library_file.LibraryFile`
    linked before) and its manifest beside it; return the library path.

    The library is written to a temporary name first, so an interrupted export never leaves a truncated
    ``.so`` under the final name. The manifest written is ``manifest`` sealed with the library's size and
    sha256 and its own digest (:func:`tvmfuse.runtime.integrity.seal_manifest`), which :func:`tvmfuse.load` checks
    before it maps the library.
    """
    path = Path(path)
    if path.suffix != ".so":
        raise TvmfuseError(f"export path must end in .so, got {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.partial.so")
    try:
        if isinstance(executable, LibraryFile):
            executable.write(tmp)
        else:
            link.export_library(executable, str(tmp))
        sealed = seal_manifest(manifest, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _atomic_write_text(manifest_path(path), json.dumps(sealed, indent=2) + "\n")
    return path
