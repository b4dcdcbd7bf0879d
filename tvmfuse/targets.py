"""Named compilation targets and the capabilities of the host CPU.

A target is named (``x86-avx512``, ``x86-host``, ``cuda-sm80``, ``cuda-sm90``) or given as a raw TVM
target dict. :func:`resolve` turns either into a :class:`TargetSpec`, the one object the rest of tvmfuse
passes around.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Mapping

from .errors import TargetError

# LLVM feature name -> the flag Linux prints in /proc/cpuinfo. Checked before running compiled code, so
# that a library built for a richer CPU fails with a message instead of SIGILL.
_CPUINFO_FLAG = {
    "avx2": "avx2",
    "fma": "fma",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512vnni": "avx512_vnni",
    "avx512vbmi": "avx512vbmi",  # vpermb: the INT8 depthwise kernel's byte transpose (Ice Lake, Zen 4 on)
    "avxvnni": "avx_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
}


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """A resolved target.

    Attributes
    ----------
    name : str
        The registry name, or ``"custom"`` for a raw TVM target dict.
    config : dict
        The TVM target dict (``{"kind": "llvm", "mcpu": ...}``).
    host : dict or None
        The host target dict for device targets (CUDA).
    backend_name : str
        The backend that compiles for it: the folder ``schedules/<backend_name>/``. Named by the target, not
        derived from TVM's kind (an Arm CPU is an ``llvm`` target too); a raw dict gets its kind's default
        (:data:`KIND_BACKENDS`) unless it names one (``"backend"``).
    """

    name: str
    config: Mapping[str, Any]
    host: Mapping[str, Any] | None = None
    backend_name: str = ""

    def __post_init__(self):
        if not self.backend_name:
            object.__setattr__(self, "backend_name", KIND_BACKENDS.get(self.kind, ""))

    @property
    def kind(self) -> str:
        """TVM target kind: ``"llvm"`` or ``"cuda"``."""
        return str(self.config["kind"])

    def backend(self):
        """The target's backend (``tvmfuse.schedules.<backend_name>.Backend``); see
        :class:`tvmfuse.schedules.backend.Backend` for what it answers. Made once per spec: a compile asks it
        dozens of times, and an x86 backend asks LLVM for the CPU's features when made."""
        return self._backend

    @functools.cached_property
    def _backend(self):
        return backend_class(self.backend_name)(self)

    def tvm_target(self):
        """Build the ``tvm.target.Target`` (imports the TVM compiler)."""
        import tvm

        if self.host is not None:
            return tvm.target.Target(dict(self.config), host=dict(self.host))
        return tvm.target.Target(dict(self.config))

    def features(self) -> frozenset[str]:
        """The checked LLVM features the target's CPU has (empty for CUDA); LLVM is asked once per spec."""
        return self._features

    @functools.cached_property
    def _features(self) -> frozenset[str]:
        if self.kind != "llvm":  # LLVM's CPU features: none for a device target
            return frozenset()
        from tvm.target import codegen

        target = self.tvm_target()
        return frozenset(f for f in _CPUINFO_FLAG if codegen.llvm_cpu_has_features([f], target))

    def vector_bits(self) -> int:
        """Widest SIMD register the target may use: 512, 256 or 128."""
        feats = self.features()
        if "avx512f" in feats:
            return 512
        return 256 if "avx2" in feats else 128

    def to_json(self) -> dict:
        return {"name": self.name, "config": dict(self.config), "host": dict(self.host) if self.host else None,
                "backend": self.backend_name}

    def __getstate__(self):
        # A pickled spec (a tuning worker's) leaves its cached backend and features behind: made again there.
        return {k: v for k, v in self.__dict__.items() if k not in ("_backend", "_features")}


# The backend a raw target dict of each TVM kind compiles with when it names none. Named targets (TARGETS) name
# their own: a new backend is a folder under schedules/ and the TargetSpec lines that name it.
KIND_BACKENDS = {"llvm": "x86", "cuda": "cuda"}


def backend_class(name: str):
    """The Backend class of the backend folder ``schedules/<name>/`` (imports it, and with it the TVM compiler)."""
    import importlib

    return importlib.import_module(f"tvmfuse.schedules.{name}").Backend


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Set to an LLVM CPU name (``znver3``, ``skylake-avx512``, ...) to make tvmfuse take this machine for that CPU:
# ``x86-host`` compiles for it, and the features it lacks count as missing here (code that uses them is refused).
# An AVX-512 machine thus runs the suite as an AVX2-only CPU would (``.ci/run`` does, for the CPU-dependent tests).
HOST_CPU_ENV = "TVMFUSE_HOST_CPU"


def host_cpu_flags() -> frozenset[str]:
    """Flags of the host CPU from /proc/cpuinfo (empty where it cannot be read), less the checked features
    that the CPU named by ``TVMFUSE_HOST_CPU`` lacks when that is set."""
    return _host_flags(os.environ.get(HOST_CPU_ENV) or None)


