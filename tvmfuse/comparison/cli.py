"""``tvmfuse compare``: its arguments and the command (the rest of the CLI is ``tvmfuse/cli.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError

USAGE_EXAMPLE = ("tvmfuse compare zoo:mobilenet_v2 --targets x86-avx512,x86-avx512:int8,x86-host,cuda-sm90 "
                 "--peers onnxruntime,openvino -o report/")


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="build targets, time them against each other and peers, write a report "
                       "(report.json, report.md, index.html)", description=f"e.g. {USAGE_EXAMPLE}")
    p.add_argument("model", nargs="?", help="an .onnx file or zoo:NAME")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2,...",
                   help="static shape for an input with dynamic dims (repeatable)")
    p.add_argument("--targets", metavar="ARM[,ARM...]", help="arms TARGET[:fp32|:fp16|:int8][@LOGS], e.g. "
                   "x86-avx512,x86-avx512:int8,x86-host@none,cuda-sm90 (@none: no tuning logs; @DIR: that folder)")
    p.add_argument("--peers", default="onnxruntime", help="onnxruntime and/or openvino, comma-separated, or "
                   "'none' (default onnxruntime)")
    p.add_argument("--baseline", help="the arm or peer ratios are taken against (default: the first arm)")
    p.add_argument("--calib", metavar="DATA", help="INT8 calibration data (.npz or .npy folder; default: "
                       "the comparison inputs)")
    p.add_argument("--int8-method", default="entropy", help="minmax, entropy or percentile (default entropy)")
    p.add_argument("--inputs", metavar="X.npz", help="input batches (.npz named after the inputs, or a folder "
                   "of .npy); default 4 seeded random batches")
    p.add_argument("--labels", metavar="Y.npy", help="integer labels, one per input batch: adds accuracy")
    p.add_argument("--threads", type=int, help="threads for every contender (default: this process's CPU budget)")
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                   help="timing budget; rounds stop earlier when every ratio's 95%% interval is within +-2%% "
                   "(default 60)")
    p.add_argument("--logs", metavar="DIR", help="tuning logs for arms without @LOGS (default: the shipped logs)")
    p.add_argument("--seed", type=int, default=0, help="random inputs and round order (default 0)")
    p.add_argument("--no-profile", action="store_true", help="skip the per-kernel profiles")
    p.add_argument("-o", "--output", metavar="DIR", help="report folder (required to compare or merge)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--render", metavar="DIR", help="re-render DIR/report.json into report.md and index.html")
    mode.add_argument("--measure-only", metavar="DIR", help="measure the libraries of a compare folder on this "
                      "machine; write DIR/measured-<host>.json (or -o FILE)")
    mode.add_argument("--merge", nargs="+", metavar="REPORT.json", help="combine reports from several machines "
                      "into -o DIR")
    from ..cache.cli import add_flags as add_cache_flags

    add_cache_flags(p)
    p.set_defaults(func=cmd_compare)


def _peers(text: str) -> list[str]:
    return [] if text.strip() == "none" else [t.strip() for t in text.split(",") if t.strip()]


def cmd_compare(args: argparse.Namespace) -> int:
    from ..tensors import parse_shape
    from .report import Report

    if args.render:
        out = Report.load(args.render).write(args.render, formats=("md", "html"))
        print(f"rendered {out / 'report.md'} and {out / 'index.html'}")
        return 0
    if args.measure_only:
        from .remote import measure_only

        path = measure_only(args.measure_only, args.output, budget=args.budget, threads=args.threads,
                            profile=not args.no_profile, progress=not args.quiet)
        print(f"wrote {path}")
        return 0
    if args.output is None:
        raise InputError("-o DIR is required: the report folder")
    if args.merge:
        from .remote import merge

        merge(args.merge, args.output)
        print(f"wrote {Path(args.output) / 'report.json'}, report.md and index.html")
        return 0
    if not args.model or not args.targets:
        raise InputError(f"give a model and --targets, e.g. {USAGE_EXAMPLE}")
    if args.labels and not args.inputs:
        raise InputError("--labels needs --inputs (the labels belong to those inputs)")
    from .run import compare

    shapes = dict(parse_shape(s) for s in args.shape) if args.shape else None
    report = compare(args.model, args.targets, peers=_peers(args.peers), baseline=args.baseline, calib=args.calib,
                     int8_method=args.int8_method, inputs=args.inputs, labels=args.labels, threads=args.threads,
                     budget=args.budget, logs=args.logs, seed=args.seed, output=args.output, shapes=shapes,
                     profile=not args.no_profile, progress=not args.quiet)
    print(summary(report))
    print(f"wrote {Path(args.output) / 'report.json'}, report.md and index.html")
    return 0


def summary(report) -> str:
    """A few lines for the terminal: each row's status and median, and the ratios."""
    lines = []
    for r in report.rows:
        lat = r.get("latency")
        lines.append(f"  {r['name']:<28} {r['status']:<13} " + (f"p50 {lat['p50']:.3f} ms" if lat else r["reason"]))
    for r in report.data["ratios"]:
        lo, hi = r["ci"]
        interval = f"[{lo:.3f}, {hi:.3f}]" if hi is not None else "[unbounded]"
        lines.append(f"  {r['contender']} / {r['baseline']}: {r['ratio']:.3f}x {interval}")
    return "\n".join(lines)
