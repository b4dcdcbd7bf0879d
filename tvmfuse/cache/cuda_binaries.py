"""CUDA device code reused by source: what nvcc (or NVRTC) made of a module's CUDA source, stored under it.

TVM hands the CUDA source of all of a module's kernels to ``tvm_callback_cuda_compile`` (``tvm.support.nvcc``)
and embeds the fatbin or cubin it returns. Most of a CUDA build's time is there (YOLOv8n: 13.7 of 23.4 s on 2
cores, 10.7 s of it in nvcc's front end on 2.4 MB of source), and a build of the same model, shapes,
precision and tiles writes the same source. While :func:`storing` is active on a thread, the callback answers
a source the store holds with what it stored; the key is the source with what else decides the binary: the
compiler (mode and ``nvcc --version``), the architecture, the ptxas settings TVM reads from its environment,
and the versions in :func:`tvmfuse.cache.fingerprint.versions`. A source not found is built kernel by kernel
where it can be (:mod:`.cuda_kernels`: each kernel's PTX stored, the missing ones translated), so a model with
one changed layer translates that kernel alone. Entries are the store's (checksummed, private, atomic, evicted
least recently used first).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading

FORMAT = "cuda-binary-1"

_STATE = threading.local()  # .store and .counts (storing's dict) of the build under way on this thread
_INSTALLED: dict = {}
_LOCK = threading.Lock()


def _context() -> tuple[str, str]:
    """(what every key of this build shares: versions and toolchain; the target's architecture)."""
    import tvm

    from ..cuda_driver import toolchain
    from .fingerprint import versions

    target = tvm.target.Target.current(allow_none=True)
    arch = str(getattr(target, "arch", "")) if target is not None else ""
    return versions() + "\n" + toolchain(), arch


def key(code: str, context: tuple[str, str] | None = None) -> str:
    """The key of the binary ``code`` compiles to under the current target and environment (``context``:
    :func:`_context`'s, when known)."""
    shared, arch = context or _context()
    return hashlib.sha256("\n".join([FORMAT, shared, arch, code]).encode()).hexdigest()


def _compile(code: str):
    store = getattr(_STATE, "store", None)
    if store is None:
        return _INSTALLED["compile"](code)
    context = _context()
    entry = key(code, context)
    found = store.get(entry)
    if found is not None:
        _STATE.counts["hits"] += 1
        return bytearray(found)
    from ..threads import cpu_budget
    from . import cuda_kernels

    binary = cuda_kernels.compile(code, store, _STATE.counts, *context, cpu_budget())
    if binary is None:  # not in the form kernels are reused in: compiled whole, as TVM does
        binary = _INSTALLED["compile"](code)
    _STATE.counts["builds"] += 1
    store.put(entry, bytes(binary))
    return bytearray(binary)


def _install() -> None:
    """Put :func:`_compile` in front of TVM's callback, once per process (it passes through where no build on
    the thread is :func:`storing`)."""
    with _LOCK:
        if _INSTALLED:
            return
        import tvm_ffi
        from tvm.support import nvcc

        _INSTALLED["compile"] = nvcc.tvm_callback_cuda_compile
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", _compile, override=True)


@contextlib.contextmanager
def storing(store):
    """CUDA builds on this thread inside the block take their device code from ``store`` (a
    :class:`tvmfuse.cache.store.Store`; None: no change) and put what they compile there. Yields a dict that
    says, after the block, how many device-code builds were answered whole (``hits``) and compiled
    (``builds``), and which device kernels of those compiled had their PTX stored (``kernels_found``) and
    which were translated (``kernels_built``; both empty where the source was compiled whole)."""
    counts = {"hits": 0, "builds": 0, "kernels_found": [], "kernels_built": []}
    if store is None:
        yield counts
        return
    _install()
    saved = getattr(_STATE, "store", None), getattr(_STATE, "counts", None)
    _STATE.store, _STATE.counts = store, counts
    try:
        yield counts
    finally:
        _STATE.store, _STATE.counts = saved
