"""Differential fuzzing campaign: random CNNs compiled by tvmfuse against onnxruntime.

    python bench/fuzz.py --seeds 0 1000 [--out DIR] [--layouts blocked nchw] [--target x86-host]
                         [--int8] [--jobs 1] [--graphs cnn|winograd]

For every seed in [A, B): ``tvmfuse.fuzz.graphs.random_cnn(seed)`` (``--graphs winograd``: the models around
Winograd convs of ``tvmfuse.fuzz.winograd.random_winograd(seed)``) compiled in each layout and compared with
onnxruntime (``tvmfuse.fuzz.check``: tolerance 1e-4 of the output's scale, reasons in its docstring). With
``--int8`` also the graph quantized (``tvmfuse.quantize``, minmax) against its FP32 outputs, and one random
INT8 kernel case per seed bit-exact against its numpy reference, on the target and, where the target has
VNNI, on AVX2 too (``tvmfuse.fuzz.int8``).

One line per failure (seed, what, the error or the size of the difference), then a summary: graphs,
compiles, mismatches, errors, seconds, the machine. Each failing seed is saved as ``DIR/seed_<n>.onnx`` (the
graph, when the graph failed) and ``DIR/seed_<n>.json`` (what failed, the errors, the kernel case).
Reproduce one with ``--seeds n n+1``. Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

from tvmfuse.fuzz import campaign, check  # noqa: E402


def save(report: campaign.SeedReport, out: Path, kind: str = "cnn") -> list[Path]:
    """``seed_<n>.json`` (and ``seed_<n>.onnx`` when the graph failed) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if report.graph_failed:
        model = out / f"seed_{report.seed}.onnx"
        model.write_bytes(campaign.GRAPHS[kind](report.seed).SerializeToString())
        paths.append(model)
    info = out / f"seed_{report.seed}.json"
    info.write_text(json.dumps(report.to_json(), indent=1, default=str))
    return paths + [info]


def _summary(counts: dict, seconds: float, args) -> str:
    text = (f"fuzz seeds {args.seeds[0]}-{args.seeds[1]}: {counts['graphs']} {args.graphs} graphs, "
            f"{counts['compiles']} compiles "
            f"({'/'.join(args.layouts) or 'no layout'}), {counts['mismatch']} mismatches, {counts['error']} errors")
    if args.int8:
        text += (f" (INT8: {counts['int8 graphs']} quantized graphs holding {counts['int8 kernels in graphs']} "
                 f"INT8 partitions, {counts['int8 kernels']} kernel cases)")
    from tvmfuse import targets

    code = targets.resolve(args.target).config.get("mcpu")  # x86-host's follows TVMFUSE_HOST_CPU
    return (text + f", {counts['failed seeds']} failing seeds, {seconds:.1f} s, jobs {args.jobs}, "
            f"target {args.target}{f' ({code})' if code else ''}, {machine()}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", nargs=2, type=int, required=True, metavar=("A", "B"),
                   help="seeds A (included) to B (excluded)")
    p.add_argument("--out", default="fuzz_failures", help="where failing seeds are saved (default: %(default)s)")
    p.add_argument("--layouts", nargs="*", default=list(check.LAYOUTS), choices=check.LAYOUTS)
    p.add_argument("--target", default=check.HOST, help="a target this CPU runs (default: %(default)s)")
    p.add_argument("--int8", action="store_true", help="also quantized graphs and INT8 kernel cases")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default: %(default)s)")
    p.add_argument("--graphs", choices=sorted(campaign.GRAPHS), default="cnn",
                   help="random CNNs of every op kind, or models around Winograd convs (default: %(default)s)")
    args = p.parse_args(argv)
    seeds = range(*args.seeds)
    counts = dict.fromkeys(("graphs", "compiles", "mismatch", "error", "int8 graphs", "int8 kernels in graphs",
                            "int8 kernels", "failed seeds"), 0)
    start = time.perf_counter()
    for report in campaign.run(seeds, args.layouts, args.target, args.int8, args.jobs, args.graphs):
        counts["graphs"] += 1
        for r in report.results:
            if r.layout == "int8":
                counts["int8 graphs"] += 1
                counts["int8 kernels in graphs"] += r.info.get("int8_partitions", 0)
            elif r.layout.startswith("int8 "):
                counts["int8 kernels"] += 1
            else:
                counts["compiles"] += 1
            if not r.ok:
                counts[r.status] += 1
                kernel = r.status == "error" and r.layout.startswith("int8 ")
                what = f" [{report.kernel_case.describe()}]" if kernel else ""
                print(f"seed {report.seed}: {r.line()}{what}", flush=True)
        if report.failures:
            counts["failed seeds"] += 1
            save(report, Path(args.out), args.graphs)
    print(_summary(counts, time.perf_counter() - start, args), flush=True)
    return 1 if counts["failed seeds"] else 0


if __name__ == "__main__":
    sys.exit(main())
