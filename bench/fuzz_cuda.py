"""Random CNNs through the CUDA pipeline, no GPU needed: every graph must compile with each partition on a
tvmfuse CUDA rule.

    python bench/fuzz_cuda.py --seeds 0 2000 [--target cuda-sm90] [--nvcc-every 5]

For every seed in [A, B): ``tvmfuse.fuzz.graphs.random_cnn(seed)`` through tvmfuse's graph passes and the CUDA
backend's Relax pipeline (where the rules are chosen); every ``--nvcc-every``-th graph is also built by nvcc.
Prints one line per failure (seed, the error or the partition not on a tvmfuse rule) and a summary: graphs,
partitions per rule, failures, seconds. Exit status 1 when anything failed. Numerics need a GPU: ``pytest -m
gpu`` and ``bench/cuda_check_kernels.py`` there.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time


def main(argv=None) -> int:
    import tvm

    from tvmfuse import frontend, targets
    from tvmfuse.export import kernel_schedulers
    from tvmfuse.fuzz import graphs
    from tvmfuse.passes.pipeline import relax_pipeline, run_graph_passes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs=2, type=int, default=[0, 200], metavar=("A", "B"))
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--nvcc-every", type=int, default=5)
    args = p.parse_args(argv)
    spec = targets.resolve(args.target)
    target = spec.tvm_target()
    rules, failures, start = collections.Counter(), 0, time.monotonic()
    for seed in range(*args.seeds):
        try:
            mod = run_graph_passes(frontend.import_model(graphs.random_cnn(seed)).mod, spec, target)
            with target, tvm.transform.PassContext(opt_level=3):
                lowered = relax_pipeline(spec, target)(mod)
                if args.nvcc_every and seed % args.nvcc_every == 0:
                    tvm.compile(lowered, target=target, relax_pipeline=None)
            for kernel, who in kernel_schedulers(lowered).items():
                if kernel.startswith("tvmfuse_"):
                    rules[who] += 1
                    if not who.startswith(f"tvmfuse.{spec.backend().name}."):
                        failures += 1
                        print(f"seed {seed}: {kernel} scheduled by {who}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is a result
            failures += 1
            print(f"seed {seed}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", flush=True)
    seconds = time.monotonic() - start
    print(f"{args.seeds[1] - args.seeds[0]} graphs for {spec.name}: partitions {dict(rules)}, {failures} failure(s), "
          f"{seconds:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
