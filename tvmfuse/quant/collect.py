"""Calibration driver: run the FP32 model on calibration batches and record the range of every tensor that
enters or leaves a partition (the tensors INT8 partitions quantize and dequantize).

How it runs: the partitioned module's ``main`` is rewritten to return the observed tensors (a tuple), then
lowered with the same fused kernels as a normal compile (``LowerPartitions``), built for a CPU target this
machine runs, and executed with the Relax VM once per batch; each returned array goes to its tensor's
calibrator. Returning the tensors (rather than the VM's instrument hook) keeps the mapping from tensor to key
exact even when one kernel serves several partitions or memory planning reuses buffers.

Tensor keys (:func:`observed_tensors`) are what a later pass on the same partitioned module recomputes
to look up ranges in the :class:`~tvmfuse.quant.table.CalibrationTable`.
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
from .table import CalibrationError, CalibrationTable


def _main_vars(func) -> list:
    """Parameters, then the variables bound at the top level of ``func``'s body, in program order."""
    variables = list(func.params)
    for block in func.body.blocks:
        variables.extend(binding.var for binding in block.bindings)
    return variables


def _var_keys(func) -> dict:
    """Var -> unique key: its name, or ``name#k`` for the k-th later var (k >= 1) with the same name."""
    seen: dict[str, int] = {}
    keys = {}
    for var in _main_vars(func):
        count = seen.get(var.name, 0)
        seen[var.name] = count + 1
        keys[var] = var.name if count == 0 else f"{var.name}#{count}"
    return keys


def _is_float_tensor(expr) -> bool:
    from tvm import relax

    return isinstance(expr.ty, relax.TensorType) and str(expr.ty.dtype).startswith(("float", "bfloat"))


def observed_tensors(partitioned_mod) -> list[tuple[str, object]]:
    """The tensors calibration observes in a partitioned module, as ``(key, relax.Var)`` in program order.

    Walking the top-level bindings of ``main`` in order, for each call to a partition function (see
    :func:`tvmfuse.passes.partition.is_partition`): every argument that is a variable (constants such as
    weights are left out), then the variable the call's result is bound to. Only floating-point tensors
    count, and each variable once.

    A key is the variable's ``name``; variables of ``main`` (parameters first, then bindings in program
    order) that repeat an earlier name get ``name#1``, ``name#2``, ... by their rank among the variables of
    that name. The keys depend only on the module, so a pass given the same partitioned module finds the
    same keys.

    Parameters
    ----------
    partitioned_mod : tvm.IRModule
        The module right after partitioning (``PassRecord.partitioned``).

    Returns
    -------
    list of (str, relax.Var)
    """
    import tvm
    from tvm import relax

    from ..passes.partition import is_partition

    func = partitioned_mod["main"]
    keys = _var_keys(func)
    observed, seen = [], set()

    def add(var):
        if isinstance(var, relax.Var) and var not in seen and _is_float_tensor(var):
            seen.add(var)
            observed.append((keys[var], var))

    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.GlobalVar)
                    and is_partition(partitioned_mod[call.op])):
                continue
            for arg in call.args:
                add(arg)
            add(binding.var)
    return observed


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
