"""Build CUDA libraries that a GPU machine can load, on a machine with no NVIDIA driver.

TVM compiles CUDA kernels to a cubin only when its CUDA runtime (``libtvm_runtime_cuda.so``) is loaded, and
that library links ``libcuda.so.1``, the driver. Without a driver TVM keeps the kernels as CUDA source in
the exported library (a "fallback" module), which is not what a deployment should ship. The CUDA toolkit
solves the same problem for linking with a stub driver; tvmfuse does it at run time: where no
``libcuda.so.1`` can be loaded, it compiles a stub with the few entry points TVM's runtime links against
(each answers "no device"), caches it under ``~/.cache/tvmfuse``, and maps it, then TVM's CUDA runtime, when a
CUDA target's backend is made.
``tvm.cuda(0).exist`` stays False, nothing can run on the stub, and nvcc produces real cubins.

Also: TVM compiles CUDA with NVRTC through the ``cuda-bindings`` package by default; where that package is
missing and ``nvcc`` is on PATH, ``TVM_CUDA_COMPILE_MODE=nvcc`` is set (a value the user set wins).

Set ``TVMFUSE_CUDA_STUB=0`` to turn the stub off.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

# The driver entry points libtvm_runtime_cuda.so links (`nm -D --undefined-only`); all return
# CUDA_ERROR_NO_DEVICE (100) except the two error-text lookups.
STUB_SOURCE = """\
/* libcuda.so.1 stand-in written by tvmfuse for building on machines without an NVIDIA driver. */
#define NO_DEVICE 100
int cuDeviceGetName(void) { return NO_DEVICE; }
int cuFuncSetAttribute(void) { return NO_DEVICE; }
int cuLaunchKernelEx(void) { return NO_DEVICE; }
int cuModuleGetFunction(void) { return NO_DEVICE; }
int cuModuleLoadData(void) { return NO_DEVICE; }
int cuModuleUnload(void) { return NO_DEVICE; }
int cuTensorMapEncodeTiled(void) { return NO_DEVICE; }
int cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
int cuGetErrorString(int e, const char **s) { (void)e; *s = "no NVIDIA driver (tvmfuse build stub)"; return 0; }
"""

state = {"driver": "unchecked"}  # "real", "stub", "none" (no driver, no stub), "off"


def cache_dir() -> Path:
    return Path(os.environ.get("TVMFUSE_CACHE", Path.home() / ".cache" / "tvmfuse"))


def build_stub(directory: Path) -> Path | None:
    """Compile the stub into ``directory``; None where no C compiler is available or it fails."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    source, lib = directory / "libcuda_stub.c", directory / "libcuda.so.1"
    source.write_text(STUB_SOURCE)
    tmp = directory / f".libcuda.so.1.{os.getpid()}"
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(source)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, lib)  # atomic: concurrent processes never load a half-written stub
    return lib


def preload() -> str:
    """Make sure TVM's CUDA runtime is mapped, so that CUDA kernels build to cubins: the driver, or the stub
    where there is none, then ``libtvm_runtime_cuda.so``. Called when a CUDA target's backend is made (never at
    import: importing tvmfuse builds and maps nothing). Returns the driver state."""
    if state["driver"] != "unchecked":
        return state["driver"]
    # Off when asked, in runtime-only processes (which run libraries, never build them: they map TVM's CUDA
    # runtime with map_runtime), and where CUDA cannot be compiled anyway (neither nvcc nor cuda-bindings).
    nvcc, nvrtc = shutil.which("nvcc"), importlib.util.find_spec("cuda") is not None
    if (os.environ.get("TVMFUSE_CUDA_STUB", "1") == "0" or os.environ.get("TVM_USE_RUNTIME_LIB") == "1"
            or not (nvcc or nvrtc)):
        state["driver"] = "off"
        return state["driver"]
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
        state["driver"] = "real"
    except OSError:
        lib = cache_dir() / "cuda-stub" / "libcuda.so.1"
        try:
            lib = lib if lib.exists() else build_stub(lib.parent)
            if lib is not None:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError:
            lib = None
        state["driver"] = "stub" if lib is not None else "none"
    if not nvrtc:
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    if state["driver"] != "none":
        try:
            map_runtime()
        except OSError:  # the build then keeps the kernels as source, and says so (cuda Backend.build_info)
            pass
    return state["driver"]


def map_runtime() -> None:
    """Map TVM's CUDA runtime (``libtvm_runtime_cuda.so``: the CUDA device API, the loader of CUDA modules and
    what makes the compiler emit cubins) where it is not mapped yet. TVM maps it at import only when a driver
    is present; a runtime-only process (``TVM_USE_RUNTIME_LIB=1``) never does ("a loader of that name is not
    registered" for every CUDA library).

    Raises
    ------
    OSError
        The library is missing or cannot be mapped (no NVIDIA driver: it links ``libcuda.so.1``).
    """
    import tvm
    import tvm_ffi

    if tvm_ffi.get_global_func("device_api.cuda", allow_missing=True) is not None:
        return
    ctypes.CDLL(str(Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"), mode=ctypes.RTLD_GLOBAL)


def cuda_available() -> bool:
    """True when an NVIDIA GPU is visible to the TVM runtime."""
    try:
        import tvm

        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - a runtime without CUDA support raises various errors
        return False


def cuda_codegen_ready() -> bool:
    """True when TVM will compile CUDA kernels to binaries (its CUDA runtime is loaded)."""
    import tvm_ffi

    return tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None


# What TVM's compile callback reads besides the source (tvm.support.nvcc): ptxas's options, the debug and dump
# flags, fast math, NVRTC's options, the toolkit's and NVSHMEM's homes. The compiler is compile_mode().
COMPILER_ENV = ("TVM_CUDA_PTXAS_REG_LEVEL", "TVM_CUDA_PTXAS_EXTRA_OPTS", "TVM_KERNEL_DUMP", "TVM_KERNEL_DEBUG",
                "TVM_CUDA_NVCC_NO_FAST_MATH", "TVM_CUDA_NVRTC_EXTRA_OPTS", "CUDA_PATH", "NVSHMEM_HOME")


def compile_mode() -> str:
    """The compiler TVM's callback will use: the user's ``TVM_CUDA_COMPILE_MODE``, else NVRTC where
    ``cuda-bindings`` is installed and nvcc where not (what :func:`preload` sets)."""
    asked = os.environ.get("TVM_CUDA_COMPILE_MODE")
    return asked.lower() if asked else "nvrtc" if importlib.util.find_spec("cuda") is not None else "nvcc"


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    """``nvcc --version`` of the nvcc on PATH (about 60 ms: asked once a process)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "no nvcc"
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nvcc unreadable"


def toolchain() -> str:
    """What decides the device code of a CUDA source besides the source and the architecture: the compiler,
    nvcc's version (NVRTC comes with the same toolkit) and the settings TVM's callback reads from the
    environment. The cache's keys take it; the same before and after :func:`preload`."""
    env = "\n".join(f"{name}={os.environ.get(name, '')}" for name in COMPILER_ENV)
    return f"{compile_mode()}\n{nvcc_version()}\n{env}"
