"""Runtime-only TVM bundles: what a machine without TVM needs to run exported libraries.

A bundle is a folder to put on ``PYTHONPATH``: the ``tvm`` Python package without its compiler library
(``libtvm_compiler.so``, ~250 MB) and sources, ``tvm_ffi``, and ``tvmfuse`` itself (pure Python; loading needs
only numpy). In a process started with ``TVM_USE_RUNTIME_LIB=1`` only ``libtvm_runtime`` is mapped, which is
all :func:`tvmfuse.load` needs. The result is ~20 MB instead of ~300 MB, and it is how a CUDA library built on
a GPU-less machine is run on a GPU machine that has no TVM.

``tvm_ffi`` has a compiled Cython core per Python version: by default the installed one is copied (same
Python as here); for another Python pass that Python's ``apache-tvm-ffi`` wheel (``pip download
--python-version 3.12 --only-binary=:all: apache-tvm-ffi==<this version>``).
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from ..errors import TvmfuseError

# Parts of the installed tvm package a runtime-only process never reads.
SKIP = {"libtvm_compiler.so", "3rdparty", "src", "include", "__pycache__"}
# Pure-Python modules the runtime imports besides numpy (tvm_ffi's registry imports typing_extensions): copied
# into the bundle, so that a plain Python with numpy runs a library from it.
RUNTIME_DEPENDENCIES = ("typing_extensions",)


class BundleError(TvmfuseError):
    """The bundle could not be made (bad destination or ffi wheel)."""


def _ignore(_dir, names):
    return [n for n in names if n in SKIP]


def _ffi_from_wheel(wheel: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.startswith("tvm_ffi/") and "/include/" not in m]
            if not any(m.startswith("tvm_ffi/core.") for m in members):
                raise BundleError(f"{wheel}: not an apache-tvm-ffi wheel (no tvm_ffi/core.* inside)")
            archive.extractall(dest, members)
    except (OSError, zipfile.BadZipFile) as e:
        raise BundleError(f"{wheel}: cannot read the tvm_ffi wheel ({type(e).__name__}: {e})") from None


def _copy_module(name: str, dest: Path) -> None:
    """Copy the installed pure-Python module or package ``name`` into ``dest``."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise BundleError(f"the runtime needs {name}, which is not installed here: pip install {name}")
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        shutil.rmtree(dest / name, ignore_errors=True)
        shutil.copytree(origin.parent, dest / name, ignore=_ignore)
    else:
        shutil.copy2(origin, dest / origin.name)


def runtime_bundle(dest: str | Path, ffi_wheel: str | Path | None = None) -> dict:
    """Write a runtime-only bundle into ``dest`` (created; its ``tvm``, ``tvm_ffi``, ``tvmfuse`` and the
    :data:`RUNTIME_DEPENDENCIES` are replaced).

    Returns ``{"path", "bytes", "python"}`` where ``python`` is the Cython core's tag (``cpython-312`` ...).
    """
    import tvm
    import tvm_ffi

    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise BundleError(f"bundle destination {dest} exists and is not a folder")
    if ffi_wheel is not None and not Path(ffi_wheel).is_file():
        raise BundleError(f"tvm_ffi wheel not found: {ffi_wheel}")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tvm", "tvm_ffi", "tvmfuse"):
        shutil.rmtree(dest / name, ignore_errors=True)
    shutil.copytree(Path(tvm.__file__).parent, dest / "tvm", ignore=_ignore)
    shutil.copytree(Path(__file__).parents[1], dest / "tvmfuse", ignore=_ignore)  # the whole package
    if ffi_wheel is None:
        shutil.copytree(Path(tvm_ffi.__file__).parent, dest / "tvm_ffi", ignore=_ignore)
    else:
        _ffi_from_wheel(Path(ffi_wheel), dest)
    for name in RUNTIME_DEPENDENCIES:
        _copy_module(name, dest)
    cores = sorted(p.name for p in (dest / "tvm_ffi").glob("core.*.so"))
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    python = "-".join(cores[0].split(".")[1].split("-")[:2]) if cores else "unknown"
    return {"path": str(dest), "bytes": size, "python": python}
