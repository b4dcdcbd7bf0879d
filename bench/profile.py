"""Where a compiled model's time goes: each kernel's time per inference, summed by kind, then the slowest
conv and dense kernels with their shapes, GFLOP/s and layout.

    python bench/profile.py resnet50 [--target x86-host] [--no-logs] [--top 12]
    python bench/profile.py ppocrv6_rec_small --target x86-avx512      # a corpus model, at its table shape
    python bench/profile.py model.onnx --shape x=1,3,48,320             # any ONNX file, dynamic dims fixed
    python bench/profile.py resnet50 --target cuda-sm90 --precision fp16   # on a GPU (the prepared round)

Times come from the Relax VM's instrument hook (a Python callback around every call), so they include a
microsecond or so of overhead per call: compare kernels within one run, not against other benchmarks. On a
CUDA target the library is built without a CUDA graph (one VM call per kernel) and the hook waits for the
device before and after each call, so a kernel's time is its launch and run, plus the wait's few
microseconds.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import THREADS, inputs_for, named_model, table  # noqa: E402

import numpy as np  # noqa: E402

import tvmfuse  # noqa: E402
from tvmfuse import model_info  # noqa: E402
from tvmfuse.comparison.contenders import kernel_times as instrumented  # noqa: E402
from tvmfuse.passes.kernel_names import kind as kernel_kind  # noqa: E402
from tvmfuse.schedules.computes.partition import anchor_call  # noqa: E402


def kernel_times(cm, runs: int = 10, warmup: int = 3) -> dict[str, list[float]]:
    """Kernel (or VM builtin) name -> its call times in seconds over ``runs`` inferences."""
    runner = cm._get_runner()
    x = inputs_for(cm.inputs)
    for _ in range(warmup):
        runner.run_whole_pool(x)
    sync = None if runner.device_name == "cpu" else runner._dev.sync
    return instrumented(runner._vm, lambda: runner.run_whole_pool(x), runs, sync=sync)


def _anchor_row(name: str, seconds: float, calls: int, cm) -> dict | None:
    """A conv or dense kernel's row: its shape, time per call, GFLOP/s and layout; None for other kernels."""
    fn, layout = cm.record.kernels.get(name, (None, None))
    call = anchor_call(fn) if fn is not None else None
    if call is None or call.op.name not in ("relax.nn.conv2d", "relax.matmul"):
        return None
    out, weight = [int(d) for d in call.ty.shape], [int(d) for d in call.args[1].ty.shape]
    if call.op.name == "relax.matmul":
        rows, k = out[0], weight[0]
        flops, what = 2 * rows * k * out[1], f"dense {rows}x{k} x {k}x{out[1]}"
    else:
        flops = 2 * out[0] * out[1] * out[2] * out[3] * weight[1] * weight[2] * weight[3]
        what = (f"{weight[1]}->{out[1]} {weight[2]}x{weight[3]} s{int(call.attrs.strides[0])} "
                f"to {out[2]}x{out[3]}")
    per_call = seconds / calls
    return {"kernel": name, "op": what, "calls": calls, "us per call": f"{per_call * 1e6:.0f}",
            "GFLOP/s": f"{flops / per_call / 1e9:.0f}", "layout": layout.describe()}


def _reduction(func) -> tuple[str, int] | None:
    """The name and multiply-adds of a kernel's main reduction block (the one with the most iterations that
    reduces): padded channels and the packed layouts' split loops included, so every target's INT8 kernel
    reads the same."""
    import tvm
    from tvm import s_tir

    if not isinstance(func, tvm.tirx.PrimFunc):
        return None
    sch = s_tir.Schedule(func)
    found = []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        iters = sch.get(block).iter_vars
        if any(int(iv.iter_type) == 2 for iv in iters):  # CommReduce
            found.append((int(np.prod([int(iv.dom.extent) for iv in iters])), sch.get(block).name_hint))
    if not found:
        return None
    macs, block = max(found)
    return block, macs


def _int8_row(name: str, seconds: float, calls: int, cm) -> dict | None:
    """A quantized kernel's row (it has no FP32 partition record): its reduction's size, the input's shape and
    dtype (the layout), GOP/s."""
    func = next((f for gv, f in cm.mod.functions_items() if gv.name_hint == name), None)
    if not name.startswith("tvmfuse_int8_") or func is None:
        return None
    found = _reduction(func)
    if found is None:
        return None
    block, macs = found
    data = func.params[0].ty
    per_call = seconds / calls
    return {"kernel": name, "op": f"{block}: {macs / 1e6:.1f} M multiply-adds", "calls": calls,
            "us per call": f"{per_call * 1e6:.0f}", "GFLOP/s": f"{2 * macs / per_call / 1e9:.0f}",
            "layout": f"{'x'.join(str(int(d)) for d in data.shape)} {data.dtype}"}


def _source(model: str, shape_args: list[str]):
    """The ModelProto to compile and its input shapes: ``--shape`` values over the model's own (see
    :func:`common.named_model`)."""
    shapes = {}
    for arg in shape_args:
        name, _, dims = arg.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise SystemExit(f"--shape {arg!r}: expected NAME=D,D,... with integer dims") from None
    proto, own = named_model(model)
    return proto, shapes or own


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="zoo name, corpus name (tvmfuse.corpus) or .onnx path")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D,D,...",
                   help="an input's shape (repeatable); corpus models default to their table's shape")
    p.add_argument("--target", default="x86-host")
    p.add_argument("--precision", choices=("fp32", "fp16"), default="fp32", help="fp16: CUDA targets")
    p.add_argument("--no-logs", action="store_true", help="default schedules only")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--int8", metavar="METHOD", help="quantize first (minmax, entropy, percentile) on 2 seeded "
                   "random batches, as bench/int8.py does")
    args = p.parse_args(argv)
    source, shapes = _source(args.model, args.shape)
    logs = False if args.no_logs else None
    if args.int8:
        inputs = model_info.info(source, shapes).inputs  # the inputs' shapes without a build
        batches = [inputs_for(inputs, seed=100 + i) for i in range(2)]
        cm = tvmfuse.quantize(source, calib=batches, method=args.int8, target=args.target, logs=logs,
                              shapes=shapes, cuda_graph=False)
    else:
        cm = tvmfuse.compile(source, target=args.target, logs=logs, shapes=shapes, precision=args.precision,
                             cuda_graph=False)
    times = kernel_times(cm, args.runs)
    per_run = {name: sum(t) / args.runs for name, t in times.items()}
    total = sum(per_run.values())
    kinds = collections.defaultdict(float)
    for name, seconds in per_run.items():
        kinds[kernel_kind(name)] += seconds
    print(f"# {args.model}: {total * 1e3:.2f} ms per inference in kernels and VM builtins, {THREADS} threads, "
          f"target {args.target} {args.precision}, {'no logs' if args.no_logs else 'with logs'}"
          f"{', INT8' if args.int8 else ''}")
    print(table([{"kind": k, "us": f"{s * 1e6:.0f}", "share": f"{100 * s / total:.1f}%"}
                 for k, s in sorted(kinds.items(), key=lambda kv: -kv[1])], ["kind", "us", "share"]))
    rows = [_anchor_row(n, sum(t), len(t), cm) or _int8_row(n, sum(t), len(t), cm)  # INT8: quantized or QDQ
            for n, t in times.items()]
    rows = sorted((r for r in rows if r), key=lambda r: -float(r["us per call"]) * r["calls"])[:args.top]
    if rows:
        print(f"\n# the {len(rows)} conv and dense kernels with the most time per inference ({args.runs} runs)")
        print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
