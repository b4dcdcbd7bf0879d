"""Run compiled models: input checks, execution and timing on the TVM runtime alone.

Nothing here imports the TVM compiler (``tvm.relax``), so an exported library can be loaded and run in a
process started with ``TVM_USE_RUNTIME_LIB=1``, where only ``libtvm_runtime`` is mapped.
"""

from __future__ import annotations

import os
import statistics
import threading
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .. import cuda_driver, threads
from . import governor
from ..errors import InputError, ModelLoadError, TargetError
from .integrity import MANIFEST_VERSION, read_checked_manifest  # noqa: F401 - MANIFEST_VERSION re-exported
from ..tensors import TensorInfo, random_inputs  # noqa: F401 - random_inputs: runtime.random_inputs for callers
from ..targets import host_cpu_flags
from .tvm_log import quiet_tvm_warnings


# TVM's thread pool assumes hyper-threading and uses half the CPUs it sees (1 of 2 here, halving speed), and
# sees neither the affinity mask nor a cgroup quota. Every path that runs a kernel (compile's checks, calibration,
# tuning workers, loading a library) imports this module first, and the pool reads the variable when first used;
# a value the user set wins.
threads.configure()


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


def cuda_runtime() -> None:
    """Map TVM's CUDA runtime before a CUDA library is mapped (:func:`tvmfuse.cuda_driver.map_runtime`).

    Raises
    ------
    ModelLoadError
        The library is missing or cannot be mapped (no NVIDIA driver: it links ``libcuda.so.1``).
    """
    try:
        cuda_driver.map_runtime()
    except OSError as e:
        first = str(e).splitlines()[0]
        raise ModelLoadError(f"cannot load TVM's CUDA runtime libtvm_runtime_cuda.so: {first}") from None


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


def _check_pinned(name: str, given, pinned: Mapping) -> None:
    """An input pinned at compile time (``consts=`` / ``--const``) may be given only with its pinned value."""
    want = np.asarray(pinned["value"], dtype=pinned["dtype"]).reshape(pinned["shape"])
    got = np.asarray(given)
    if got.shape != want.shape or not np.array_equal(got, want):
        shown = want.ravel().tolist() if want.size <= 8 else f"an array of shape {want.shape}"
        raise InputError(f"input {name!r} was pinned to {shown} when the model was compiled (--const); "
                         f"a run cannot change it (got {got.ravel().tolist()[:8]})")


def check_inputs(inputs: Mapping[str, np.ndarray], expected: Sequence[TensorInfo],
                 pinned: Mapping[str, Mapping] | None = None) -> list[np.ndarray]:
    """Check names, shapes and dtypes of ``inputs``; return the arrays in the model's input order. An input
    ``pinned`` at compile time may be given with its pinned value (and is then ignored), not another.

    Raises
    ------
    InputError
        Naming the missing or unknown input, or the expected and given shape/dtype, or a pinned input's
        other value.
    """
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a dict of name -> numpy array, got {type(inputs).__name__}")
    want = {i.name: i for i in expected}
    described = ", ".join(f"{i.name!r} {tuple(i.shape)} {i.dtype}" for i in expected)
    for name in set(inputs) & set(pinned or {}) - set(want):
        _check_pinned(name, inputs[name], pinned[name])
    missing = [n for n in want if n not in inputs]
    unknown = [n for n in inputs if n not in want and n not in (pinned or {})]
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
        # np.ascontiguousarray would make a scalar (0-d) input 1-d, which the VM refuses
        arrays.append(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))
    return arrays


def _flatten(result) -> list:
    import tvm

    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    items = []
    for r in result:
        items.extend(_flatten(r))
    return items


