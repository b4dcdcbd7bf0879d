"""What a comparison ran on: the CPU, its load, the software versions, and the roofline ceilings."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time

import numpy as np

from .. import targets
from ..host import FEATURES, cpu_name
from ..threads import cpu_budget

def cpu_device() -> str:
    """The device key of rows measured on this CPU."""
    return f"cpu: {cpu_name()}"


def versions() -> dict[str, str | None]:
    """tvmfuse, TVM, tvm-ffi, LLVM, numpy, onnx and the peers (None where a peer is not installed)."""
    import onnx
    import tvm

    from ..export import versions as stack

    out: dict[str, str | None] = dict(stack())
    try:
        out["llvm"] = str(tvm.target.codegen.llvm_version_major())
    except Exception:  # noqa: BLE001 - a TVM built without LLVM
        out["llvm"] = None
    out.update(numpy=np.__version__, onnx=onnx.__version__)
    for name, module in (("onnxruntime", "onnxruntime"), ("openvino", "openvino")):
        try:
            out[name] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - absent or broken peer: reported as not installed
            out[name] = None
    return out


def load() -> list[float] | None:
    """1, 5 and 15-minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def roofline(seconds: float = 1.0) -> dict:
    """The ceilings a roofline plot draws, measured here: memory bandwidth and float32 peak.

    Bandwidth: the best of several one-thread numpy copies of 128 MB (read + write counted), a lower
    bound on what all cores together reach. Peak: the best numpy float32 1024^3 matmul (the BLAS
    library's own threads), an achievable peak rather than the datasheet one. About ``seconds`` in all.
    """
    n = 32 * 1024 * 1024
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    a = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    best_copy = best_mm = float("inf")
    deadline = time.perf_counter() + seconds
    for i in range(40):
        start = time.perf_counter()
        np.copyto(dst, src)
        best_copy = min(best_copy, time.perf_counter() - start)
        start = time.perf_counter()
        a @ a
        best_mm = min(best_mm, time.perf_counter() - start)
        if i >= 2 and time.perf_counter() > deadline:
            break
    return {"bandwidth_gbs": round(2 * src.nbytes / best_copy / 1e9, 2),
            "peak_gflops": round(2 * 1024 ** 3 / best_mm / 1e9, 1),
            "how": "bandwidth: best one-thread numpy copy of 128 MB (read + write); peak: best numpy float32 "
                   "1024x1024x1024 matmul"}


def environment(threads: int, measure_roofline: bool = True) -> dict:
    """The report's ``environment`` entry, with ``load_before`` filled in; the caller sets ``load_after``."""
    shown = {flag for _, flag in FEATURES} | {"fma", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_int8"}
    flags = sorted(targets.host_cpu_flags() & shown)
    env = {"host": socket.gethostname(), "cpu": cpu_name(), "cpu_flags": flags, "cores": os.cpu_count(),
           "cpu_budget": cpu_budget(), "threads": threads, "load_before": load(), "load_after": None,
           "versions": versions(), "python": platform.python_version(), "platform": platform.platform(),
           "argv": list(sys.argv)}
    if measure_roofline:
        env["roofline"] = roofline()
    return env
