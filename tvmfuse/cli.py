"""Command line: argument parsing only; every command calls the Python API.

Exit status: 0 on success, 2 on bad usage or bad input (one line on stderr naming the problem).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from pathlib import Path

import numpy as np

from .errors import INTERFACE, InputError, TvmfuseError
from .targets import ForeignTargetWarning
from .heap import build_heap
from .tensors import numpy_file_kind, parse_shape


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas, such as 0.5,0.5,0.5") \
            from None


def _shapes(args) -> dict | None:
    return dict(parse_shape(s) for s in args.shape) if args.shape else None


def _consts(args) -> dict | None:
    from .tensors import parse_const_args

    return parse_const_args(getattr(args, "const", None))


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an .onnx file or zoo:NAME (see `tvmfuse zoo`)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2,...",
                   help="static shape for an input with dynamic dims (repeatable)")
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE",
                   help="pin an input fixed where the model is deployed (e.g. a sample rate) to VALUE (numbers "
                        "separated by commas): folded like a weight, so an If branching on it keeps its taken "
                        "branch; the library has no such input (repeatable)")


def _print_opcheck(cm) -> None:
    checks = cm.opcheck()
    worst = max((c.max_abs_error for c in checks), default=0.0)
    print(f"op-check: {len(checks)} partition calls match the unfused reference (largest error {worst:.3g})")


def cmd_compile(args) -> int:
    from . import cli_recorded as recorded

    logs, shapes, consts = False if args.no_logs else args.logs, _shapes(args), _consts(args)
    if not args.opcheck and recorded.compile_recorded(args, logs, shapes, consts):
        return 0
    from . import api

    cm = api.compile(args.model, target=args.target, shapes=shapes, progress=not args.quiet, logs=logs,
                     layout=args.layout, cuda_graph=not args.no_cuda_graph, precision=args.precision,
                     consts=consts)
    if args.opcheck:
        _print_opcheck(cm)
    path = cm.export(args.output)
    recorded.report_compile(path, cm.target.name, cm.build_info, cm.manifest()["scheduled_by"], cm.cache_info,
                            cm.tuning_logs)
    return 0


def cmd_quantize(args) -> int:
    from . import cli_recorded as recorded
    from .quant.table import CalibrationError

    if args.percentile is not None and args.method != "percentile":
        raise CalibrationError(f"--percentile applies to --method percentile, not {args.method}")
    logs = False if args.no_logs else args.logs
    preprocess = None
    if any(v is not None for v in (args.preprocess, args.mean, args.std, args.image_layout, args.bgr)):
        from .quant.images import preprocess_of

        preprocess = preprocess_of(args.preprocess, mean=args.mean, std=args.std, layout=args.image_layout,
                                   bgr=args.bgr)
    percentile, shapes, consts = 99.99 if args.percentile is None else args.percentile, _shapes(args), _consts(args)
    if recorded.quantize_recorded(args, logs, shapes, consts, preprocess, percentile):
        return 0
    from . import api  # after the cached answer: 0.18 s of imports it does without

    cm = api.quantize(args.model, calib=args.calib, method=args.method, target=args.target, table=args.table,
                      shapes=shapes, percentile=percentile, progress=not args.quiet, logs=logs,
                      preprocess=preprocess, consts=consts, weight_bits=args.weight_bits,
                      cuda_graph=not args.no_cuda_graph)
    path = cm.export(args.output)
    recorded.report_quantize(path, cm.target.name, cm.quantization, cm.cache_info)
    if args.calib and args.table:
        print(f"wrote calibration table {args.table} ({cm.quantization['method']})")
    return 0


def load_inputs(path: str | None, model) -> dict:
    """Inputs from an .npz (keys = input names), or seeded random inputs when no file is given."""
    from .runtime import random_inputs

    if path is None:
        return random_inputs(model.inputs)
    if Path(path).is_file() and numpy_file_kind(path) is None:
        raise InputError(f"--inputs {path}: not an .npz file (numpy.savez writes one: an array per input name)")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array, not named arrays (write it with numpy.savez)")
        with data:
            return {k: data[k] for k in data.files}
    except Exception as e:  # noqa: BLE001 - numpy raises OSError, ValueError, EOFError, BadZipFile, ... on bad files
        lines = str(e).strip().splitlines()
        raise InputError(f"--inputs {path}: cannot read as .npz ({lines[0][:200] if lines else type(e).__name__})") \
            from None


def save_outputs(path: str, arrays: dict) -> str:
    """Write ``arrays`` to the .npz ``path`` (``.npz`` appended if missing, as numpy does) through a temporary
    file beside it and a rename, so a failed write never leaves a half-written file; return the path written."""
    import os

    final = path if path.endswith(".npz") else path + ".npz"
    tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{os.getpid()}.tmp")
    try:
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # gone after the rename; left by a failed write
    except OSError as e:
        raise TvmfuseError(f"--save {path}: cannot write ({e.strerror or e})") from None
    return final


def cmd_run(args) -> int:
    from .runtime import load

    model = load(args.library, device=args.device)
    inputs = load_inputs(args.inputs, model)
    outputs = model.run(inputs)
    for info, out in zip(model.outputs, outputs):
        print(f"{info.name}: shape {tuple(out.shape)} {out.dtype} min {out.min():.6g} max {out.max():.6g} "
              f"mean {out.mean():.6g}")
    if args.save:
        print(f"wrote {save_outputs(args.save, {i.name: o for i, o in zip(model.outputs, outputs)})}")
    if args.benchmark:
        r = model.benchmark(inputs, repeat=args.repeat, warmup=args.warmup)
        print(f"latency: median {r['median_ms']:.3f} ms, p10 {r['p10_ms']:.3f} ms, p90 {r['p90_ms']:.3f} ms, "
              f"min {r['min_ms']:.3f} ms, max {r['max_ms']:.3f} ms ({r['repeat']} runs after {r['warmup']} warm-up)")
        if r["spread"] > WIDE_SPREAD:
            warnings.warn(f"the runs spread over {r['spread']:.0%} of the median (p10 to p90): something else ran, "
                          "or the clock moved; the median is worth little. Time on a quiet machine, and compare "
                          "two builds with `tvmfuse compare` (interleaved runs, confidence intervals)")
    return 0


def cmd_info(args) -> int:
    from .model_info import info

    print(info(args.model, shapes=_shapes(args), consts=_consts(args)).format())
    return 0


def cmd_partition(args) -> int:
    if args.opcheck:
        from . import api

        cm = api.compile(args.model, target=args.target, shapes=_shapes(args), consts=_consts(args))
        print(cm.partition_report().format())
        _print_opcheck(cm)
        return 0
    from .partition_report import partitions

    print(partitions(args.model, target=args.target, shapes=_shapes(args), consts=_consts(args)).format())
    return 0


def cmd_zoo(args) -> int:
    from . import zoo

    for name in zoo.names():
        print(f"zoo:{name}")
    return 0


def cmd_bundle(args) -> int:
    from .runtime.bundle import runtime_bundle

    made = runtime_bundle(args.dest, args.ffi_wheel)
    print(f"wrote {made['path']} ({made['bytes'] / 2**20:.1f} MiB, tvm_ffi for {made['python']}); there: "
          f"PYTHONPATH={made['path']} TVM_USE_RUNTIME_LIB=1 python -m tvmfuse run LIB.so")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import targets
    from .cache.cli import add_flags as add_cache_flags
    from .quant.images import PRESETS
    from .version import __version__

    parser = argparse.ArgumentParser(prog="tvmfuse", description="Compile ONNX CNNs into fused shared libraries.")
    parser.add_argument("--version", action="version", version=f"tvmfuse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a model into a .so with a JSON manifest")
    _add_model_args(p)
    p.add_argument("--target", default=targets.DEFAULT,
                   help=f"one of {', '.join(targets.names())} (default {targets.DEFAULT}: this machine)")
    p.add_argument("-o", "--output", required=True, help="output library path (.so)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--opcheck", action="store_true",
                   help="check every partition against TVM's unfused path on random inputs (CPU targets)")
    logs = p.add_mutually_exclusive_group()
    logs.add_argument("--logs", metavar="DIR", help="tuning logs folder to apply (default: tuning_logs/ or "
                      "$TVMFUSE_TUNING_LOGS; its <target>/ subfolder is read)")
    logs.add_argument("--no-logs", action="store_true", help="apply no tuning logs")
    p.add_argument("--layout", choices=["blocked", "nchw"], default="blocked",
                   help="activations between conv kernels: blocked NCHW[b]c (default) or plain NCHW")
    p.add_argument("--precision", choices=["fp32", "fp16"], default="fp32",
                   help="fp16 (CUDA targets): float16 weights and activations, float32 accumulation; inputs and "
                        "outputs stay float32 (default fp32)")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="CUDA targets: launch every kernel on each run instead of replaying a captured CUDA graph")
    add_cache_flags(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("quantize", help="calibrate an FP32 model and compile it to INT8 (.so with a JSON manifest)",
                       usage="tvmfuse quantize MODEL (--calib DATA | --table TABLE) -o OUT.so [options]")
    _add_model_args(p)
    p.add_argument("--calib", metavar="DATA", help="calibration data (required unless --table names a saved "
                   "table): a folder of images (JPEG, PNG, ...; with --preprocess); an .npz with one array per "
                   "input, axis 0 the samples, each sample the input's shape without its batch axis; a folder of "
                   ".npy files; or random:N (N random batches: a quick check, warns)")
    images = p.add_argument_group("images given to --calib (the preprocessing the model was trained with)")
    images.add_argument("--preprocess", choices=sorted(PRESETS), help="imagenet: 0..1 then torchvision's "
                        "mean/std; unit: 0..1; symmetric: -1..1; raw: 0..255")
    images.add_argument("--mean", type=_floats, metavar="M[,M,M]", help="per-channel mean, in the scaled units "
                        "(replaces the preset's)")
    images.add_argument("--std", type=_floats, metavar="S[,S,S]", help="per-channel std (replaces the preset's)")
    images.add_argument("--image-layout", choices=["NCHW", "NHWC"], help="the input's layout (default NCHW)")
    images.add_argument("--bgr", action="store_true", default=None, help="channels in BGR order (default RGB)")
    p.add_argument("--method", default="entropy", help="minmax, entropy or percentile (default entropy)")
    p.add_argument("--percentile", type=float, help="percentile kept by --method percentile (default 99.99)")
    p.add_argument("--weight-bits", type=int, choices=(7, 8), help="conv and dense weight codes: 7 ([-64, 64]) or 8 "
                   "(default 7 on a CPU target without VNNI, which then runs them faster, else 8)")
    p.add_argument("--target", default=targets.DEFAULT,
                   help=f"target name (default {targets.DEFAULT}: this machine; calibration always runs on this CPU)")
    p.add_argument("-o", "--output", required=True, help="output library path (.so)")
    p.add_argument("--table", metavar="PATH", help="with --calib: write the calibration table (JSON) here; "
                   "without: load this table instead of calibrating")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    logs = p.add_mutually_exclusive_group()
    logs.add_argument("--logs", metavar="DIR", help="tuning logs folder to apply (as for compile)")
    logs.add_argument("--no-logs", action="store_true", help="apply no tuning logs")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="CUDA targets: launch every kernel on each run instead of replaying a captured CUDA graph")
    add_cache_flags(p)
    p.set_defaults(func=cmd_quantize)

    from .tune.cli import add_parser as add_tune_parser

    add_tune_parser(sub)

    p = sub.add_parser("run", help="run a compiled .so (TVM runtime only)")
    p.add_argument("library", help="a .so written by `tvmfuse compile`")
    p.add_argument("--inputs", help=".npz with one array per input name (default: seeded random inputs)")
    p.add_argument("--save", metavar="OUT.npz", help="write the outputs to an .npz")
    p.add_argument("--benchmark", action="store_true", help="also time the model")
    p.add_argument("--repeat", type=int, default=50, help="timed runs for --benchmark (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bundle", help="write a runtime-only TVM (~20 MB) for running .so files where TVM is not "
                       "installed")
    p.add_argument("dest", help="folder to write; put it on PYTHONPATH there and set TVM_USE_RUNTIME_LIB=1")
    p.add_argument("--ffi-wheel", metavar="WHEEL", help="apache-tvm-ffi wheel for the other machine's Python "
                   "(default: this Python's tvm_ffi)")
    p.set_defaults(func=cmd_bundle)

    p = sub.add_parser("info", help="inputs, op histogram, parameter count and FLOPs of a model")
    _add_model_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("partition", help="show the partitions, the ops left out and why, and a summary")
    _add_model_args(p)
    p.add_argument("--target", default=targets.DEFAULT, help=f"target name (default {targets.DEFAULT}: this machine)")
    p.add_argument("--opcheck", action="store_true",
                   help="also compile, run, and check each partition against the unfused path")
    p.set_defaults(func=cmd_partition)

    from .cache.cli import add_parser as add_cache_parser
    from .comparison.cli import add_parser as add_compare_parser

    add_compare_parser(sub)

    add_cache_parser(sub)

    p = sub.add_parser("zoo", help="list the built-in models")
    p.set_defaults(func=cmd_zoo)
    return parser


# p10-to-p90 width, as a share of the median, past which `run --benchmark` warns: a quiet 2-core machine keeps
# MobileNetV2 within a few percent; the busy one users reported spread 6.7 to 31.1 ms around 15.1.
WIDE_SPREAD = 0.25


@contextlib.contextmanager
def _in_the_clis_words(command: str, held: list):
    """While a command runs: errors name flags, not keyword arguments (``errors.INTERFACE``), and warnings (a
    target this machine cannot run, skipped tuning-log lines, ...) are one line in the CLI's words, not Python's
    ``file:line: UserWarning:`` form with its source line. A library that will not run here is said of the
    library written: that warning waits in ``held`` for the command to succeed, so that an error stays one
    line. Both are put back after, for a caller of :func:`main` that goes on in Python."""
    def show(message, category, filename, lineno, file=None, line=None):
        line = f"tvmfuse {command}: warning: {message}"
        if issubclass(category, ForeignTargetWarning):
            held.append(line)
        else:
            print(line, file=sys.stderr if file is None else file)

    token, saved = INTERFACE.set("cli"), warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = saved
        INTERFACE.reset(token)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .cache.cli import flags_applied

    heap = build_heap() if args.command in ("compile", "quantize") else contextlib.nullcontext()
    held: list[str] = []
    with _in_the_clis_words(args.command, held), flags_applied(args), heap:  # compile and export share the heap
        try:
            status = args.func(args)
        except TvmfuseError as e:
            print(f"tvmfuse {args.command}: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"tvmfuse {args.command}: interrupted", file=sys.stderr)
            return 130
    for line in dict.fromkeys(held):  # once, after the command's own output
        print(line, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
