"""Sweep the CUDA conv2d rule's tile configurations over the conv layers of zoo models, on a GPU.

    python bench/cuda_sweep.py [--models mobilenet_v2,resnet50] [--out sweep.json] [--jobs 8]

For every distinct conv2d partition kernel (GEMM form I x J x K) the kernel is built with each candidate
:class:`tvmfuse.schedules.cuda.conv2d.Config` (builds in ``--jobs`` threads) and timed alone
(``time_evaluator``, median of 3 x 20 runs); prints, per layer, the default config's time and the best one's,
and writes every result to ``--out``: the data the default-config heuristic is fitted to.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import statistics
import sys

import numpy as np

THREADS = ((8, 8), (16, 8), (8, 16), (16, 16))
MICRO = ((2, 2), (2, 4), (4, 2), (4, 4), (8, 4))


def candidates(k: int):
    """20 tiles; ``step_k`` as the default picks it (72 candidates a layer took most of 150 s on the H100)."""
    from tvmfuse.schedules.cuda.conv2d import Config

    for (ti, tj), (mi, mj) in itertools.product(THREADS, MICRO):
        yield Config(ti, tj, mi, mj, 8 if k <= 32 else 16)


def main(argv=None) -> int:
    import tvm
    from tvm import s_tir

    import tvmfuse
    from tvmfuse import targets, zoo
    from tvmfuse.passes.lower import make_kernel
    from tvmfuse.schedules.cuda import conv2d

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mobilenet_v2,resnet50,efficientnet_lite0")
    p.add_argument("--out", default="sweep.json")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--max-layers", type=int, default=None, help="stop after this many distinct layers")
    args = p.parse_args(argv)
    spec = targets.resolve("cuda-sm90")
    target, dev = spec.tvm_target(), tvm.cuda(0)
    layers = {}
    for name in args.models.split(","):
        cm = tvmfuse.compile(zoo.get(name), target=spec, shapes=zoo.default_shapes(name))
        for fn, _ in cm.record.kernels.values():
            func, _ = make_kernel(fn, spec, schedule=False)
            if str(func.attrs["tvmfuse.family"]) != "conv2d":
                continue
            key = (tuple(tuple(int(d) for d in p.ty.shape) for p in func.params), str(func.attrs["tvmfuse.ops"]))
            layers.setdefault(key, (name, func))

    def build(func, config):
        sch = s_tir.Schedule(func)
        try:
            if not conv2d.schedule_gemm(sch, conv2d.ANCHOR, 132, config):
                return None
            with target:
                return tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                                   target=target)
        except Exception as e:  # noqa: BLE001 - a candidate over the target's limits
            print(f"  {config}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
            return None

    def shape_of(func):
        sch = s_tir.Schedule(func)
        main = sch.get_sblock(conv2d.ANCHOR)
        extents = [int(iv.dom.extent) for iv in sch.get(main).iter_vars]
        n, o, y, x = extents[:4]
        return y * x, o, int(np.prod(extents[4:]))

    results = []
    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
    for model, func in list(layers.values())[:args.max_layers]:
        i, j, k = shape_of(func)
        default = conv2d.default_config(i, j, k, 132)
        configs = [default] + [c for c in candidates(k) if c != default]
        libs = list(pool.map(lambda c: build(func, c), configs))
        arrays = [tvm.runtime.tensor(np.random.default_rng(0).standard_normal([int(d) for d in p.ty.shape])
                                     .astype("float32"), dev) for p in func.params]
        times = []
        for config, lib in zip(configs, libs):
            if lib is None:
                continue
            try:
                t = lib.mod.time_evaluator("main", dev, number=20, repeat=3)(*arrays).results
            except Exception as e:  # noqa: BLE001 - a launch over the limits
                print(f"  {config}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
                continue
            times.append((statistics.median(t) * 1e6, config))
        if not times:
            print(f"{model} I={i} J={j} K={k}: no candidate ran", flush=True)
            continue
        best_us, best = min(times, key=lambda t: t[0])
        default_us = times[0][0] if times and times[0][1] == default else float("nan")
        results.append({"model": model, "I": i, "J": j, "K": k, "default": default.__dict__, "default_us": default_us,
                        "best": best.__dict__, "best_us": best_us,
                        "all": [(round(t, 2), c.__dict__) for t, c in sorted(times, key=lambda t: t[0])[:8]]})
        print(f"{model} I={i} J={j} K={k}: default {default_us:.1f} us {default}, best {best_us:.1f} us {best}",
              flush=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    total_default = sum(r["default_us"] for r in results)
    total_best = sum(r["best_us"] for r in results)
    print(f"sum over layers: default {total_default:.0f} us, best {total_best:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
