"""The calibration driver behind ``tvmfuse.quantize``: run the FP32 model on calibration batches, record the
range of every tensor that enters or leaves a partition, and the quantize step of the compile
(:class:`Quantizer`: calibrate the partitioned FP32 model on this CPU, then ``QuantizeGraph``).

A workflow module: it lowers, builds and runs the FP32 model, so it sits beside :mod:`tvmfuse.api`, above the
passes; :mod:`tvmfuse.quant` (tables, parameters, calibrators, tensor keys) stays a leaf that imports no pass.

How the ranges are observed: the partitioned module's ``main`` is rewritten to return the observed tensors
(a tuple), then lowered with the same fused kernels as a normal compile (``LowerPartitions``), built for a
CPU target this machine runs, and executed with the Relax VM once per batch; each returned array goes to its
tensor's calibrator. Returning the tensors (rather than the VM's instrument hook) keeps the mapping from
tensor to key exact even when one kernel serves several partitions or memory planning reuses buffers. Tensor
keys (:func:`tvmfuse.quant.keys.observed_tensors`) are what ``QuantizeGraph`` recomputes on the same
partitioned module to look ranges up in the :class:`~tvmfuse.quant.table.CalibrationTable`.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Mapping, Sequence

from . import frontend, targets
from .errors import TargetError, spelled
from .export import build
from .passes.lower import LowerPartitions
from .passes.pipeline import PassRecord, run_graph_passes
from .passes.int8.kernels import WEIGHT_BITS, default_weight_bits, weight_packing
from .passes.int8.quantize import QuantizeGraph
from .quant.calibrate import create_calibrator
from .quant.data import CalibrationDataError, check_batch, load_calibration_data
from .quant.images import image_files, random_batches
from .quant.keys import observed_tensors
from .quant.table import CalibrationError, CalibrationTable
from .targets import TargetSpec
from .tensors import TensorInfo


def observation_module(partitioned_mod):
    """A copy of ``partitioned_mod`` whose ``main`` returns the observed tensors as a tuple.

    Returns
    -------
    mod : tvm.IRModule
        ``main`` returns the tensors of :func:`observed_tensors` in order (the model's own outputs are no
        longer returned unless observed); dead code is dropped later by ``LowerPartitions``.
    keys : list of str
        The key of each returned tensor.
    """
    import tvm
    from tvm import relax

    keys = [key for key, _ in observed_tensors(partitioned_mod)]
    # Dataflow variables cannot leave their block: unwrap the blocks, return the tensors, wrap them again.
    main = relax.transform.ToNonDataflow()(tvm.IRModule({"main": partitioned_mod["main"]}))["main"]
    mod = tvm.IRModule(dict(partitioned_mod.functions_items()))
    mod.update_func(mod.get_global_var("main"), main)
    observed = observed_tensors(mod)
    if [key for key, _ in observed] != keys:  # ToNonDataflow keeps names and order; a change is our bug
        raise RuntimeError(f"observed tensors changed when leaving dataflow: {keys} -> {[k for k, _ in observed]}")
    variables = [var for _, var in observed]
    body = relax.SeqExpr(main.body.blocks, relax.Tuple(variables))
    ret = tvm.ir.TupleType([var.ty for var in variables])
    mod.update_func(mod.get_global_var("main"), relax.Function(main.params, body, ret, main.is_pure, main.attrs))
    return relax.transform.ConvertToDataflow()(mod), keys


def _build_observer(partitioned_mod, spec: targets.TargetSpec, cache=None):
    """The VM running the observation module, and the keys of what it returns (None when nothing to observe);
    ``cache``: the kernel cache its kernels come from and go to (as :func:`tvmfuse.export.build` takes it)."""
    import tvm
    from tvm import relax

    from .cache import LoweredKernels, resolve

    mod, keys = observation_module(partitioned_mod)
    if not keys:
        return None, keys
    store = resolve(cache)
    lowered_kernels = LoweredKernels(store, spec.tvm_target())  # calibrating again: its kernels come back lowered
    with spec.tvm_target(), tvm.transform.PassContext(opt_level=3):
        lowered = LowerPartitions(spec, make=lowered_kernels.maker)(mod)
    lowered_kernels.log()
    executable, _, _ = build(lowered, spec, cache=cache, known=lowered_kernels.keys)
    return relax.VirtualMachine(executable, tvm.cpu()), keys


def _check_target(target) -> targets.TargetSpec:
    spec = targets.resolve(target)
    if not spec.backend().runs_on_this_cpu():
        missing = targets.missing_host_features(spec)
        why = (f"this CPU lacks {', '.join(missing)} needed by target {spec.name!r}" if missing
               else f"code for target {spec.name!r} does not run on this CPU")
        raise TargetError(f"calibration runs the FP32 model here, but {why} (use 'x86-host')")
    return spec


def _is_path(value) -> bool:
    return isinstance(value, (str, os.PathLike))


class RandomCalibrationWarning(UserWarning):
    """Calibrating on random data: the ranges, and so the accuracy, are not those of real inputs."""


RANDOM = "random:"


def calibration_batches(calib, inputs: Sequence[TensorInfo], preprocess=None) -> list[dict]:
    """Checked calibration batches from a path (``.npz``, a directory of ``.npy`` files or of images with
    ``preprocess``), ``"random:N"`` (N seeded random batches, with a warning), one batch dict, or batches.

    Raises
    ------
    CalibrationDataError
        Naming the input whose name, shape or dtype does not fit, or an empty set.
    """
    is_images = _is_path(calib) and Path(calib).is_dir() and bool(image_files(Path(calib)))
    if preprocess is not None and not is_images:
        raise CalibrationDataError(spelled("preprocess= applies to a folder of images given as calib=",
                                           "--preprocess, --mean, --std, --image-layout and --bgr apply to a folder "
                                           "of images given to --calib"))
    if isinstance(calib, str) and calib.startswith(RANDOM):
        count = calib[len(RANDOM):]
        if not count.isdigit() or int(count) < 1:
            raise CalibrationDataError(f"calibration data {calib!r}: random:N takes a whole number of batches N >= 1")
        warnings.warn(f"calibrating on {count} random batches: the ranges are not those of real inputs, so expect "
                      "a loss of accuracy; calibrate on real data for a library to ship", RandomCalibrationWarning,
                      stacklevel=5)  # the caller of tvmfuse.quantize (past prepare, quantize, its decorator)
        return random_batches(inputs, int(count))
    if _is_path(calib):
        return load_calibration_data(calib, inputs, preprocess)
    batches = [calib] if isinstance(calib, Mapping) else list(calib)
    if not batches:
        raise CalibrationDataError("empty calibration set: no batches were given")
    return [check_batch(batch, inputs, f"calibration batch {i}") for i, batch in enumerate(batches)]


def calibrate_partitioned(partitioned_mod, inputs: Sequence[TensorInfo], batches, method: str = "minmax",
                          target="x86-host", source: str = "", cache=None, **options) -> CalibrationTable:
    """Calibrate a module that is already partitioned (``PassRecord.partitioned``).

    Parameters are those of :func:`collect_ranges`, with ``inputs`` the model's inputs (``main``'s
    parameters in order), ``source`` the model's origin recorded in the table and ``cache`` the kernel cache
    of the observing build (:func:`tvmfuse.cache.resolve`'s argument: None the default one, False none).
    """
    import tvm

    spec = _check_target(target)
    first = create_calibrator(method, **options)  # bad method/options fail before anything is built
    params = partitioned_mod["main"].params
    if len(params) != len(inputs):
        raise CalibrationError(f"the module's main takes {len(params)} input(s) {[p.name for p in params]}, "
                               f"but {len(inputs)} input(s) were described: {[i.name for i in inputs]}")
    batches = calibration_batches(batches, inputs)
    vm, keys = _build_observer(partitioned_mod, spec, cache)
    if vm is None:
        return CalibrationTable({}, method, first.options(), source)
    calibrators = {key: create_calibrator(method, **options) for key in keys}
    for index, batch in enumerate(batches):
        results = vm["main"](*[tvm.runtime.tensor(batch[i.name]) for i in inputs])
        for key, value in zip(keys, results):
            try:
                calibrators[key].observe(value.numpy())
            except CalibrationError as e:
                raise CalibrationError(f"tensor {key!r}, calibration batch {index}: {e}") from None
    return CalibrationTable({key: cal.range() for key, cal in calibrators.items()}, method, first.options(), source)


def collect_ranges(model, batches, method: str = "minmax", target="x86-host",
                   shapes: Mapping[str, Sequence[int]] | None = None, **options) -> CalibrationTable:
    """Run the FP32 model on calibration batches; return the range of every partition input and output.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        A path to an ``.onnx`` file, a ModelProto, or ``"zoo:NAME"``.
    batches : str, os.PathLike or iterable of dict
        Calibration data: a path read by :func:`tvmfuse.quant.data.load_calibration_data`, or batches
        (input name -> array of the input's shape; float64 is cast to float32).
    method : str
        ``"minmax"``, ``"entropy"`` or ``"percentile"`` (:data:`tvmfuse.quant.calibrate.METHODS`).
    target : str, dict or TargetSpec
        A CPU target this machine can run; the FP32 model is executed with it.
    shapes : dict, optional
        Static shapes for inputs with dynamic dims.
    **options
        The method's options, e.g. ``percentile=99.9``.

    Returns
    -------
    CalibrationTable
        Ranges keyed as :func:`observed_tensors` names them; empty when the model has no partition.

    Raises
    ------
    CalibrationError
        Unknown method or option, bad or empty data (``CalibrationDataError``), non-finite activations.
    TargetError
        A target this CPU cannot run.
    """
    spec = _check_target(target)
    create_calibrator(method, **options)
    imported = frontend.import_model(model, shapes, **frontend.target_options(spec.backend()))
    batches = calibration_batches(batches, imported.inputs)
    record = PassRecord()
    run_graph_passes(imported.mod, spec, spec.tvm_target(), record, int8=True)
    return calibrate_partitioned(record.partitioned, imported.inputs, batches, method, spec, imported.source,
                                 **options)


# Calibration runs the FP32 model here, whatever the compile target (x86-avx512 code may not run here).
CALIBRATION_TARGET = "x86-host"


class Quantizer:
    """One quantization of one model: a table (given, loaded or calibrated) and the ``QuantizeGraph`` step.

    Parameters
    ----------
    spec : TargetSpec
        The compile target.
    calib : str, os.PathLike, dict, iterable of dict or None
        Calibration data; None to use ``table`` instead.
    method : str
        ``"minmax"``, ``"entropy"`` or ``"percentile"`` (when calibrating).
    table : CalibrationTable, str, os.PathLike or None
        Without ``calib``: the table to use (or the path of one to load). With ``calib``: a path the new
        table is written to.
    percentile : float
        The percentile of the ``"percentile"`` method.
    blocked : bool
        uint8 activations NCHW16c between INT8 kernels (``QuantizeGraph``'s ``blocked``).
    weight_bits : int or None
        ``QuantizeGraph``'s: 7 or 8 bits of conv and dense weights; None, 7 where the target has no VNNI.
    cache : Store, None or False
        The kernel cache of the FP32 build that observes the calibration data (False: none).

    Raises
    ------
    CalibrationError
        Neither calibration data nor a table, both data and a table object, an unknown method or bad
        options, a table file that is missing or corrupt.
    """

    def __init__(self, spec: TargetSpec, calib=None, method: str = "entropy", table=None,
                 percentile: float = 99.99, blocked: bool = True, preprocess=None, weight_bits: int | None = None,
                 cache=None):
        if calib is None and table is None:
            raise CalibrationError(spelled("quantize needs calibration data (calib=...) or a saved calibration "
                                           "table (table=...)", "quantize needs --calib DATA or --table TABLE"))
        if calib is not None and isinstance(table, CalibrationTable):
            raise CalibrationError("quantize got both calibration data and a CalibrationTable; pass one (with "
                                   "calibration data, table= may be a path to write the new table to)")
        if table is not None and not (_is_path(table) or isinstance(table, CalibrationTable)):
            raise CalibrationError(f"table must be a CalibrationTable or a path, got {type(table).__name__}")
        self.spec, self.calib, self.method, self.preprocess = spec, calib, method, preprocess
        if weight_bits not in (None, *WEIGHT_BITS):
            raise CalibrationError(spelled(f"weight_bits must be 7 or 8 (None: 7 on a target without VNNI), got "
                                           f"{weight_bits!r}", f"--weight-bits must be 7 or 8, got {weight_bits}"))
        self.weight_bits = weight_bits or default_weight_bits(weight_packing(spec))
        self.options = {"percentile": percentile} if method == "percentile" else {}
        if calib is not None:
            create_calibrator(method, **self.options)  # an unknown method fails before anything is built
        self.table_path = Path(table) if _is_path(table) else None
        self.table = table if isinstance(table, CalibrationTable) else None
        if calib is None and self.table is None:
            self.table = CalibrationTable.load(self.table_path)
        self.batches: list[dict] | None = None
        self.inputs: list[TensorInfo] = []
        self.source = ""
        self.report: dict = {}
        self.blocked, self.cache = blocked, cache

    def prepare(self, inputs: Sequence[TensorInfo], source: str) -> None:
        """Check the calibration data against the model's inputs (before anything is compiled)."""
        self.inputs, self.source = list(inputs), source
        if self.calib is not None:
            self.batches = calibration_batches(self.calib, self.inputs, self.preprocess)

    def step_name(self) -> str:
        """The compile step this quantizer runs in, for progress lines."""
        if self.calib is None:
            return "partition and quantize"
        return f"partition, calibrate ({self.method}, {len(self.batches or [])} batches) and quantize"

    def __call__(self, partitioned):
        """Calibrate the partitioned module if no table was given, then quantize it (``QuantizeGraph``)."""
        if self.table is None:
            if self.batches is None:
                raise RuntimeError("Quantizer.prepare must run before the quantize step")
            self.table = calibrate_partitioned(partitioned, self.inputs, self.batches, self.method,
                                               CALIBRATION_TARGET, self.source, self.cache, **self.options)
            if self.table_path is not None:
                self.table.save(self.table_path)
        return QuantizeGraph(self.table, self.spec, self.report, self.blocked, self.weight_bits)(partitioned)

    def manifest_entry(self) -> dict:
        """The manifest's ``quantization`` entry: how the table was made, and what QuantizeGraph did."""
        table = self.table
        entry = {"method": table.method if table else self.method,
                 "options": dict(table.options) if table else dict(self.options),
                 "table": str(self.table_path) if self.table_path is not None else None,
                 "calibrated": self.calib is not None,
                 "calibration_data": _describe_data(self.calib, self.preprocess),
                 "calibration_batches": len(self.batches) if self.batches is not None else None,
                 "weight_bits": self.weight_bits}
        entry.update(self.report)
        return entry


def _describe_data(calib, preprocess) -> str | None:
    """What the calibration data was, for the manifest: a path (with the images' preprocessing), random:N, or
    batches given in memory; None without data (a saved table)."""
    if calib is None:
        return None
    if isinstance(calib, str) and calib.startswith(RANDOM):
        return calib
    if _is_path(calib):
        return str(calib) + (f" (images, preprocess {preprocess})" if preprocess is not None else "")
    return "batches given in memory"
