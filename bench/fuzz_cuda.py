"""Random CNNs through the CUDA pipeline, no GPU needed: every graph must compile with each partition on a tvmfuse
CUDA rule, and with ``--simulate`` every partition kernel's schedule must compute its kernel.

    python bench/fuzz_cuda.py --seeds 0 2000 [--target cuda-sm90] [--nvcc-every 5] [--precision fp16] [--simulate]
    python bench/fuzz_cuda.py --seeds 0 500 --int8-cases [--simulate]

For every seed in [A, B): ``tvmfuse.fuzz.graphs.random_cnn(seed)`` through tvmfuse's graph passes and the CUDA
backend's Relax pipeline (where the rules are chosen); every ``--nvcc-every``-th graph is also built by nvcc.
``--simulate``: each partition kernel scheduled by its rule is also run on the CPU against the kernel unscheduled
(``tvmfuse.fuzz.cuda_cpu``: threads as serial loops, tensor-core steps not tensorized), a failure where the outputs
differ by more than float rounding (relative 1e-5 in FP32, 2e-3 in fp16: GEMVs and K split over warps sum in
another order). ``--int8-cases``: also ``tvmfuse.fuzz.int8.random_case(seed)``, its CUDA INT8 kernel run on the CPU
the same way, every output equal to ``int8_ref``'s. Prints one line per failure (seed, the error, the partition not
on a tvmfuse rule or the kernel that differs) and a summary: graphs, partitions per rule, kernels simulated,
failures, seconds. Exit status 1 when anything failed. What the simulation cannot see (races, the instructions,
nvcc) needs a GPU: ``pytest -m gpu`` and ``bench/cuda_check_kernels.py`` there.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

BOUND = {"fp32": 1e-5, "fp16": 2e-3}  # relative mismatch a simulated kernel may show (float rounding)


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
    p.add_argument("--precision", default="fp32", choices=sorted(BOUND))
    p.add_argument("--simulate", action="store_true", help="run every partition kernel's schedule on the CPU")
    p.add_argument("--int8-cases", action="store_true", help="also a random INT8 kernel case a seed, on the CPU")
    args = p.parse_args(argv)
    from tvmfuse.fuzz import int8
    from tvmfuse.fuzz.cuda_cpu import kernel_mismatches

    spec = targets.resolve(args.target)
    target = spec.tvm_target()
    rules, failures, simulated, cases, start = collections.Counter(), 0, 0, 0, time.monotonic()
    for seed in range(*args.seeds):
        if args.int8_cases:
            case, cases = int8.random_case(seed), cases + 1
            result = int8.check_case(case, spec.name)
            if result.status != "ok":
                failures += 1
                detail = result.error or result.outputs[0].message
                print(f"seed {seed}: INT8 {case.describe()}: {result.status}: {detail}", flush=True)
        try:
            mod = run_graph_passes(frontend.import_model(graphs.random_cnn(seed)).mod, spec, target,
                                   precision=args.precision)
            if args.simulate:
                for kernel, (rule, error) in kernel_mismatches(mod, spec).items():
                    simulated += 1
                    if not error <= BOUND[args.precision]:
                        failures += 1
                        print(f"seed {seed}: {kernel} ({rule}) differs on the CPU: relative {error:.2e}", flush=True)
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
    print(f"{args.seeds[1] - args.seeds[0]} graphs for {spec.name} ({args.precision}): partitions {dict(rules)}, "
          f"{simulated} kernels simulated, {cases} INT8 kernel cases, {failures} failure(s), {seconds:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