class Runner:
    """Runs the ``main`` function of a Relax VM library with checked inputs, from any number of threads.

    A Relax ``VirtualMachine`` keeps per-call state (register file, call frames, instrument), so one VM
    must never run in two threads at once: shared, concurrent calls corrupted each other (wrong register
    indices, mismatched arguments, segfaults). Each thread that calls :meth:`run` or :meth:`benchmark`
    therefore gets its own VM, created on its first call and kept in a ``threading.local``; the library
    (kernels and weights) is loaded once and shared by all of them. A thread's VM is released when the
    thread exits (or with the runner), so short-lived threads do not accumulate VMs.

    Costs (rough, measured on a 2-core x86 machine while another job was running):

    - a new VM is about 0.1-0.3 ms for ``zoo:tiny_convnet`` and 0.3-0.8 ms for ``zoo:resnet50``, once per
      thread (VM creation holds a lock: it looks kernels up in the shared library's modules, which
      are not all documented as safe to query from several threads at once);
    - per call, the thread-local lookup of the thread's ``main`` is about 0.1 us, less than the
      ``vm["main"]`` module lookup it replaces (about 2 us), so a single thread runs as fast as before;
    - the alternative, a lock around one shared VM, costs about 0.5 us uncontended but serialises all
      callers: 8 threads on one model were no faster with it, often several times slower.

    On CPU the VMs share the library's constant tensors (weights), so an extra VM costs only its frames.
    On CUDA each VM copies the model's constants to the GPU when it is created, so GPU memory for weights
    grows with the number of threads that call the model: serve it from a bounded pool of threads. TVM's
    CPU thread pool is per calling thread: N threads running at once each launch parallel kernels on
    every core (results stay exact; lower ``TVM_NUM_THREADS`` to avoid oversubscription), and each
    calling thread has its own :class:`tvmfuse.runtime.governor.Governor`, which moves that thread's calls to
    one pool thread while the cores are contended. A thread's first call starts its pool (about 1 ms,
    rough), and after the thread exits the pool's workers spin ``TVM_THREAD_POOL_SPIN_COUNT`` times
    (``sched_yield``; tvmfuse sets 10,000, TVM's own default is 300,000: about 0.5 s) before they end,
    far longer with the machine fully loaded. Serve from long-lived threads, not a new thread per
    request.

    Parameters
    ----------
    library : tvm.runtime.Module or Executable
        A loaded library or a freshly compiled executable.
    inputs, outputs : list of TensorInfo
        The model's inputs (in call order) and outputs.
    device : str
        ``"cpu"`` or ``"cuda"``.
    pinned : dict, optional
        Inputs pinned at compile time (``consts=``): name -> ``{"shape", "dtype", "value"}``.
    """

    def __init__(self, library, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo], device: str = "cpu",
                 pinned: Mapping[str, Mapping] | None = None):
        import tvm

        self.inputs = list(inputs)
        self.pinned = dict(pinned or {})
        self.outputs = list(outputs)
        self.device_name = device
        self._dev = _device(device)
        if isinstance(library, tvm.runtime.Executable):
            library = library.jit()  # once, here: jit is not thread-safe, and every VM shares its module
        self._library = library
        self._local = threading.local()  # .vm, .main: the calling thread's VM and its "main"
        self._create_lock = threading.Lock()
        self._thread_vm()  # this thread's VM now, so a library that cannot run fails in the constructor

    def _thread_vm(self):
        """The calling thread's VirtualMachine, created on its first use."""
        local = self._local
        try:
            return local.vm
        except AttributeError:
            pass
        from tvm.runtime.vm import VirtualMachine

        with self._create_lock:
            vm = VirtualMachine(self._library, self._dev)
            main = vm["main"]
        local.vm, local.main, local.governor = vm, main, self._new_governor()
        return vm

    def _new_governor(self):
        """The calling thread's pool-size governor (CPU, several threads, not ``TVMFUSE_THREADS=fixed``)."""
        if self.device_name != "cpu" or not governor.enabled():
            return None
        import tvm

        try:
            full = int(os.environ.get("TVM_NUM_THREADS", ""))
        except ValueError:  # unset or not a number (TVM reads it with atoi): ask the pool
            full = tvm.runtime.num_threads()
        if full <= 1:
            return None
        return governor.Governor(full, tvm.get_global_func("runtime.config_threadpool"))

    @property
    def _vm(self):
        """The calling thread's VM (e.g. for ``set_instrument``; it affects this thread's calls only)."""
        return self._thread_vm()

    def _to_device(self, inputs: Mapping[str, np.ndarray]) -> list:
        """The checked inputs copied into the calling thread's input tensors, allocated on its first call and
        reused after: a fresh tensor per input and call cost ~15 us each (allocate, copy, free), which on a
        model of a few dozen microseconds (Silero VAD: 29 us in the VM) was a third of ``run``."""
        import tvm

        arrays = check_inputs(inputs, self.inputs, self.pinned)
        local = self._local
        tensors = getattr(local, "inputs", None)
        if tensors is None:
            tensors = local.inputs = [tvm.runtime.empty(a.shape, str(a.dtype), self._dev) for a in arrays]
            # on the CPU, numpy views of the tensors: a copy into one costs 0.4 us, ``copyfrom`` 6 us
            local.views = [np.from_dlpack(t) for t in tensors] if self.device_name == "cpu" else None
        if local.views is not None:
            for view, array in zip(local.views, arrays):
                np.copyto(view, array)
        else:
            for tensor, array in zip(tensors, arrays):
                tensor.copyfrom(array)
        return tensors

    def _outputs(self, result) -> list[np.ndarray]:
        """The VM's outputs as numpy arrays of their own: on the CPU copied through a DLPack view (Tensor.numpy
        took 8 us an output, a quarter of a small model's call); never a view, since an output may be the
        reused input tensor or a constant of the library."""
        tensors = _flatten(result)
        if self.device_name == "cpu":
            return [np.from_dlpack(t).copy() for t in tensors]
        return [t.numpy() for t in tensors]

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run the model once; return its outputs as numpy arrays, in the model's output order.

        Safe to call from several threads at once (each runs on its own VM).
        """
        args = self._to_device(inputs)
        local = self._local
        try:
            main, gov = local.main, local.governor
        except AttributeError:
            self._thread_vm()
            main, gov = local.main, local.governor
        if gov is None:
            return self._outputs(main(*args))
        started = gov.start()
        out = main(*args)
        gov.done(started)
        return self._outputs(out)

    def run_whole_pool(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """:meth:`run` on the whole thread pool, the governor neither consulted nor told: for profiling, where
        an instrument hook slows every call, which the governor would judge as contention (and move the
        thread to one pool thread, so the profile would time another configuration than the model runs)."""
        args = self._to_device(inputs)
        self._thread_vm()
        local = self._local
        if local.governor is not None:
            local.governor.use_whole_pool()
        return self._outputs(local.main(*args))

    def benchmark(self, inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 50,
                  warmup: int = 5) -> dict:
        """Time ``repeat`` runs after ``warmup`` runs; return median/min/max/mean and the 10th / 90th
        percentiles in milliseconds, and ``spread``: (p90 - p10) / median.

        Runs on the calling thread's VM, so other threads may keep calling :meth:`run` meanwhile (their
        load then shows in the times).
        """
        if repeat < 1 or warmup < 0:
            raise InputError(f"benchmark needs repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
        args = self._to_device(inputs if inputs is not None else random_inputs(self.inputs))
        vm = self._thread_vm()
        main = self._local.main
        for _ in range(warmup):
            main(*args)
        timer = vm.time_evaluator("main", self._dev, number=1, repeat=repeat)
        times = [t * 1e3 for t in timer(*args).results]
        return timing_summary(times) | {"repeat": repeat, "warmup": warmup}


def timing_summary(times_ms: Sequence[float]) -> dict:
    """Median, min, max, mean, 10th and 90th percentile of ``times_ms``, and ``spread`` = (p90 - p10) / median."""
    ordered = sorted(times_ms)

    def percentile(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    median = statistics.median(ordered)
    p10, p90 = percentile(0.1), percentile(0.9)
    return {"median_ms": median, "min_ms": ordered[0], "max_ms": ordered[-1], "mean_ms": statistics.fmean(ordered),
            "p10_ms": p10, "p90_ms": p90, "spread": (p90 - p10) / median if median > 0 else 0.0}


class LoadedModel(Runner):
    """A library exported by tvmfuse, loaded with the TVM runtime only (see :func:`load`)."""

    def __init__(self, path: str | Path, device: str = "cpu"):
        path = Path(path)
        # Before anything native is mapped: the library is the file export wrote (size, sha256) and the
        # manifest is unedited (digest) and well-formed; see tvmfuse.runtime.integrity.
        self.manifest = read_checked_manifest(path, manifest_path(path))
        inputs = [TensorInfo.from_json(d) for d in self.manifest["inputs"]]
        outputs = [TensorInfo.from_json(d) for d in self.manifest["outputs"]]
        target = self.manifest.get("target", {}).get("config", {})
        if device == "cpu":
            device = self.manifest.get("device", "cpu")  # a CUDA library selects "cuda" itself
        check_cpu_flags(self.manifest.get("cpu_flags", []), f"{path} (target {target})")
        import tvm  # only now: a file that fails the checks above never costs TVM's import

        if device in ("cuda", "gpu"):
            cuda_runtime()
        try:
            with quiet_tvm_warnings():  # "Scope Loaded:" per weight of a library exported after a run
                library = tvm.runtime.load_module(str(path))
        except Exception as e:  # noqa: BLE001 - the loader raises RuntimeError/TVMError with long texts
            first = str(e).strip().splitlines()
            raise ModelLoadError(f"{path}: cannot load library: {first[0] if first else type(e).__name__}") from None
        self.path = path
        super().__init__(library, inputs, outputs, device, self.manifest.get("pinned_inputs"))


def load(path: str | Path, device: str = "cpu") -> LoadedModel:
    """Load a library written by ``CompiledModel.export`` using the TVM runtime only.

    Parameters
    ----------
    path : str or Path
        The ``.so`` file; its manifest (same stem, ``.json``) must be beside it.
    device : str
        ``"cpu"`` or ``"cuda"`` (CUDA libraries select ``"cuda"`` themselves).

    Raises
    ------
    ModelLoadError
        One line naming the file and what is wrong: missing, not a regular file, a manifest that is not
        one or was edited after export, a library whose size or sha256 differs from its manifest (damaged
        or replaced). All checked before the library is mapped (:mod:`tvmfuse.runtime.integrity`).
    TargetError
        The library uses CPU features this machine lacks, or an unknown device.
    """
    return LoadedModel(path, device)
