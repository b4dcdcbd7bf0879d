"""Calibration driver: run the FP32 model on calibration batches and record the range of every tensor that
enters or leaves a partition (the tensors INT8 partitions quantize and dequantize).

How it runs: the partitioned module's ``main`` is rewritten to return the observed tensors (a tuple), then
lowered with the same fused kernels as a normal compile (``LowerPartitions``), built for a CPU target this
machine runs, and executed with the Relax VM once per batch; each returned array goes to its tensor's
calibrator. Returning the tensors (rather than the VM's instrument hook) keeps the mapping from tensor to key
exact even when one kernel serves several partitions or memory planning reuses buffers.

Tensor keys (:func:`tvmfuse.quant.keys.observed_tensors`, re-exported here) are what a later pass on the same
partitioned module recomputes to look up ranges in the :class:`~tvmfuse.quant.table.CalibrationTable`.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from .. import frontend, targets
from ..errors import TargetError
from ..tensors import TensorInfo
from .calibrate import create_calibrator
from .data import check_batch, load_calibration_data
from .keys import observed_tensors
from .table import CalibrationError, CalibrationTable

__all__ = ["calibrate_partitioned", "collect_ranges", "observation_module", "observed_tensors"]


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


def _build_observer(partitioned_mod, spec: targets.TargetSpec):
    """The VM running the observation module, and the keys of what it returns (None when nothing to observe)."""
    import tvm
    from tvm import relax

    from ..export import build
    from ..passes.lower import LowerPartitions

    mod, keys = observation_module(partitioned_mod)
    if not keys:
        return None, keys
    with spec.tvm_target(), tvm.transform.PassContext(opt_level=3):
        lowered = LowerPartitions(spec)(mod)
    executable, _ = build(lowered, spec)
    return relax.VirtualMachine(executable, tvm.cpu()), keys


def _check_target(target) -> targets.TargetSpec:
    spec = targets.resolve(target)
    if not spec.is_cpu:
        raise TargetError(f"calibration runs the FP32 model on this CPU; target {spec.name!r} is not a CPU target "
                          "(use 'x86-host')")
    if not targets.host_can_run(spec):
        raise TargetError(f"calibration runs the FP32 model here, but this CPU lacks "
                          f"{', '.join(targets.missing_host_features(spec))} needed by target {spec.name!r} "
                          "(use 'x86-host')")
    return spec


def _checked_batches(batches, inputs: Sequence[TensorInfo]) -> list[dict[str, np.ndarray]]:
    if isinstance(batches, (str, os.PathLike)):
        return load_calibration_data(batches, inputs)
    batches = list(batches)
    if not batches:
        raise CalibrationError("empty calibration set: no batches were given")
    return [check_batch(b, inputs, f"calibration batch {i}") for i, b in enumerate(batches)]


def calibrate_partitioned(partitioned_mod, inputs: Sequence[TensorInfo], batches, method: str = "minmax",
                          target="x86-host", source: str = "", **options) -> CalibrationTable:
    """Calibrate a module that is already partitioned (``PassRecord.partitioned``).

    Parameters are those of :func:`collect_ranges`, with ``inputs`` the model's inputs (``main``'s
    parameters in order) and ``source`` the model's origin recorded in the table.
    """
    import tvm

    spec = _check_target(target)
    first = create_calibrator(method, **options)  # bad method/options fail before anything is built
    params = partitioned_mod["main"].params
    if len(params) != len(inputs):
        raise CalibrationError(f"the module's main takes {len(params)} input(s) {[p.name for p in params]}, "
                               f"but {len(inputs)} input(s) were described: {[i.name for i in inputs]}")
    batches = _checked_batches(batches, inputs)
    vm, keys = _build_observer(partitioned_mod, spec)
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
    from ..passes.pipeline import PassRecord, run_graph_passes

    spec = _check_target(target)
    create_calibrator(method, **options)
    imported = frontend.import_model(model, shapes)
    batches = _checked_batches(batches, imported.inputs)
    record = PassRecord()
    run_graph_passes(imported.mod, spec, spec.tvm_target(), record)
    return calibrate_partitioned(record.partitioned, imported.inputs, batches, method, spec, imported.source,
                                 **options)
