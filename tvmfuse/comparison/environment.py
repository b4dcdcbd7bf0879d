"""What a comparison ran on: the CPU, its load, the software versions, and the roofline ceilings."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time

import numpy as np

from .. import targets
from ..threads import cpu_budget

# The features that decide which tvmfuse kernels run, as /proc/cpuinfo spells them, and as reports name them.
_FEATURES = (("AVX-512", "avx512f"), ("VNNI", "avx512_vnni"), ("AVX-VNNI", "avx_vnni"), ("AVX2", "avx2"),
             ("AMX", "amx_tile"))


def cpu_info() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (empty where it cannot be read)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break  # the first processor's block ends with an empty line
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_name() -> str:
    """``AMD EPYC (family 25 model 17; AVX-512, VNNI, AVX2)``: the CPU and the vector features that matter."""
    info = cpu_info()
    if not info:
        return platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    features = [name for name, flag in _FEATURES if flag in flags]
    return (f"{info.get('model name', platform.machine())} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}; {', '.join(features) or 'no AVX2'})")


def cpu_device() -> str:
    """The device key of rows measured on this CPU."""
    return f"cpu: {cpu_name()}"


def device_label(device: str, arch: str = "") -> str:
    """The device key of rows run on TVM runtime device ``device`` (``"cpu"``, ``"cuda"``): this CPU, or
    the GPU's name when one is present, else the architecture the code was built for."""
    if device == "cpu":
        return cpu_device()
    if targets.cuda_available():
        import tvm

        return f"{device}: {tvm.device(device, 0).device_name}"
    return f"{device}: {arch}"


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
    shown = {flag for _, flag in _FEATURES} | {"fma", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_int8"}
    flags = sorted(targets.host_cpu_flags() & shown)
    env = {"host": socket.gethostname(), "cpu": cpu_name(), "cpu_flags": flags, "cores": os.cpu_count(),
           "cpu_budget": cpu_budget(), "threads": threads, "load_before": load(), "load_after": None,
           "versions": versions(), "python": platform.python_version(), "platform": platform.platform(),
           "argv": list(sys.argv)}
    if measure_roofline:
        env["roofline"] = roofline()
    return env
