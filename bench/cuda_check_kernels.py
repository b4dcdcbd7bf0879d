"""Every partition kernel of a model, run alone on the GPU against the same TE compute on the CPU.

    python bench/cuda_check_kernels.py zoo:mobilenet_v3_large [--target cuda-sm90] [--shape input:1,3,224,224]
    python bench/cuda_check_kernels.py zoo:yolov8n --int8


For each partition the CUDA kernel (scheduled as compile schedules it) and the unscheduled kernel built for
the CPU get the same random inputs; prints the worst relative difference per kernel, who scheduled it, and
its shapes, and exits 1 when any exceeds 1e-4 of the output's range or is not finite. A model that fails
against onnxruntime on the GPU is narrowed to a kernel this way. ``--int8``: the model quantized (random
calibration), every kernel of its graph (INT8 and float) checked the same way, codes given as random codes and
an INT8 kernel's integer output required to be identical (bit-exact).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _run(func, target, dev, arrays):
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    shape = [int(d) for d in func.params[-1].ty.shape]
    dtype = str(func.params[-1].ty.dtype)
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays] + [tvm.runtime.tensor(np.zeros(shape, dtype), dev)]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def _random(rng, param, int8_kernel: bool):
    """Random values for a kernel parameter: codes over their whole range, int32 sums (biases) of a conv's
    size, requantize multipliers (float32 of an INT8 kernel) small and positive, float data standard normal."""
    shape, dtype = [int(d) for d in param.ty.shape], str(param.ty.dtype)
    if dtype in ("uint8", "int8"):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, shape).astype(dtype)
    if dtype == "int32":
        return rng.integers(-5000, 5000, shape).astype(dtype)
    if int8_kernel and dtype == "float32":
        return rng.uniform(0.002, 0.02, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _int8_kernels(model, spec, shapes):
    """(name, CUDA kernel, CPU kernel) for every kernel of the model quantized for ``spec``."""
    import tvm

    import tvmfuse

    cm = tvmfuse.quantize(model, calib="random:2", method="minmax", target=spec, shapes=shapes)
    for gv, func in sorted(cm.mod.functions.items(), key=lambda kv: kv[0].name_hint):
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and "tvmfuse.family" in func.attrs:
            yield gv.name_hint, spec.backend().schedule(func), func


def _float_kernels(model, spec, shapes):
    """(name, CUDA kernel, CPU kernel) for every partition kernel of the model compiled for ``spec``."""
    import tvmfuse
    from tvmfuse.passes.lower import make_kernel

    cm = tvmfuse.compile(model, target=spec, shapes=shapes)
    for name, (fn, _) in sorted(cm.record.kernels.items()):
        yield name, make_kernel(fn, spec)[0], make_kernel(fn, None, schedule=False)[0]


def main(argv=None) -> int:
    import tvm

    import warnings

    from tvmfuse import targets

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--int8", action="store_true", help="the model quantized: its INT8 kernels bit-exact")
    args = p.parse_args(argv)
    shapes = {s.split(":")[0]: tuple(int(d) for d in s.split(":")[1].split(",")) for s in args.shape} or None
    spec = targets.resolve(args.target)
    rng = np.random.default_rng(0)
    bad = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random calibration's warning: the ranges do not matter here
        kernels = list((_int8_kernels if args.int8 else _float_kernels)(args.model, spec, shapes))
    for name, cuda_func, cpu_func in kernels:
        int8_kernel = str(cpu_func.attrs.get("tvmfuse.family", "")).startswith("int8")
        arrays = [_random(rng, p, int8_kernel) for p in cpu_func.params[:-1]]
        want = _run(cpu_func, tvm.target.Target("llvm"), tvm.cpu(0), arrays)
        got = _run(cuda_func, spec.tvm_target(), tvm.cuda(0), arrays)
        rule = str(cuda_func.attrs.get("tvmfuse.scheduled_by", "none"))
        if want.dtype.kind in "iu":
            off = int((got != want).sum())
            flag, what = ("BAD" if off else "ok"), f"{off} of {want.size} codes differ"
        else:
            scale = float(np.abs(want).max()) or 1.0
            diff = float(np.abs(got - want).max()) / scale if np.isfinite(got).all() else float("inf")
            flag, what = ("BAD" if not diff <= 1e-4 else "ok"), f"diff {diff:.1e}"
        bad += flag == "BAD"
        print(f"{flag} {name} {rule} {what} {[a.shape for a in arrays]}", flush=True)
    print(f"{bad} kernel(s) off")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
