"""tvmfuse: compile ONNX CNNs into fused, tuned shared libraries for x86 and CUDA, on Apache TVM.

``tvmfuse.load`` and ``tvmfuse.zoo`` import no TVM compiler code, so an exported library can be run in a
process where only the TVM runtime is present (``TVM_USE_RUNTIME_LIB=1``). ``import tvmfuse`` needs only
numpy (``zoo`` needs onnx and is imported on first use), so a runtime bundle (``tvmfuse bundle``) runs
where neither TVM nor onnx is installed.
"""

from __future__ import annotations

from .version import __version__  # noqa: F401 - the package's version, defined in a leaf

# TVM's thread pool assumes hyper-threading and uses half the CPUs it sees (1 of 2 here, halving speed), and
# sees neither the affinity mask nor a cgroup quota. Default to the CPUs this process may use (see
# tvmfuse.threads); the pool reads this when first used, and a value the user set wins.
from . import threads as _threads  # noqa: E402

_threads.configure()

from . import cuda_driver, errors  # noqa: E402

cuda_driver.preload()  # before anything imports tvm: lets a driverless machine build loadable CUDA libraries
from .errors import TvmfuseError  # noqa: E402
from .runtime import load  # noqa: E402

__all__ = ["CompiledModel", "TvmfuseError", "compare", "compile", "errors", "load", "partitions", "quantize", "zoo"]


def __getattr__(name: str):
    # The compiler side is imported on first use, keeping `import tvmfuse` + `tvmfuse.load` runtime-only.
    if name in ("compile", "CompiledModel", "quantize"):
        from . import api

        return getattr(api, name)
    if name == "zoo":
        import importlib

        return importlib.import_module(".zoo", __name__)
    if name == "compare":
        from .comparison import compare

        return compare
    if name == "partitions":
        from .partition_report import partitions

        return partitions
    raise AttributeError(f"module 'tvmfuse' has no attribute {name!r}")