@functools.lru_cache(maxsize=None)
def _host_flags(emulated: str | None) -> frozenset[str]:
    flags = _cpuinfo_flags()
    if emulated is None or not flags:
        return flags
    has = _llvm_cpu_features(emulated)
    lacks_here = sorted(_CPUINFO_FLAG[f] for f in has if _CPUINFO_FLAG[f] not in flags)
    if lacks_here:
        raise TargetError(f"{HOST_CPU_ENV}={emulated} names a CPU with {', '.join(lacks_here)}, which this "
                          "machine lacks; name one this machine can stand in for (e.g. znver3 for AVX2 only)")
    return flags - {_CPUINFO_FLAG[f] for f in _CPUINFO_FLAG if f not in has}


@functools.lru_cache(maxsize=1)
def _cpuinfo_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


# The checked features of the CPUs a test or CI stands this machine in for, as LLVM 22 gives them: a process
# that has only TVM's runtime (no LLVM to ask) reads them here. tests/test_targets.py compares them with LLVM.
_AVX2 = frozenset({"avx2", "fma"})
_ZEN4 = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vbmi", "avx512bf16"}
_SPR = _ZEN4 | {"avxvnni", "avx512fp16", "amx-int8", "amx-bf16"}
KNOWN_CPU_FEATURES = {
    "haswell": _AVX2, "znver2": _AVX2, "znver3": _AVX2, "x86-64-v3": _AVX2, "alderlake": _AVX2 | {"avxvnni"},
    "znver4": _ZEN4, "znver5": _ZEN4 | {"avxvnni"},
    "skylake-avx512": _AVX2 | {"avx512f", "avx512bw", "avx512vl"},
    "cascadelake": _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512vnni"},
    "icelake-server": _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vbmi"},
    "sapphirerapids": _SPR, "emeraldrapids": _SPR, "graniterapids": _SPR,
}


def _llvm_cpu_features(cpu: str) -> frozenset[str]:
    """The checked LLVM features of the CPU LLVM calls ``cpu``."""
    try:
        import tvm
        from tvm.target import codegen

        triple = str(codegen.llvm_get_system_triple())
    except (ImportError, AttributeError):  # a runtime-only process: no LLVM to ask
        if cpu in KNOWN_CPU_FEATURES:
            return KNOWN_CPU_FEATURES[cpu]
        raise TargetError(f"{HOST_CPU_ENV}={cpu}: a process with TVM's runtime alone knows only "
                          f"{', '.join(KNOWN_CPU_FEATURES)}") from None
    if not codegen.llvm_is_valid_cpu(cpu, triple):
        raise TargetError(f"{HOST_CPU_ENV}={cpu!r} is not a CPU LLVM knows (e.g. znver3, znver4, skylake-avx512, "
                          "sapphirerapids)")
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    return frozenset(f for f in _CPUINFO_FLAG if codegen.llvm_cpu_has_features([f], target))


def host_mcpu() -> str:
    """The LLVM CPU name that fits this host (``TVMFUSE_HOST_CPU`` when that is set).

    LLVM's own detection names an AMX-capable Sapphire Rapids in a VM ``rocketlake``, which loses AMX, so
    the richest Intel parts are chosen from the CPU flags first. AMD parts keep LLVM's name (``znver4``).
    """
    from tvm.target import codegen

    emulated = os.environ.get(HOST_CPU_ENV)
    if emulated:
        host_cpu_flags()  # validates the name and that this machine can stand in for it
        return emulated
    return mcpu_for(host_cpu_flags(), str(codegen.llvm_get_system_cpu()))


def mcpu_for(flags: frozenset[str], llvm_cpu: str) -> str:
    """The LLVM CPU for a CPU with these /proc/cpuinfo flags that LLVM detects as ``llvm_cpu``."""
    if llvm_cpu.startswith("znver"):
        return llvm_cpu
    if {"amx_int8", "avx512_vnni"} <= flags:
        return "sapphirerapids"
    if "avx512_vnni" in flags:
        return "cascadelake"
    if "avx512f" in flags:
        return "skylake-avx512"
    return llvm_cpu


# Sapphire Rapids' instruction scheduling, without the extensions AVX-512 servers before it (Ice Lake) and
# AMD's (Zen 4) lack. None costs a kernel speed: LLVM re-encodes an int8 multiply-add as VEX AVX-VNNI when it
# may (same speed as the EVEX form, but SIGILL on a Zen 4), no kernel computes in FP16 or BF16, and no
# schedule uses AMX tiles. One x86-avx512 library thus runs on every AVX-512 + VNNI CPU from Ice Lake on.
X86_AVX512_OFF = ("-avxvnni", "-avx512fp16", "-avx512bf16", "-amx-tile", "-amx-int8", "-amx-bf16")


