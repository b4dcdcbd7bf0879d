"""Every partition kernel of a model, run alone on the GPU against the same TE compute on the CPU.

    python bench/cuda_check_kernels.py zoo:mobilenet_v3_large [--target cuda-sm90] [--shape input:1,3,224,224]

For each partition the CUDA kernel (scheduled as compile schedules it) and the unscheduled kernel built for
the CPU get the same random inputs; prints the worst relative difference per kernel, who scheduled it, and
its shapes, and exits 1 when any exceeds 1e-4 of the output's range or is not finite. A model that fails
against onnxruntime on the GPU is narrowed to a kernel this way.
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


def main(argv=None) -> int:
    import tvm

    import tvmfuse
    from tvmfuse import targets
    from tvmfuse.passes.lower import make_kernel

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--shape", action="append", default=[])
    args = p.parse_args(argv)
    shapes = {s.split(":")[0]: tuple(int(d) for d in s.split(":")[1].split(",")) for s in args.shape} or None
    spec = targets.resolve(args.target)
    cm = tvmfuse.compile(args.model, target=spec, shapes=shapes)
    rng = np.random.default_rng(0)
    bad = 0
    for name, (fn, _) in sorted(cm.record.kernels.items()):
        cuda_func, _ = make_kernel(fn, spec)
        cpu_func, _ = make_kernel(fn, None, schedule=False)
        arrays = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype))
                  for p in cpu_func.params[:-1]]
        want = _run(cpu_func, tvm.target.Target("llvm"), tvm.cpu(0), arrays)
        got = _run(cuda_func, spec.tvm_target(), tvm.cuda(0), arrays)
        scale = float(np.abs(want).max()) or 1.0
        diff = float(np.abs(got - want).max()) / scale if np.isfinite(got).all() else float("inf")
        rule = str(cuda_func.attrs.get("tvmfuse.scheduled_by", "none"))
        flag = "BAD" if not diff <= 1e-4 else "ok"
        bad += flag == "BAD"
        print(f"{flag} {name} {rule} diff {diff:.1e} {[a.shape for a in arrays]}", flush=True)
    print(f"{bad} kernel(s) off")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
