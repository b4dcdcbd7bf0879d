"""The Python API: ``compile`` an ONNX model into a :class:`CompiledModel`, run, benchmark, export."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from . import cache as kernel_cache
from .cache import hits
from . import cached_build, frontend, opcheck, targets
from .errors import InputError, TargetError
from .export import (build, build_fields, building, export_library, kernel_names, kernel_schedulers, kernel_source,
                     make_manifest, output_infos)
from .library_file import LibraryFile
from .passes.pipeline import PassRecord, run_graph_passes
from .progress import Steps
from .runtime import Runner, check_cpu_flags, random_inputs
from .tensors import TensorInfo

LAYOUTS = ("blocked", "nchw")  # compile(layout=...)
_RUNNER_LOCK = threading.Lock()  # guards CompiledModel._runner creation (rare; once per model)


class CompiledModel:
    """A model compiled for one target.

    Attributes
    ----------
    inputs, outputs : list of TensorInfo
        Names, static shapes and dtypes, in the model's order.
    target : TargetSpec
        The target the model was compiled for.
    mod : tvm.IRModule
        The Relax module after tvmfuse's graph passes (what was built).
    lowered : tvm.IRModule
        The module after the Relax pipeline; its PrimFuncs are the library's kernels.
    stats : dict
        Seconds spent per compile step.
    quantization : dict or None
        For models from :func:`quantize`: the method, options, table, and what became INT8 (manifest entry).
    """

    def __init__(self, executable, mod, lowered, spec: targets.TargetSpec, inputs: Sequence[TensorInfo],
                 outputs: Sequence[TensorInfo], source: str, stats: dict):
        self.executable, self.mod, self.lowered, self.target = executable, mod, lowered, spec
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.source, self.stats = source, stats
        self.record = PassRecord()
        self.tuning_logs: dict | None = None
        self.layout = "blocked"
        self.build_info: dict = {}  # the backend's manifest entries (CUDA: "cuda_code", see cuda_driver)
        self.quantization: dict | None = None
        self.precision = "fp32"  # of the float kernels: "fp16" for float16 tensors, float32 accumulation
        self.pinned: dict = {}  # inputs pinned at compile time (consts=): name -> {"shape", "dtype", "value"}
        self.cache_info: dict = {"model": "off", "kernels": 0, "from_cache": 0}  # what came from the cache
        self.kernel_info = {"kernels": kernel_names(lowered), "scheduled_by": kernel_schedulers(lowered)}
        self._library: LibraryFile | None = None  # the linked library (CPU targets): linked once, run, export
        self._runner: Runner | None = None

    @classmethod
    def from_cache(cls, library: LibraryFile, state: dict, spec: targets.TargetSpec, rebuild) -> "CompiledModel":
        """A model whose library came from the cache (loaded when it first runs; ``executable`` is None).
        ``mod``, ``lowered`` and ``record`` are rebuilt by ``rebuild()`` (a CompiledModel) when first read."""
        cm = cls.__new__(cls)
        cm.executable, cm.target, cm._library, cm._runner = None, spec, library, None
        cm.inputs = [TensorInfo.from_json(i) for i in state["inputs"]]
        cm.outputs = [TensorInfo.from_json(o) for o in state["outputs"]]
        cm.source, cm.stats, cm.pinned = state["source"], state["stats"], state["pinned"]
        cm.tuning_logs, cm.layout, cm.build_info = state["tuning_logs"], state["layout"], state["build_info"]
        cm.quantization, cm.precision = state["quantization"], state["precision"]
        cm.kernel_info = {"kernels": state["kernels"], "scheduled_by": state["scheduled_by"]}
        cm.cache_info = {"model": "hit", "kernels": len(state["kernels"]), "from_cache": len(state["kernels"])}
        cm._rebuild = rebuild
        return cm

    def __getattr__(self, name):
        # Only reached for attributes not set: the Relax modules of a model that came from the cache.
        rebuild = self.__dict__.get("_rebuild")
        if name in ("mod", "lowered", "record") and rebuild is not None:
            built = rebuild()
            self.mod, self.lowered, self.record = built.mod, built.lowered, built.record
            del self.__dict__["_rebuild"]
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def kernel_source(self, fmt: str = "asm") -> str:
        """The kernels' code as text: ``"asm"`` or ``"ll"`` on CPU targets, the CUDA source on CUDA targets
        (:func:`tvmfuse.export.kernel_source`)."""
        return kernel_source(self.lowered, self.target, fmt)

    def library_file(self) -> LibraryFile:
        """The shared library (CUDA's device code packed in), linked once."""
        if self._library is None:
            self._library = LibraryFile.link(self.executable)
        return self._library

    def library_bytes(self) -> bytes:
        """The shared library's bytes (see :meth:`library_file`)."""
        return self.library_file().read_bytes()

    def _get_runner(self) -> Runner:
        runner = self._runner
        if runner is None:
            with _RUNNER_LOCK:  # threads making the first call at once must share one Runner
                if self._runner is None:
                    check_cpu_flags(targets.required_cpu_flags(self.target),
                                    f"model compiled for {self.target.name} ({self.target.config.get('mcpu')})")
                    backend = self.target.backend()
                    if backend.device == "cpu" and not backend.can_run():  # another CPU's code: never executed
                        raise TargetError(f"model compiled for {self.target.name} cannot run here: "
                                          f"{backend.why_not_runnable()}")
                    # The executable where it was built here for a GPU (no copy of the library to load)
                    gpu_built = self.executable is not None and backend.device != "cpu"
                    module = self.executable if gpu_built else self.library_file().load()
                    self._runner = Runner(module, self.inputs, self.outputs,
                                          device=self.target.backend().device, pinned=self.pinned)
                runner = self._runner
        return runner

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run once on checked inputs; return the outputs as numpy arrays.

        With ``TVMFUSE_OPCHECK=1`` every partition is also checked against the unfused reference.
        """
        if opcheck.enabled() and self.target.backend().runs_on_this_cpu():
            return opcheck.run_checked(self, inputs)[0]
        return self._get_runner().run(inputs)

    def opcheck(self, inputs: Mapping[str, np.ndarray] | None = None, rtol: float = 1e-4, atol: float = 1e-4):
        """Check every partition against TVM's unfused path on ``inputs`` (seeded random by default).

        Returns the list of :class:`tvmfuse.opcheck.PartitionCheck`; raises ``OpCheckError`` at the first
        partition whose output differs beyond tolerance.
        """
        inputs = inputs if inputs is not None else random_inputs(self.inputs)
        return opcheck.run_checked(self, inputs, rtol=rtol, atol=atol)[1]

    def partition_report(self):
        """What the partitioner grouped and left out (see ``tvmfuse partition``)."""
        from .partition_report import build_report

        return build_report(self.record.partitioned, self.record.rejections, self.source, self.target.name,
                            self.mod)

    def benchmark(self, inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 50, warmup: int = 5) -> dict:
        """Median/min/max/mean latency in ms over ``repeat`` runs (seeded random inputs by default)."""
        return self._get_runner().benchmark(inputs, repeat=repeat, warmup=warmup)

    def manifest(self) -> dict:
        """The manifest :meth:`export` writes beside the library."""
        extra = build_fields(self.kernel_info, self.layout, self.precision, self.tuning_logs, self.build_info,
                             self.quantization, self.pinned)
        return make_manifest(self.target, self.inputs, self.outputs, self.source, extra)

    @building()
    def export(self, path: str | Path) -> Path:
        """Write the shared library ``path`` (.so) and its JSON manifest beside it."""
        library = self._library  # linked before (run, the cache): written as is; else linked straight to path
        return export_library(library if library is not None else self.executable, path, self.manifest())

    def __repr__(self) -> str:
        ins = ", ".join(str(i) for i in self.inputs)
        return f"CompiledModel({self.source!r}, target={self.target.name!r}, inputs=[{ins}])"


def _build_target(target, layout: str) -> targets.TargetSpec:
    """Resolve ``target``; a CPU target this machine cannot run says so now, not only when the library is run."""
    spec = targets.resolve(target)
    if layout not in LAYOUTS:
        raise InputError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    warning = spec.backend().build_warning()
    if warning:
        warnings.warn(warning, targets.ForeignTargetWarning, stacklevel=4)  # the caller of compile / quantize (past quiet_tvm_warnings' frame)
    return spec


@building()
def compile(model, target=targets.DEFAULT, shapes: Mapping[str, Sequence[int]] | None = None,
            progress: bool = False, logs=None, layout: str = "blocked", cuda_graph: bool = True,
            precision: str = "fp32", consts: Mapping[str, object] | None = None, cache=None,
            whole: bool = True) -> CompiledModel:
    """Compile an ONNX model for a target.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        A path to an ``.onnx`` file, a ModelProto, or ``"zoo:NAME"`` for a built-in model.
    target : str, dict or TargetSpec
        A registered name (``tvmfuse.targets.names()``) or a raw TVM target dict.
    shapes : dict, optional
        Static shapes for inputs with dynamic dims, e.g. ``{"input": (1, 3, 224, 224)}``.
    progress : bool
        Print one line per compile step on stderr.
    logs : str, os.PathLike, None or False
        Tuning logs to apply: a logs folder (its ``<target>/`` subfolder is read), None for the default
        (``$TVMFUSE_TUNING_LOGS`` or the repository's ``tuning_logs/``), False for none. Bad lines are
        skipped with a warning; the manifest records the folder and the kernels tuned records scheduled.
    layout : str
        Activation layout between conv partitions on CPU targets: ``"blocked"`` (NCHW[b]c, b the vector
        width; layout transforms only where a plain tensor is needed) or ``"nchw"`` (every kernel NCHW).
    cuda_graph : bool
        CUDA targets: capture the model's kernel launches in a CUDA graph on the first run and replay it after
        (on by default; the manifest's ``cuda_graph`` says which). Other targets ignore it.
    precision : str
        ``"fp32"``, or ``"fp16"`` where the target's backend builds it (CUDA): weights and activations in
        float16, every conv and matmul accumulating in float32, Softmax/LayerNorm/means in float32; inputs and
        outputs stay float32. The manifest records it.
    consts : dict, optional
        Inputs fixed wherever the model is deployed, pinned to a value (``{"sr": 16000}``): folded like weights,
        so an ``If`` branching on them keeps only the branch taken. The library has no such input; the
        manifest records the values, and a run given the input with another value is refused.
    cache : None, False or str / os.PathLike
        The kernel cache (:mod:`tvmfuse.cache`): None the default folder (``$TVMFUSE_CACHE_DIR``, else
        ``~/.cache/tvmfuse/kernels``; off with ``$TVMFUSE_NO_CACHE=1``), False none, or a folder. Kernels
        built before are reused, and a model compiled before with the same options returns its stored library
        (``cache_info`` says what came from it).
    whole : bool
        Whether a whole build may come from (and go to) the cache; False reuses kernels only.

    Returns
    -------
    CompiledModel
    """
    spec = _build_target(target, layout)
    _check_precision(spec, precision)
    graph = _graph_capture(spec, cuda_graph)
    store = kernel_cache.resolve(cache)
    consts_digest = cached_build.consts_digest(consts)
    digest = cached_build.model_digest(store if whole else None, model)
    key = digest and cached_build.whole_key(store, model, spec, logs, {
        "shapes": shapes, "consts": consts_digest, "layout": layout, "precision": precision, "graph": graph}, digest)
    request = key and hits.request_key(digest, target, hits.request_options(shapes, consts_digest, layout, precision,
                                                                             cuda_graph, logs))
    found = cached_build.lookup(store, key, progress) if key else None
    if found:
        cached_build.remember(store, request, key, spec, logs)
        return CompiledModel.from_cache(*found, spec, lambda: compile(
            model, spec, shapes, False, logs, layout, cuda_graph, precision, consts, cache=store, whole=False))
    steps = Steps(3, enabled=progress)
    with steps.step("import ONNX"):
        imported = frontend.import_model(model, shapes, consts=consts, **frontend.target_options(spec.backend()))
    cm = _compile_imported(imported, spec, steps, logs, layout=layout, cuda_graph=cuda_graph, precision=precision,
                           cache=store if store is not None else False)
    if key:
        cached_build.save(store, key, cm)
        cached_build.remember(store, request, key, spec, logs)
    return cm


def _check_precision(spec: targets.TargetSpec, precision) -> None:
    known = spec.backend().precisions
    if precision not in targets.PRECISIONS:
        raise InputError(f"precision {precision!r} is not one of {', '.join(targets.PRECISIONS)}")
    if precision not in known:
        raise InputError(f"precision {precision} is not built for target {spec.name} (backend "
                         f"{spec.backend().name}: {', '.join(known)})")


def _graph_capture(spec: targets.TargetSpec, asked: bool) -> bool:
    """Whether the build captures its launches in a graph: asked, and the backend can (a graph replays fixed
    allocations: every tvmfuse model has static shapes, the import fixes them)."""
    if not isinstance(asked, bool):
        raise InputError(f"cuda_graph must be True or False, got {asked!r}")
    return asked and spec.backend().captures_graphs


def _compile_imported(imported, spec: targets.TargetSpec, steps: Steps, logs, quantizer=None,
                      layout: str = "blocked", cuda_graph: bool = True, precision: str = "fp32",
                      cache=None) -> CompiledModel:
    """Partition (and quantize, with ``quantizer``), build; the steps after the import."""
    tvm_target, record, store = spec.tvm_target(), PassRecord(), kernel_cache.resolve(cache)
    lowered_kernels = kernel_cache.LoweredKernels(store, tvm_target)
    with steps.step("partition and fuse" if quantizer is None else quantizer.step_name()):
        mod = run_graph_passes(imported.mod, spec, tvm_target, record, quantize=quantizer,
                               blocked=layout == "blocked", precision=precision, make=lowered_kernels.maker)
    lowered_kernels.log()
    database, log_info = cached_build.load_logs(logs, spec)
    graph = _graph_capture(spec, cuda_graph)
    build_info = spec.backend().build_info(graph)
    applied: list[str] = []
    with steps.step(f"build for {spec.name}"):
        executable, lowered, kernel_stats = build(mod, spec, database, applied, graph, cache, lowered_kernels.keys)
    outputs = output_infos(mod, [o.name for o in imported.outputs])
    cm = CompiledModel(executable, mod, lowered, spec, imported.inputs, outputs, imported.source, steps.times)
    cm.pinned, cm.record, cm.layout, cm.build_info = dict(imported.pinned), record, layout, build_info
    cm.precision = precision
    cm.cache_info = {"model": "off" if store is None else "miss", **kernel_stats.to_json()}
    if log_info is not None:
        cm.tuning_logs = dict(log_info, applied=applied)
    return cm


@building()
def quantize(model, calib=None, method: str = "entropy", target=targets.DEFAULT, table=None,
             shapes: Mapping[str, Sequence[int]] | None = None, percentile: float = 99.99, progress: bool = False,
             logs=None, layout: str = "blocked", preprocess=None, consts: Mapping[str, object] | None = None,
             cache=None, whole: bool = True, weight_bits: int | None = None, cuda_graph: bool = True) -> CompiledModel:
    """Quantize an FP32 ONNX model to INT8 and compile it for a target.

    Calibration runs the FP32 model on this CPU (target ``x86-host``, whatever ``target`` is) and records
    the range of every partition input and output; ``QuantizeGraph`` then turns the conv2d, depthwise
    conv2d and dense partitions into INT8 kernels. Partitions without an INT8 kernel stay FP32; a model
    with nothing quantizable compiles as FP32 with a warning.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        As for :func:`compile`.
    calib : str, os.PathLike, dict, iterable of dict or None
        Calibration data (:mod:`tvmfuse.quant.data`): an ``.npz`` with one array per input, axis 0 the samples
        and each sample the input's shape without its batch axis; a directory of ``.npy`` files; a directory
        of images (JPEG, PNG, ...) with ``preprocess``; ``"random:N"`` (N seeded random batches, with a
        warning: a quick check, not a library to ship); or batches (input name -> array). None: use ``table``.
    method : str
        ``"minmax"``, ``"entropy"`` or ``"percentile"``.
    target : str, dict or TargetSpec
        The compile target.
    table : CalibrationTable, str, os.PathLike or None
        Without ``calib``: the calibration table to use, or the path of one to load. With ``calib``: where
        to write the new table (JSON, atomically).
    shapes : dict, optional
        Static shapes for inputs with dynamic dims.
    percentile : float
        The percentile kept by the ``"percentile"`` method.
    progress : bool
        Print one line per step on stderr.
    logs : str, os.PathLike, None or False
        Tuning logs, as for :func:`compile`.
    layout : str
        As for :func:`compile`; ``"blocked"`` also keeps the uint8 activations between INT8 conv kernels
        NCHW16c (16 channels of a pixel in 16 bytes), ``"nchw"`` passes them NCHW.
    preprocess : str or tvmfuse.quant.images.Preprocess, optional
        With a directory of images: how an image becomes an input, as the model was trained: a preset
        (``"imagenet"``, ``"unit"``, ``"symmetric"``, ``"raw"``) or a Preprocess (mean, std, layout, ...).
    consts : dict, optional
        Pinned inputs, as for :func:`compile` (calibration data then leaves them out).
    cache, whole
        As for :func:`compile`. A whole build is reused when the calibration source is the same: a table (or
        its file's content), or data given as a file, a folder, ``random:N`` or batches (with the same
        method and options); not for data from an iterator, nor when a new table is written.
    weight_bits : int, optional
        7 or 8: conv and dense weights quantized to [-64, 64] or [-127, 127] per output channel. None: 7 on
        a target without VNNI (whose INT8 kernels then add product pairs in int16, 1.2-1.6x faster than with
        8 bits there, at some cost in accuracy; onnxruntime's ``reduce_range``), 8 elsewhere.
    cuda_graph : bool
        As for :func:`compile`.

    Returns
    -------
    CompiledModel
        Its ``quantization`` dict (also in the manifest) holds the method, options, table path and what
        ``QuantizeGraph`` did (INT8 / FP32 partition counts, why partitions stayed FP32, quantize and
        dequantize ops inserted).

    Raises
    ------
    CalibrationError
        No data and no table, an unknown method, calibration data that does not fit the model's inputs
        (``CalibrationDataError``), an empty set, a corrupt table.
    """
    from .calibration import Quantizer

    spec = _build_target(target, layout)
    store, graph = kernel_cache.resolve(cache), _graph_capture(spec, cuda_graph)
    quantizer = Quantizer(spec, calib, method, table, percentile, layout == "blocked", preprocess, weight_bits,
                          cache=store if store is not None else False)
    source = cached_build.quantize_digest(calib, table, preprocess) if whole else None
    consts_digest, digest = cached_build.consts_digest(consts), cached_build.model_digest(source and store, model)
    key = digest and cached_build.whole_key(store, model, spec, logs, {
        "calibration": source, "method": method, "percentile": percentile, "shapes": shapes, "graph": graph,
        "consts": consts_digest, "layout": layout, "weight_bits": quantizer.weight_bits}, digest)
    request = key and hits.request_key(digest, target, hits.quantize_options(hits.request_options(
        shapes, consts_digest, layout, "int8", cuda_graph, logs), source, method, percentile, weight_bits))
    found = cached_build.lookup(store, key, progress) if key else None
    if found:
        cached_build.remember(store, request, key, spec, logs)
        return CompiledModel.from_cache(*found, spec, lambda: quantize(
            model, calib, method, spec, table, shapes, percentile, False, logs, layout, preprocess, consts,
            cache=store, whole=False, weight_bits=weight_bits, cuda_graph=cuda_graph))
    steps = Steps(3, enabled=progress)
    with steps.step("import ONNX"):
        imported = frontend.import_model(model, shapes, consts=consts, **frontend.target_options(spec.backend()))
    quantizer.prepare(imported.inputs, imported.source)
    cm = _compile_imported(imported, spec, steps, logs, quantizer, layout=layout, cuda_graph=cuda_graph,
                           cache=store if store is not None else False)
    cm.quantization = quantizer.manifest_entry()
    if key:
        cached_build.save(store, key, cm)
        cached_build.remember(store, request, key, spec, logs)
    caution = spec.backend().int8_caution(quantizer.weight_bits)
    if caution:  # said once the library exists: bad input gets its one-line error alone
        warnings.warn(caution, stacklevel=3)  # the caller of quantize (past quiet_tvm_warnings' frame)
    return cm