def _x86_avx512() -> TargetSpec:
    return TargetSpec("x86-avx512", {"kind": "llvm", "mcpu": "sapphirerapids", "mattr": list(X86_AVX512_OFF),
                                     "num-cores": _cores()}, backend_name="x86")


def _x86_host() -> TargetSpec:
    return TargetSpec("x86-host", {"kind": "llvm", "mcpu": host_mcpu(), "num-cores": _cores()}, backend_name="x86")


def _cuda(arch: str, name: str):
    # The host part of a CUDA library runs on whatever CPU drives the GPU: keep it generic x86-64. The limits
    # are those of TVM's nvidia/nvidia-a100 and -h100 tags; MetaSchedule's GPU verifier needs them.
    config = {"kind": "cuda", "arch": arch, "max_shared_memory_per_block": 49152, "max_threads_per_block": 1024,
              "thread_warp_size": 32}
    return lambda: TargetSpec(name, dict(config), host={"kind": "llvm"}, backend_name="cuda")


TARGETS = {
    "x86-avx512": _x86_avx512,
    "x86-host": _x86_host,
    "cuda-sm80": _cuda("sm_80", "cuda-sm80"),
    "cuda-sm90": _cuda("sm_90", "cuda-sm90"),
}


# The float precisions a build may ask for (``compile(precision=...)``); each backend says which it builds
# (``Backend.precisions``).
PRECISIONS = ("fp32", "fp16")

# What every command and ``tvmfuse.compile`` build for when no target is named: this machine, as -march=native,
# onnxruntime and OpenVINO's "CPU" do. Named targets are for building for another machine.
DEFAULT = "x86-host"


def names() -> list[str]:
    """Names of the registered targets."""
    return list(TARGETS)


def resolve(target: str | Mapping[str, Any] | TargetSpec) -> TargetSpec:
    """Turn a target name, a raw TVM target dict or a TargetSpec into a TargetSpec.

    Raises
    ------
    TargetError
        For an unknown name (the message lists the known ones) or a dict without ``kind``.
    """
    if isinstance(target, TargetSpec):
        return target
    if isinstance(target, str):
        if target not in TARGETS:
            raise TargetError(f"unknown target {target!r}; known targets: {', '.join(TARGETS)} "
                              "(or pass a TVM target dict such as {'kind': 'llvm', 'mcpu': 'znver3'})")
        return TARGETS[target]()
    if isinstance(target, Mapping):
        config = dict(target)
        host, backend = config.pop("host", None), config.pop("backend", None)
        if config.get("kind") not in KIND_BACKENDS:
            raise TargetError(f"target dict must have kind {' or '.join(repr(k) for k in KIND_BACKENDS)}, "
                              f"got {config.get('kind')!r}")
        if backend is not None and not _is_backend(backend):
            raise TargetError(f"target dict names backend {backend!r}; the backends are {', '.join(backend_names())}")
        if config["kind"] == "cuda" and host is None:
            host = {"kind": "llvm"}
        return TargetSpec("custom", config, host, backend or "")
    raise TargetError(f"target must be a name, a dict or a TargetSpec, got {type(target).__name__}")


def backend_names() -> list[str]:
    """The backend folders under ``schedules/``: the packages whose ``__init__`` defines a ``Backend`` (read, not
    imported: importing one imports TVM's compiler)."""
    import importlib.util
    import pkgutil

    schedules = importlib.util.find_spec("tvmfuse.schedules")
    found = []
    for module in pkgutil.iter_modules(schedules.submodule_search_locations):
        init = Path(module.module_finder.path) / module.name / "__init__.py"
        if module.ispkg and init.is_file() and "\nclass Backend(" in init.read_text():
            found.append(module.name)
    return sorted(found)


def _is_backend(name: str) -> bool:
    import sys

    module = sys.modules.get(f"tvmfuse.schedules.{name}")  # one made in the process (a test's stub backend)
    return hasattr(module, "Backend") if module is not None else name in backend_names()


class ForeignTargetWarning(UserWarning):
    """A library is built for CPU features this machine lacks: it will not run here (cross-compiling)."""


def missing_host_features(spec: TargetSpec) -> list[str]:
    """CPU features the target's code uses that this host lacks (empty when it can run here, and for a device
    target: LLVM reports no CPU features for it)."""
    flags = host_cpu_flags()
    if not flags:
        return []
    return sorted(f for f in spec.features() if _CPUINFO_FLAG[f] not in flags)


def required_cpu_flags(spec: TargetSpec) -> list[str]:
    """The /proc/cpuinfo flags a CPU needs to run code compiled for ``spec`` (recorded in manifests)."""
    return sorted(_CPUINFO_FLAG[f] for f in spec.features())
