"""Auto-tuning: latency with tuning logs against the default schedules and onnxruntime FP32, in one run.

    # how fast tuning converges: tune one model at several trial counts (one logs folder each), then time all
    python bench/tuning.py converge --model mobilenet_v2 --trials 4,8,16 --root /tmp/tvmfuse-converge
    # the shipped logs (tuning_logs/): each zoo model with and without them, and onnxruntime
    python bench/tuning.py shipped --models mobilenet_v2,resnet50,efficientnet_lite0

Latencies are medians of alternating blocks (bench/common.py); report ratios from one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import THREADS, inputs_for, interleaved_medians, ort_session, table  # noqa: E402

import tvmfuse  # noqa: E402
from tvmfuse import targets, zoo  # noqa: E402
from tvmfuse.tune.database import default_root  # noqa: E402
from tvmfuse.tune.tuner import tune  # noqa: E402


def _compile(model, target, logs):
    start = time.perf_counter()
    cm = tvmfuse.compile(model, target=target, logs=logs)
    return cm, time.perf_counter() - start


def converge(args) -> None:
    model = zoo.get(args.model)
    compiled, rows = {}, []
    default, _ = _compile(model, args.target, False)
    for n in [int(t) for t in args.trials.split(",")]:
        logs = Path(args.root) / f"trials-{n}"
        start = time.perf_counter()
        report = tune(model, args.target, trials=n, logs=logs, trials_per_iter=min(16, n), progress=False)
        tuned = sum(t.status != "in logs" for t in report.tasks)
        compiled[n], compile_s = _compile(model, args.target, logs)
        rows.append({"trials per task": n, "tasks": len(report.tasks),
                     "tuning s": f"{time.perf_counter() - start:.0f}" if tuned else "(logs existed)",
                     "kernels tuned": len(compiled[n].tuning_logs["applied"]), "compile s": f"{compile_s:.1f}"})
    sess = ort_session(model)
    x = inputs_for(default.inputs)
    fns = {"default": lambda: default.run(x), "onnxruntime": lambda: sess.run(None, x)}
    fns.update({n: (lambda cm=cm: cm.run(x)) for n, cm in compiled.items()})
    # Each timing is one interleaved run; with --reps N the ratios are given as the range over N such runs.
    runs = [interleaved_medians(fns, args.repeat) for _ in range(args.reps)]
    rows.insert(0, {"trials per task": 0, "tasks": "-", "tuning s": "0", "kernels tuned": 0, "compile s": "-"})
    for row in rows:
        key = row["trials per task"] or "default"
        row.update({"latency ms": _span([ms[key] for ms in runs], "", ".2f"),
                    "vs default": _span([ms[key] / ms["default"] for ms in runs]),
                    "vs onnxruntime": _span([ms[key] / ms["onnxruntime"] for ms in runs])})
    ort = _span([ms["onnxruntime"] for ms in runs], " ms", ".2f")
    print(f"# tuning convergence: {args.model}, batch 1, {THREADS} threads, target {args.target}; "
          f"onnxruntime {ort}; {args.reps} timing run(s)")
    print(table(rows, ["trials per task", "tasks", "tuning s", "kernels tuned", "compile s", "latency ms",
                       "vs default", "vs onnxruntime"]))


def _span(values: list[float], unit: str = "x", fmt: str = ".2f") -> str:
    """``0.95x`` for one value, ``0.93-0.96x`` (min-max) for several."""
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}{unit}" if len(values) == 1 or f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}{unit}"


def shipped(args) -> None:
    rows = []
    for name in args.models.split(","):
        model = zoo.get(name)
        default, _ = _compile(model, args.target, False)
        tuned, compile_s = _compile(model, args.target, args.logs or None)
        sess = ort_session(model)
        x = inputs_for(default.inputs)
        fns = {"default": lambda: default.run(x), "logs": lambda: tuned.run(x),
               "onnxruntime": lambda: sess.run(None, x)}
        runs = [interleaved_medians(fns, args.repeat) for _ in range(args.reps)]
        applied = (tuned.tuning_logs or {}).get("applied", [])
        rows.append({"model": name, "kernels tuned": len(applied),
                     **{f"{k} ms": _span([ms[k] for ms in runs], "", ".2f")
                        for k in ("onnxruntime", "default", "logs")},
                     "logs / default": _span([ms["logs"] / ms["default"] for ms in runs]),
                     "logs / onnxruntime": _span([ms["logs"] / ms["onnxruntime"] for ms in runs]),
                     "compile s (logs)": f"{compile_s:.1f}"})
    spec = targets.resolve(args.target)
    print(f"# shipped tuning logs: batch 1, {THREADS} threads, target {args.target} "
          f"({spec.config.get('mcpu')}), logs {args.logs or default_root()}")
    print(table(rows, list(rows[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("converge")
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--trials", default="4,8,16")
    p.add_argument("--root", default="/tmp/tvmfuse-converge")
    p = sub.add_parser("shipped")
    p.add_argument("--models", default="mobilenet_v2,resnet50,efficientnet_lite0")
    p.add_argument("--logs", help="logs folder (default: tuning_logs/)")
    for p in sub.choices.values():
        p.add_argument("--target", default="x86-host")
        p.add_argument("--repeat", type=int, default=30)
        p.add_argument("--reps", type=int, default=1, help="timing runs (ratios reported as their range)")
    args = parser.parse_args()
    converge(args) if args.mode == "converge" else shipped(args)


if __name__ == "__main__":
    main()
