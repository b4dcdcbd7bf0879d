"""Importing TVM's tensor intrinsics (modules that parse TVMScript at import time) without their toll.

``import tvm.s_tir.tensor_intrin`` registers the intrinsics of every GPU and DSP TVM supports (30-60 s on a
2-core machine); :func:`light_tensor_intrin` makes it load only those a backend needs.

TVM's ``@T.prim_func`` calls ``inspect.stack()``, which reads a line of source for every frame on the stack.
For the frames of Python's frozen import machinery (``<frozen importlib._bootstrap>``: every frame of an
``import``) ``inspect.getmodule`` finds no file and scans all of ``sys.modules`` on each call. Importing
``tvm.s_tir.tensor_intrin.cuda`` parses ~500 functions that way: 20 s on a 2-core Zen 4 with tvmfuse loaded
(1,279 modules), 4.7 s with the frozen modules entered in ``inspect``'s file cache first. The entry gives
the answer the scan gives (no source), so nothing else changes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types

INTRIN = "tvm.s_tir.tensor_intrin"


def _note_frozen_modules() -> None:
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.origin == "frozen":
            inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)


def import_module(name: str):
    """``importlib.import_module(name)``, with the frozen import frames known to ``inspect`` first."""
    if name not in sys.modules:
        _note_frozen_modules()
    return importlib.import_module(name)


def light_tensor_intrin(backend: str) -> None:
    """Make ``import tvm.s_tir.tensor_intrin`` load only the intrinsics ``backend`` needs
    (``Backend.tensor_intrin``).

    The package is put in ``sys.modules`` as a namespace over the real folder, so any other intrinsic module
    can still be imported explicitly (``import tvm.s_tir.tensor_intrin.arm_cpu``). A no-op once the real
    package is loaded.
    """
    if INTRIN not in sys.modules:
        importlib.import_module("tvm.s_tir")  # the parent package must exist first
        spec = importlib.util.find_spec(INTRIN)
        package = types.ModuleType(INTRIN, "tvmfuse: tensor intrinsics loaded on demand")
        package.__path__ = list(spec.submodule_search_locations)
        package.__package__ = INTRIN
        sys.modules[INTRIN] = package
    from .targets import backend_class

    package = sys.modules[INTRIN]
    for name in backend_class(backend).tensor_intrin:
        setattr(package, name, import_module(f"{INTRIN}.{name}"))
