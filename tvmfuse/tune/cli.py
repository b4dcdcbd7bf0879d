"""``tvmfuse tune``: its arguments and the command (the rest of the CLI is ``tvmfuse/cli.py``)."""

from __future__ import annotations

from pathlib import Path

from .. import targets
from ..errors import InputError
from ..tensors import parse_shape


def _shapes(args) -> dict | None:
    return dict(parse_shape(s) for s in args.shape) if args.shape else None


def _consts(args) -> dict | None:
    from ..tensors import parse_const_args

    return parse_const_args(args.const)


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="tune a model's kernels with MetaSchedule + XGBoost into the tuning logs")
    p.add_argument("model", nargs="?", help="an .onnx file or zoo:NAME (see `tvmfuse zoo`)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2,...",
                   help="static shape for an input with dynamic dims (repeatable)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE",
                   help="pin an input to VALUE, as for compile (repeatable)")
    p.add_argument("--target", default=targets.DEFAULT, help=f"target name (default {targets.DEFAULT}: this machine)")
    p.add_argument("--trials", type=int, default=64, help="measured candidates per kernel (default 64)")
    p.add_argument("--trials-per-iter", type=int, default=16, help="candidates per measured batch (default 16)")
    p.add_argument("--logs", metavar="DIR", help="tuning logs folder (default: tuning_logs/ or $TVMFUSE_TUNING_LOGS)")
    p.add_argument("--resume", action="store_true", help="continue the newest unfinished run for this target")
    p.add_argument("--rpc", metavar="HOST:PORT", help="measure on devices registered with this TVM RPC tracker")
    p.add_argument("--key", help="device key of the RPC servers (with --rpc)")
    offline = p.add_argument_group("offline tuning (a device no tracker reaches: a lent GPU)")
    offline.add_argument("--export-candidates", metavar="DIR", help="build every kernel's candidate schedules into "
                         "DIR (one library per kernel) instead of tuning here")
    offline.add_argument("--precision", choices=["fp32", "fp16", "int8"], default="fp32",
                         help="with --export-candidates: the precision the model will be compiled in (int8: "
                         "quantized with --table)")
    offline.add_argument("--table", metavar="TABLE", help="with --precision int8: the calibration table the "
                         "library will be quantized with (tvmfuse quantize --table TABLE)")
    offline.add_argument("--max-candidates", type=int, metavar="N",
                         help="with --export-candidates: per kernel, the default and the N - 1 the cost model "
                         "learnt from imported results ranks fastest (all until it has learnt enough)")
    offline.add_argument("--import-results", metavar="FILE", help="write the fastest correct candidate of each "
                         "kernel timed in FILE (bench/device/time_candidates.py) into the tuning logs, and teach "
                         "the cost model every correct candidate's time")
    offline.add_argument("--candidates", metavar="DIR", help="with --import-results: the candidates folder "
                         "(default: FILE's folder)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    from ..cache.cli import add_flags as add_cache_flags

    add_cache_flags(p)
    p.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    from .measure import RPCSpec, TuningError
    from .tuner import tune

    if args.import_results:
        return _import_results(args)
    if args.model is None:
        raise InputError("tune: give a MODEL (or --import-results FILE)")
    if (args.table or args.precision != "fp32") and not args.export_candidates:
        raise InputError("tune: --precision and --table go with --export-candidates (online tuning is FP32)")
    if args.export_candidates:
        from .offline import export_candidates

        files = export_candidates(args.model, args.target, args.export_candidates, _shapes(args), args.precision,
                                  args.max_candidates, args.logs, _consts(args), args.table)
        print(f"wrote the candidates of {len(files)} kernel(s) to {args.export_candidates}; time them on the device "
              f"with bench/device/time_candidates.py, then tvmfuse tune --import-results RESULTS.json")
        return 0
    if bool(args.rpc) != bool(args.key):
        raise TuningError("--rpc HOST:PORT and --key KEY go together")
    rpc = RPCSpec.parse(args.rpc, args.key) if args.rpc else None
    report = tune(args.model, target=args.target, trials=args.trials, logs=args.logs, resume=args.resume, rpc=rpc,
                  shapes=_shapes(args), trials_per_iter=args.trials_per_iter, progress=not args.quiet,
                  consts=_consts(args))
    print(report.table())
    print(f"{report.records_written} record(s) written to {report.logs} in {report.seconds:.0f} s")
    return 0


def _import_results(args) -> int:
    from .offline import import_results

    directory = args.candidates or str(Path(args.import_results).parent)
    outcome = import_results(args.import_results, directory, args.logs)
    written = {k: v for k, v in outcome.items() if "candidate" in v}
    for kernel, v in sorted(outcome.items()):
        if "candidate" in v:
            gain = f" ({v['default_us'] / v['us']:.2f}x the default)" if v.get("default_us") else ""
            print(f"{kernel}: {v['candidate']} {v['us']:.1f} us{gain}")
        else:
            print(f"{kernel}: skipped, {v['skipped']}")
    samples = next((v["model_samples"] for v in written.values() if "model_samples" in v), None)
    learnt = f"; the cost model has {samples} sample(s)" if samples is not None else ""
    print(f"{len(written)} record(s) written to the tuning logs{learnt}")
    return 0
