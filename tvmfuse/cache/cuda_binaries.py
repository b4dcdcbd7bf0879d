"""CUDA device code reused by source: what nvcc (or NVRTC) made of a module's CUDA source, stored under it.

TVM hands the CUDA source of all of a module's kernels to ``tvm_callback_cuda_compile`` (``tvm.support.nvcc``)
and embeds the fatbin or cubin it returns. Most of a CUDA build's time is there (YOLOv8n: 13.7 of 23.4 s on 2
cores, 10.7 s of it in nvcc's front end on 2.4 MB of source), and a build of the same model, shapes,
precision and tiles writes the same source. While :func:`storing` is active on a thread, the callback answers
a source the store holds with what it stored; the key is the source with what else decides the binary: the
compiler (mode and ``nvcc --version``), the architecture, the ptxas settings TVM reads from its environment,
and the versions in :func:`tvmfuse.cache.fingerprint.versions`. Entries are the store's (checksummed, private,
atomic, evicted least recently used first).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import threading

FORMAT = "cuda-binary-1"
# What TVM's callback reads besides the source (tvm.support.nvcc): the compiler, ptxas's options, the dump flag
# (which adds -lineinfo), NVSHMEM's home.
_ENV = ("TVM_CUDA_COMPILE_MODE", "TVM_CUDA_PTXAS_REG_LEVEL", "TVM_CUDA_PTXAS_EXTRA_OPTS", "TVM_KERNEL_DUMP",
        "NVSHMEM_HOME")

_STATE = threading.local()  # .store and .counts (storing's dict) of the build under way on this thread
_INSTALLED: dict = {}
_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "no nvcc"
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nvcc unreadable"


def key(code: str) -> str:
    """The key of the binary ``code`` compiles to under the current target and environment."""
    import tvm

    from .fingerprint import versions

    target = tvm.target.Target.current(allow_none=True)
    arch = str(getattr(target, "arch", "")) if target is not None else ""
    env = "\n".join(f"{name}={os.environ.get(name, '')}" for name in _ENV)
    material = "\n".join([FORMAT, versions(), _nvcc_version(), arch, env, code])
    return hashlib.sha256(material.encode()).hexdigest()


def _compile(code: str):
    store = getattr(_STATE, "store", None)
    if store is None:
        return _INSTALLED["compile"](code)
    entry = key(code)
    found = store.get(entry)
    if found is not None:
        _STATE.counts["hits"] += 1
        return bytearray(found)
    binary = _INSTALLED["compile"](code)
    _STATE.counts["builds"] += 1
    store.put(entry, bytes(binary))
    return binary


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
    says, after the block, how many device-code builds were answered (``hits``) and compiled (``builds``)."""
    counts = {"hits": 0, "builds": 0}
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
