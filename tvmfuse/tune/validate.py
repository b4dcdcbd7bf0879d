"""Check a tuned kernel against a reference before its record is accepted, and time both.

MetaSchedule only measures speed: a candidate that computes the wrong thing (auto-tensorized INT8 has done
so) "succeeds". Every record that goes into the shared logs is first run on seeded random inputs and compared
with the kernel's default schedule (tvmfuse kernels: the hand schedule; other kernels: TVM's unscheduled
lowering), exactly for integer outputs, within a float tolerance otherwise.
"""

from __future__ import annotations

import dataclasses

import numpy as np

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
    """The kernel of task module ``mod`` as compile would build it without logs."""
    func = mod["main"]
    family = func.attrs.get("tvmfuse.family") if func.attrs else None
    if family is not None and spec.is_cpu:
        from tvmfuse.schedules import x86

        func = x86.schedule(func, str(family), spec.vector_bits())
    return type(mod)({"main": func})


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


def _run(lib, arrays, dev, time_it: bool):
    import tvm

    lib = getattr(lib, "mod", lib)  # tvm.compile of PrimFuncs gives an Executable around the module
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib["main"](*args)
    outs = [a.numpy() for a in args]
    us = None
    if time_it:
        timer = lib.time_evaluator("main", dev, number=5, repeat=5, min_repeat_ms=20)
        us = float(np.median(timer(*args).results)) * 1e6
    return outs, us


def check(tuned_mod, task_mod, spec: TargetSpec, time_it: bool = True, seed: int = 0) -> Check:
    """Build ``tuned_mod`` and the default schedule of ``task_mod``, run both on the same inputs, compare."""
    import tvm

    target = spec.tvm_target()
    dev = tvm.cpu(0)
    arrays = _random_args(task_mod["main"], np.random.default_rng(seed))
    with target:
        tuned = tvm.compile(tuned_mod, target=target)
        reference = tvm.compile(default_schedule(task_mod, spec), target=target)
    got, tuned_us = _run(tuned, arrays, dev, time_it)
    want, default_us = _run(reference, arrays, dev, time_it)
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
