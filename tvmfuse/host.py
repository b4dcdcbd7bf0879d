"""This machine's CPU as reports name it: the model and the vector features that decide which kernels run."""

from __future__ import annotations

import platform

# The features that decide which tvmfuse kernels run, as /proc/cpuinfo spells them, and as reports name them.
FEATURES = (("AVX-512", "avx512f"), ("VNNI", "avx512_vnni"), ("AVX-VNNI", "avx_vnni"), ("AVX2", "avx2"),
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
    features = [name for name, flag in FEATURES if flag in flags]
    return (f"{info.get('model name', platform.machine())} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}; {', '.join(features) or 'no AVX2'})")
