"""Check a tuned kernel against a reference before its record is accepted, and time both.

MetaSchedule only measures speed: a candidate that computes the wrong thing (auto-tensorized INT8 has done
so) "succeeds". Every record that goes into the shared logs is first run on seeded random inputs and compared
with the kernel's default schedule, exactly the one compile gives it (the backend's ``schedule``: for
tvmfuse kernels the family's rule, for other kernels the backend's generic one), exactly for integer outputs, within a float tolerance
otherwise.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import cache as kernel_cache
from ..cache import kernels
from ..targets import TargetSpec


@dataclasses.dataclass
class Check:
    """The outcome of one validation.

    Attributes
    ----------
    ok : bool
        Whether every output matched.
    detail : str
        Why not (the argument and the largest difference), or "" when ok.
    tuned_us, default_us : float or None
        Median latency of the tuned and default kernels on this machine (None when not timed).
    """

    ok: bool
    detail: str = ""
    tuned_us: float | None = None
    default_us: float | None = None


def default_schedule(mod, spec: TargetSpec):
    """The kernel of task module ``mod`` as compile would build it without logs: the backend's schedule,
    the one ``ScheduleKernels`` gives (INT8 kernels included)."""
    return type(mod)({"main": spec.backend().schedule(mod["main"])})


def _random_args(func, rng: np.random.Generator) -> list[np.ndarray]:
    from tvm.s_tir import meta_schedule as ms

    arrays = []
    for info in ms.arg_info.ArgInfo.from_prim_func(func):
        shape = [int(d) for d in info.shape]
        dtype = str(info.dtype)
        if dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype in ("int8", "uint8", "int32", "int64"):
            lo, hi = (0, 256) if dtype == "uint8" else (-128, 128)
            arrays.append(rng.integers(lo, hi, size=shape).astype(dtype))
        else:
            arrays.append(np.zeros(shape, dtype))
    return arrays


class LocalDevice:
    """Run kernels on this machine's CPU."""

    def load(self, executable):
        import tvm

        return getattr(executable, "mod", executable), tvm.cpu(0)  # tvm.compile of PrimFuncs: an Executable


class RPCDevice:
    """Run kernels on a device behind a TVM RPC tracker (for targets this machine cannot run)."""

    def __init__(self, rpc):
        self.rpc, self._session = rpc, None

    def load(self, executable):
        import tempfile

        from tvm import rpc
        from tvm.support import tar

        if self._session is None:
            self._session = rpc.connect_tracker(self.rpc.host, self.rpc.port).request(self.rpc.key,
                                                                                      session_timeout=120)
        with tempfile.TemporaryDirectory() as tmp:
            path = f"{tmp}/kernel.tar"
            executable.mod.export_library(path, fcompile=tar.tar)
            self._session.upload(path)
        return self._session.load_module("kernel.tar"), self._session.cpu(0)


def _run(executable, arrays, device):
    """Run once on ``arrays``; return the arguments after the call and a timer ``() -> seconds``."""
    import tvm

    lib, dev = device.load(executable)
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib["main"](*args)
    outs = [a.numpy() for a in args]
    # Caches flushed as in tuning (see measure.make_runner): weights and outputs cold, the input warm.
    timer = lib.time_evaluator("main", dev, number=1, repeat=8, f_preproc="cache_flush_cpu_non_first_arg")
    return outs, lambda: min(timer(*args).results)


def _race(first, second, rounds: int = 3) -> tuple[float, float]:
    """Best time of each in microseconds, timed in alternation so background load hits both alike."""
    a, b = [], []
    for _ in range(rounds):
        a.append(first())
        b.append(second())
    return min(a) * 1e6, min(b) * 1e6


def check(tuned_mod, task_mod, spec: TargetSpec, time_it: bool = True, seed: int = 0, device=None) -> Check:
    """Build ``tuned_mod`` and the default schedule of ``task_mod``, run both on the same inputs, compare.

    ``device`` is where they run: :class:`LocalDevice` (default) or :class:`RPCDevice`.
    """
    import tvm

    device = device if device is not None else LocalDevice()
    target = spec.tvm_target()
    arrays = _random_args(task_mod["main"], np.random.default_rng(seed))
    pipeline = spec.backend().tir_pipeline()
    with target:
        tuned = tvm.compile(tuned_mod, target=target, tir_pipeline=pipeline)
        default = default_schedule(task_mod, spec)
        if isinstance(device, LocalDevice) and kernels.cacheable(target):  # the same every round: cached
            reference = kernels.runnable(default, target, kernel_cache.resolve(None), pipeline)
        else:
            reference = tvm.compile(default, target=target, tir_pipeline=pipeline)
    got, tuned_timer = _run(tuned, arrays, device)
    want, default_timer = _run(reference, arrays, device)
    tuned_us, default_us = _race(tuned_timer, default_timer) if time_it else (None, None)
    for i, (g, w) in enumerate(zip(got, want)):
        if g.dtype.kind in "iub":
            bad = not np.array_equal(g, w)
        else:
            bad = not np.allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max(initial=0))))
        if bad:
            diff = np.abs(g.astype("float64") - w.astype("float64")).max(initial=0)
            return Check(False, f"argument {i} {list(g.shape)} {g.dtype}: max abs diff {diff:.3g}", tuned_us,
                         default_us)
    return Check(True, "", tuned_us, default_us)
