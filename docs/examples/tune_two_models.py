"""Tune two models into one tuning-log folder, then compile both with it and time them against their untuned
builds.

    python docs/examples/tune_two_models.py zoo:mobilenet_v2 zoo:efficientnet_lite0 --logs my_logs --trials 32

Kernels the two models share are tuned once (the second run finds them in the logs). The target is this machine
(``x86-host``); the folder gets one subfolder per target (``my_logs/x86-host-<cpu>/``), and any later
``tvmfuse compile MODEL --logs my_logs`` applies it.
"""

from __future__ import annotations

import argparse

import tvmfuse
from tvmfuse.tune import tune


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs=2, metavar="MODEL", help="an .onnx file or zoo:NAME")
    ap.add_argument("--logs", required=True, help="the tuning-log folder to fill (created)")
    ap.add_argument("--trials", type=int, default=32, help="measured candidates per kernel (default 32)")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per build (default 20)")
    args = ap.parse_args(argv)

    for model in args.models:
        report = tune(model, trials=args.trials, logs=args.logs, progress=False)
        tuned = sum(1 for t in report.tasks if t.status == "tuned")
        print(f"{model}: {len(report.tasks)} kernels, {tuned} tuned, {report.records_written} record(s) written "
              f"to {report.logs} in {report.seconds:.0f} s")
    for model in args.models:
        tuned = tvmfuse.compile(model, logs=args.logs)
        plain = tvmfuse.compile(model, logs=False)
        t, p = (cm.benchmark(repeat=args.repeat)["median_ms"] for cm in (tuned, plain))
        print(f"{model}: {len(tuned.tuning_logs['applied'])} kernels from the logs; median {t:.3f} ms tuned, "
              f"{p:.3f} ms untuned ({t / p:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
