"""Batch-1 latency with and without CUDA graphs (TVM's ``relax.backend.use_cuda_graph``), one process.

    python bench/cuda_graph.py [--models mobilenet_v2,resnet50] [--repeat 50]

TVM 0.27's ``RewriteCUDAGraph`` (in its CUDA finalize passes) captures the static-shape kernel launches of
``main`` into a CUDA graph when the pass config asks for it; at batch 1 a CNN is dozens of short kernels.
Prints both medians and whether the outputs agree.
"""

from __future__ import annotations

import argparse
import statistics
import sys


def build(model, target: str, graph: bool, shapes=None):
    import tvmfuse

    return tvmfuse.compile(model, target=target, shapes=shapes, cuda_graph=graph)


def main(argv=None) -> int:
    import numpy as np
    import tvm
    from tvm import relax

    from tvmfuse import zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mobilenet_v2,efficientnet_lite0,resnet50")
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--repeat", type=int, default=50)
    args = p.parse_args(argv)
    dev = tvm.cuda(0)
    print("| model | kernels launched | plain ms | CUDA graph ms | graph / plain | max diff |\n|---|---|---|---|---|---|")
    for name in args.models.split(","):
        row, outs = [], []
        for graph in (False, True):
            cm = build(zoo.get(name), args.target, graph, zoo.default_shapes(name))
            vm = relax.VirtualMachine(cm.executable, dev)
            x = [tvm.runtime.tensor(np.random.default_rng(0).standard_normal(i.shape).astype(i.dtype), dev)
                 for i in cm.inputs]
            out = vm["main"](*x)
            outs.append((out[0] if not isinstance(out, tvm.runtime.Tensor) else out).numpy())
            row.append(statistics.median(vm.time_evaluator("main", dev, number=20, repeat=args.repeat)(*x).results) * 1e3)
        kernels = len(cm.manifest()["kernels"])
        print(f"| {name} | {kernels} | {row[0]:.3f} | {row[1]:.3f} | {row[1] / row[0]:.2f}x | "
              f"{float(np.abs(outs[0] - outs[1]).max()):.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
