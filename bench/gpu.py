"""Batch-1 latency on an NVIDIA GPU: tvmfuse against plain TVM (and PyTorch where installed), in one run.

    python bench/gpu.py [--models mobilenet_v2,resnet50] [--target cuda-sm90] [--precisions fp32,fp16,int8]
                        [--repeat 50] [--torch [--torch-compile]] [--json OUT.json]

Needs a CUDA GPU. For each zoo model:

- tvmfuse: ``tvmfuse.compile(model, target)``, checked against onnxruntime (CPU) on the same seeded input;
- plain TVM: from_onnx + ``tvm.compile`` with TVM's default CUDA pipeline (dlight schedules);
- PyTorch (only with ``--torch`` and torchvision installed): torchvision's model of the same name and
  architecture (its own random weights), eager with cuDNN (``cudnn.benchmark``, channels_last), in the row's
  precision (``.half()`` for fp16), as a GPU user's everyday reference; with ``--torch-compile`` also under
  ``torch.compile(mode="reduce-overhead")`` (Inductor's kernels in a CUDA graph), with its compile time.
  FP32 rows time eager twice: in float32 arithmetic (TF32 off, the ``PyTorch`` column, what tvmfuse's FP32
  computes) and as PyTorch runs by default (``PyTorch TF32``: cuDNN's convs on TF32 tensor cores, 10-bit
  mantissas, errors near 1e-3 like fp16's).

fp16 rows are tvmfuse's ``precision="fp16"`` build against onnxruntime FP32 (relative L2 error); int8 rows are
``tvmfuse.quantize`` calibrated (minmax) on 4 random batches, a latency row whose error column only says the
library runs (random ranges are not real ones; the kernels' exactness is tested in tests/schedules/test_cuda_int8.py)
and which PyTorch sits out (its eager CUDA convs have no INT8). Plain TVM is FP32 in every row (its fp16 path,
ToMixedPrecision, fails on the clip of these graphs).

All timings are GPU-synchronized medians (``time_evaluator`` for TVM, CUDA events for PyTorch). Prints a
Markdown table with the ratios to plain TVM.

(Not named ``cuda.py``: with ``bench/`` on ``sys.path`` that file would shadow the ``cuda`` package whose
``cuda.bindings.nvrtc`` TVM imports to compile kernels.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

# bench/profile.py would shadow the standard library's profile, which torch's import reaches (cProfile): load the
# real one before this folder goes on the path (the round's PyTorch rows failed on it, 2026-11-27).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
import cProfile  # noqa: E402,F401

sys.path.insert(0, str(_HERE))
from common import inputs_for, ort_session, table  # noqa: E402

import numpy as np  # noqa: E402

DEFAULT_MODELS = ["mobilenet_v2", "resnet50", "efficientnet_lite0"]
TORCHVISION = {"mobilenet_v2": "mobilenet_v2", "resnet50": "resnet50", "resnet18": "resnet18"}


def plain_tvm_ms(model, spec, x: dict, repeat: int) -> tuple[float, np.ndarray]:
    import tvm
    from tvm import relax

    from tvmfuse import frontend

    imported = frontend.import_model(model)
    ex = tvm.compile(imported.mod, target=spec.tvm_target())
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x[i.name], dev) for i in imported.inputs]
    out = vm["main"](*args)
    out = (out[0] if not isinstance(out, tvm.runtime.Tensor) else out).numpy()
    timer = vm.time_evaluator("main", dev, number=10, repeat=repeat)
    return statistics.median(timer(*args).results) * 1e3, out


def torch_ms(name: str, shape, repeat: int, precision: str = "fp32", compiled: bool = False,
             tf32: bool = False) -> dict | None:
    """PyTorch's median ms (``ms``) for torchvision's model of ``name``: eager, or with ``compiled``
    ``torch.compile(mode="reduce-overhead")`` (Inductor's kernels replayed from a CUDA graph, as tvmfuse's
    are), whose first calls' time is ``compile_s``; ``error`` instead when PyTorch raised. ``tf32``: float32
    convs and matmuls on TF32 tensor cores (PyTorch's default for cuDNN convs), else in float32. None without
    torch/torchvision or for a model torchvision does not have."""
    try:
        import torch
        import torchvision
    except ImportError:
        return None
    if name not in TORCHVISION:
        return None
    try:
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = tf32
        net = getattr(torchvision.models, TORCHVISION[name])().eval().cuda().to(memory_format=torch.channels_last)
        x = torch.randn(*shape, device="cuda").to(memory_format=torch.channels_last)
        if precision == "fp16":
            net, x = net.half(), x.half()
        start = time.perf_counter()
        if compiled:
            net = torch.compile(net, mode="reduce-overhead")
        times = []
        with torch.inference_mode():
            for _ in range(10):
                net(x)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - start
            for _ in range(repeat):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(10):
                    net(x)
                end.record()
                torch.cuda.synchronize()
                times.append(begin.elapsed_time(end) / 10)
        return {"ms": statistics.median(times), "compile_s": compile_s}
    except Exception as e:  # noqa: BLE001 - a contender that fails is reported in its row, the round goes on
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}


def _build(model, name: str, target: str, precision: str, logs=None):
    import tvmfuse
    from tvmfuse import zoo

    if precision == "int8":
        return tvmfuse.quantize(model, calib="random:4", method="minmax", target=target,
                                shapes=zoo.default_shapes(name), logs=logs)
    return tvmfuse.compile(model, target=target, shapes=zoo.default_shapes(name), precision=precision, logs=logs)


def measure(name: str, target: str, repeat: int, with_torch: bool, precision: str = "fp32",
            with_compile: bool = False, untuned: bool = False) -> dict:
    from tvmfuse import targets, zoo

    spec = targets.resolve(target)
    model = zoo.get(name)
    start = time.perf_counter()
    cm = _build(model, name, target, precision)
    compile_s = time.perf_counter() - start
    x = inputs_for(cm.inputs)
    ref = ort_session(model).run(None, x)[0]
    ours = cm.run(x)[0]
    tuned = {}
    if untuned:  # the same build without tuning logs, timed in alternating blocks with the tuned one
        base = _build(model, name, target, precision, logs=False)
        blocks = [(cm.benchmark(x, repeat=repeat)["median_ms"], base.benchmark(x, repeat=repeat)["median_ms"])
                  for _ in range(3)]
        ours_ms, base_ms = (float(np.median([b[i] for b in blocks])) for i in (0, 1))
        tuned = {"tuned kernels": len(cm.tuning_logs.get("applied", [])), "untuned ms": f"{base_ms:.3f}",
                 "tuned / untuned": f"{ours_ms / base_ms:.2f}x"}
    else:
        ours_ms = cm.benchmark(x, repeat=repeat)["median_ms"]
    plain_ms, plain_out = plain_tvm_ms(model, spec, x, repeat)
    scale = float(np.abs(ref).max()) or 1.0
    rel = float(np.linalg.norm(ours - ref) / (np.linalg.norm(ref) or 1.0))
    row = {"model": name, "precision": precision, "tvmfuse ms": f"{ours_ms:.3f}", "plain TVM ms": f"{plain_ms:.3f}",
           "tvmfuse / plain TVM": f"{ours_ms / plain_ms:.2f}x",
           "max abs diff vs onnxruntime (tvmfuse / plain)":
               f"{np.abs(ours - ref).max() / scale:.1e} / {np.abs(plain_out - ref).max() / scale:.1e} (of max)",
           "tvmfuse relative L2 error": f"{rel:.1e}", "compile s": f"{compile_s:.1f}", **tuned}
    contenders = [("PyTorch", False, False)] + [("PyTorch TF32", False, True)] * (precision == "fp32") \
        + [("torch.compile", True, False)] * with_compile
    for label, compiled, tf32 in contenders if with_torch and precision != "int8" else []:
        t = torch_ms(name, cm.inputs[0].shape, repeat, precision, compiled, tf32) or {}
        row[f"{label} ms"] = f"{t['ms']:.3f}" if "ms" in t else t.get("error", "-")
        row[f"tvmfuse / {label}"] = f"{ours_ms / t['ms']:.2f}x" if "ms" in t else "-"
        if compiled and "compile_s" in t:
            row["torch.compile s"] = f"{t['compile_s']:.1f}"
    return row


def _gpu_name() -> str:
    import tvm

    return str(tvm.cuda(0).device_name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--precisions", default="fp32", help="comma-separated: fp32, fp16, int8 (default fp32)")
    p.add_argument("--torch", action="store_true", help="also time torchvision's model (needs torch + GPU)")
    p.add_argument("--torch-compile", action="store_true",
                   help="with --torch, also time it under torch.compile(mode='reduce-overhead')")
    p.add_argument("--untuned", action="store_true",
                   help="also time each model built without tuning logs (alternating blocks with the tuned build)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON, after each model")
    args = p.parse_args(argv)
    from tvmfuse import cuda_driver

    if not cuda_driver.cuda_available():
        print("bench/gpu.py needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    import json

    from tvmfuse.comparison.environment import cpu_name, versions

    rows = []
    for m in args.models.split(","):
        for precision in args.precisions.split(","):
            rows.append(measure(m, args.target, args.repeat, args.torch, precision, args.torch_compile,
                                 args.untuned))
            if args.json:  # written as it comes: a call cut off at its limit keeps the rows done
                Path(args.json).write_text(json.dumps({"target": args.target, "repeat": args.repeat,
                                                       "device": _gpu_name(), "host cpu": cpu_name(),
                                                       "versions": versions(),
                                                       "rows": rows}, indent=1))
    columns = list(dict.fromkeys(c for r in rows for c in r))
    print(f"target {args.target}, batch 1, GPU-synchronized medians of {args.repeat} x 10 runs\n")
    print(table(rows, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
