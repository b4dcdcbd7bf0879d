"""Op-check mode (as MXNet's MXNET_MKLDNN_DEBUG=1): run every fused partition kernel, then the same
partition through TVM's unfused reference path on the very same inputs, and stop at the first partition
whose output differs beyond tolerance, naming it and the largest error.

Enable with ``TVMFUSE_OPCHECK=1`` (every ``CompiledModel.run`` is checked), ``tvmfuse compile --opcheck`` /
``tvmfuse partition --opcheck``, or call :func:`check` directly.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import numpy as np


from .errors import TargetError, TvmfuseError


class OpCheckError(TvmfuseError):
    """A fused partition's output differs from the unfused reference."""


@dataclasses.dataclass
class PartitionCheck:
    kernel: str
    partition: str
    max_abs_error: float
    max_abs_reference: float


def enabled() -> bool:
    """True when ``TVMFUSE_OPCHECK`` is set to a true value."""
    return os.environ.get("TVMFUSE_OPCHECK", "").lower() in ("1", "true", "yes", "on")


def _reference(fn, target):
    """The partition's Relax function compiled alone through TVM's default (legalize-only) path."""
    import tvm
    from tvm import relax

    plain = relax.Function(fn.params, fn.body, fn.ret_ty, is_pure=True).with_attr("global_symbol", "main")
    ex = tvm.compile(tvm.IRModule({"main": plain}), target=target)
    return relax.VirtualMachine(ex, tvm.cpu())


def run_checked(cm, inputs: Mapping[str, np.ndarray], rtol: float = 1e-4, atol: float = 1e-4):
    """Run ``cm`` on ``inputs``, checking each partition call; return ``(outputs, [PartitionCheck])``.

    Raises
    ------
    OpCheckError
        At the first partition whose output is not within ``rtol``/``atol`` of the reference.
    """
    import tvm

    if not cm.target.backend().runs_on_this_cpu():
        raise TargetError(f"op-check runs the model on this CPU; code for target {cm.target.name} cannot run here")
    kernels = cm.record.kernels
    calls: list[tuple[str, list[np.ndarray]]] = []

    def instrument(func, symbol, before_run, ret_value, *args):
        if not before_run and symbol in kernels:
            calls.append((symbol, [a.numpy() for a in args if isinstance(a, tvm.runtime.Tensor)]))
        return 0

    runner = cm._get_runner()
    runner._vm.set_instrument(instrument)
    try:
        outputs = runner.run(inputs)
    finally:
        runner._vm.set_instrument(lambda *a: 0)
    target, refs, results = cm.target.tvm_target(), {}, []
    for symbol, arrays in calls:
        fn, layout = kernels[symbol]
        # the reference takes OIHW weights and NCHW activations (padded blocks cropped to the partition's shapes)
        arrays = layout.plain(arrays, [p.ty.shape for p in fn.params] + [fn.ret_ty.shape])
        if symbol not in refs:
            refs[symbol] = _reference(fn, target)
        expected = refs[symbol]["main"](*[tvm.runtime.tensor(a) for a in arrays[:-1]]).numpy()
        got = arrays[-1]
        err = float(np.max(np.abs(got - expected))) if got.size else 0.0
        check = PartitionCheck(symbol, str(fn.attrs["Composite"]), err,
                               float(np.max(np.abs(expected))) if expected.size else 0.0)
        if not np.allclose(got, expected, rtol=rtol, atol=atol):
            raise OpCheckError(f"op-check: partition {check.partition} (kernel {symbol}, call {len(results) + 1}) "
                               f"differs from the unfused reference: max abs error {err:.3g} "
                               f"(reference max |value| {check.max_abs_reference:.3g}, rtol={rtol}, atol={atol})")
        results.append(check)
    return outputs, results
