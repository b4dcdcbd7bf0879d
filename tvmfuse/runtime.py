"""Run compiled models: input checks, execution and timing on the TVM runtime alone.

Nothing here imports the TVM compiler (``tvm.relax``), so an exported library can be loaded and run in a
process started with ``TVM_USE_RUNTIME_LIB=1``, where only ``libtvm_runtime`` is mapped.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .errors import InputError, ModelLoadError, TargetError
from .tensors import TensorInfo
from .targets import host_cpu_flags

MANIFEST_VERSION = 1


def manifest_path(library: str | Path) -> Path:
    """Where the JSON manifest of ``library`` lives: beside it, same stem, ``.json``."""
    return Path(library).with_suffix(".json")


def check_cpu_flags(required: Sequence[str], what: str) -> None:
    """Raise TargetError when this CPU lacks a flag that ``what`` was compiled to use (instead of SIGILL)."""
    have = host_cpu_flags()
    missing = sorted(set(required) - have) if have else []
    if missing:
        raise TargetError(f"{what} uses CPU features this machine lacks: {', '.join(missing)}; "
                          "compile for target 'x86-host' to run here")


def _device(name: str):
    import tvm

    if name == "cpu":
        return tvm.cpu(0)
    if name in ("cuda", "gpu"):
        dev = tvm.cuda(0)
        if not dev.exist:
            raise TargetError("device 'cuda' requested but no CUDA GPU is visible on this machine")
        return dev
    raise TargetError(f"unknown device {name!r}; use 'cpu' or 'cuda'")


def check_inputs(inputs: Mapping[str, np.ndarray], expected: Sequence[TensorInfo]) -> list[np.ndarray]:
    """Check names, shapes and dtypes of ``inputs``; return the arrays in the model's input order.

    Raises
    ------
    InputError
        Naming the missing or unknown input, or the expected and given shape/dtype.
    """
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a dict of name -> numpy array, got {type(inputs).__name__}")
    want = {i.name: i for i in expected}
    described = ", ".join(f"{i.name!r} {tuple(i.shape)} {i.dtype}" for i in expected)
    missing = [n for n in want if n not in inputs]
    unknown = [n for n in inputs if n not in want]
    if missing or unknown:
        what = []
        if missing:
            what.append(f"missing input(s) {missing}")
        if unknown:
            what.append(f"unknown input(s) {unknown}")
        raise InputError(f"{'; '.join(what)}; the model's inputs are {described}")
    arrays = []
    for info in expected:
        arr = inputs[info.name]
        if not isinstance(arr, np.ndarray):
            raise InputError(f"input {info.name!r} must be a numpy array, got {type(arr).__name__}")
        if tuple(arr.shape) != tuple(info.shape):
            raise InputError(f"input {info.name!r}: expected shape {tuple(info.shape)}, got {tuple(arr.shape)}")
        if arr.dtype != np.dtype(info.dtype):
            raise InputError(f"input {info.name!r}: expected dtype {info.dtype}, got {arr.dtype}")
        arrays.append(np.ascontiguousarray(arr))
    return arrays


def random_inputs(expected: Sequence[TensorInfo], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of the right shapes and dtypes (standard normal for floats, small ints otherwise)."""
    rng = np.random.default_rng(seed)
    out = {}
    for info in expected:
        dt = np.dtype(info.dtype)
        if dt.kind == "f":
            out[info.name] = rng.standard_normal(info.shape).astype(dt)
        elif dt.kind == "b":
            out[info.name] = rng.integers(0, 2, info.shape).astype(dt)
        else:
            out[info.name] = rng.integers(0, 8, info.shape).astype(dt)
    return out


def _flatten(result) -> list:
    import tvm

    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    items = []
    for r in result:
        items.extend(_flatten(r))
    return items


class Runner:
    """Runs the ``main`` function of a Relax VM library with checked inputs.

    Parameters
    ----------
    library : tvm.runtime.Module or Executable
        A loaded library or a freshly compiled executable.
    inputs, outputs : list of TensorInfo
        The model's inputs (in call order) and outputs.
    device : str
        ``"cpu"`` or ``"cuda"``.
    """

    def __init__(self, library, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], device: str = "cpu"):
        from tvm.runtime.vm import VirtualMachine

        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.device_name = device
        self._dev = _device(device)
        self._vm = VirtualMachine(library, self._dev)

    def _to_device(self, inputs: Mapping[str, np.ndarray]) -> list:
        import tvm

        return [tvm.runtime.tensor(a, self._dev) for a in check_inputs(inputs, self.inputs)]

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run the model once; return its outputs as numpy arrays, in the model's output order."""
        result = self._vm["main"](*self._to_device(inputs))
        return [t.numpy() for t in _flatten(result)]

    def benchmark(self, inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 50,
                  warmup: int = 5) -> dict:
        """Time ``repeat`` runs after ``warmup`` runs; return median/min/max/mean in milliseconds."""
        if repeat < 1 or warmup < 0:
            raise InputError(f"benchmark needs repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
        args = self._to_device(inputs if inputs is not None else random_inputs(self.inputs))
        for _ in range(warmup):
            self._vm["main"](*args)
        timer = self._vm.time_evaluator("main", self._dev, number=1, repeat=repeat)
        times = [t * 1e3 for t in timer(*args).results]
        return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
                "mean_ms": statistics.fmean(times), "repeat": repeat, "warmup": warmup}


class LoadedModel(Runner):
    """A library exported by tvmfuse, loaded with the TVM runtime only (see :func:`load`)."""

    def __init__(self, path: str | Path, device: str = "cpu"):
        import tvm

        path = Path(path)
        if not path.exists():
            raise ModelLoadError(f"compiled model not found: {path}")
        mpath = manifest_path(path)
        if not mpath.exists():
            raise ModelLoadError(f"{path}: manifest {mpath.name} is missing beside it (written by export)")
        try:
            self.manifest = json.loads(mpath.read_text())
            inputs = [TensorInfo.from_json(d) for d in self.manifest["inputs"]]
            outputs = [TensorInfo.from_json(d) for d in self.manifest["outputs"]]
        except (ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{mpath}: not a tvmfuse manifest ({type(e).__name__}: {e})") from None
        target = self.manifest.get("target", {}).get("config", {})
        if device == "cpu":
            device = self.manifest.get("device", "cpu")  # a CUDA library selects "cuda" itself
        check_cpu_flags(self.manifest.get("cpu_flags", []), f"{path} (target {target})")
        try:
            library = tvm.runtime.load_module(str(path))
        except Exception as e:  # noqa: BLE001 - the loader raises RuntimeError/TVMError with long texts
            first = str(e).strip().splitlines()
            raise ModelLoadError(f"{path}: cannot load library: {first[0] if first else type(e).__name__}") from None
        self.path = path
        super().__init__(library, inputs, outputs, device)


def load(path: str | Path, device: str = "cpu") -> LoadedModel:
    """Load a library written by ``CompiledModel.export`` using the TVM runtime only.

    Parameters
    ----------
    path : str or Path
        The ``.so`` file; its manifest (same stem, ``.json``) must be beside it.
    device : str
        ``"cpu"`` or ``"cuda"`` (CUDA libraries select ``"cuda"`` themselves).
    """
    return LoadedModel(path, device)
