"""tvmfuse: compile ONNX CNNs into fused, tuned shared libraries for x86 and CUDA, on Apache TVM.

``tvmfuse.load`` and ``tvmfuse.zoo`` import no TVM compiler code, so an exported library can be run in a
process where only the TVM runtime is present (``TVM_USE_RUNTIME_LIB=1``). ``import tvmfuse`` needs only
numpy (``zoo`` needs onnx and is imported on first use), so a runtime bundle (``tvmfuse bundle``) runs
where neither TVM nor onnx is installed.
"""

from __future__ import annotations

from . import errors  # noqa: F401
from .errors import TvmfuseError
from .version import __version__  # noqa: F401 - the package's version, defined in a leaf

# Importing tvmfuse (and so any of its modules, tvmfuse.schedules too) sets no environment variable and maps or
# builds nothing: the runtime configures TVM's thread pool when imported (tvmfuse.runtime), and a CUDA target's
# backend maps the driver, or a build stub, when made (tvmfuse.cuda_driver).

__all__ = ["CompiledModel", "TvmfuseError", "compare", "compile", "errors", "load", "partitions", "quantize", "zoo"]


def __getattr__(name: str):
    # Imported on first use: `import tvmfuse` costs nothing, and `tvmfuse.load` stays runtime-only.
    if name == "load":
        from .runtime import load

        return load
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
