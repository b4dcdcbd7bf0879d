"""One-layer models on an NVIDIA GPU: tvmfuse's CUDA rules against TVM's default CUDA pipeline (dlight).

    python bench/cuda_kernels.py [--target cuda-sm90] [--repeat 50] [--kinds depthwise,conv,dense]
    python bench/cuda_kernels.py --bandwidth [--precision fp16] [--repeat 50]

Each layer of ``tests/schedules/test_cuda_rules.py``'s grid (depthwise, conv2d, dense, each with its
epilogue) is one ONNX model, compiled by tvmfuse and by plain TVM (``from_onnx`` + ``tvm.compile``);
both are GPU-synchronized medians of ``repeat`` x 10 runs (``time_evaluator``), checked against each other.
Prints a Markdown table with the layer's FLOPs and tvmfuse's GFLOP/s.

``--bandwidth``: the depthwise layers of 56x56 and larger (issue #50's bar: at least 60% of the measured copy
bandwidth), FP32 or fp16. The layer's kernel alone (its partition kernel, built and timed by itself: the
model's input and output casts of an fp16 build left out) against a copy kernel moving as many bytes (its
reads and writes, in the kernel's dtype, 4 elements a thread), both GPU-timed (``time_evaluator``). The
kernel's bytes are what it must move at least: every argument read once and its output written once. The
kernel is timed again with the other number of channels a thread (fp16's default is two, FP32's one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402

from common import table  # noqa: E402


def _grid():
    """``tests/schedules/test_cuda_rules.py`` (its layer grid and model builders), loaded by path: the
    folder name ``schedules`` is tvmfuse's package's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cuda_rule_grid", ROOT / "tests/schedules/test_cuda_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(ex, args, repeat: int) -> tuple[float, np.ndarray]:
    import tvm
    from tvm import relax

    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    inputs = [tvm.runtime.tensor(a, dev) for a in args]
    out = vm["main"](*inputs)
    out = (out[0] if not isinstance(out, tvm.runtime.Tensor) else out).numpy()
    timer = vm.time_evaluator("main", dev, number=10, repeat=repeat)
    return statistics.median(timer(*inputs).results) * 1e3, out


def _flops(kind: str, case) -> float:
    if kind == "depthwise":
        c, hw, k, s, _, _ = case
        return 2 * c * (hw // s) ** 2 * k * k
    if kind == "conv":
        cin, cout, hw, k, s, _, _ = case
        return 2 * cout * (hw // s) ** 2 * cin * k * k
    m, k, n, _ = case
    return 2 * m * k * n


def measure(kind: str, case, target: str, repeat: int) -> dict:
    import tvm

    import tvmfuse
    from tvmfuse import frontend, targets
    model, _ = _grid()._model(kind, case)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    cm = tvmfuse.compile(model, target=target)
    ours_ms, ours = _time(cm.executable, [x], repeat)
    plain = tvm.compile(frontend.import_model(model).mod, target=targets.resolve(target).tvm_target())
    plain_ms, ref = _time(plain, [x], repeat)
    scale = float(np.abs(ref).max()) or 1.0
    return {"layer": f"{kind} " + " ".join(str(v) for v in case), "tvmfuse us": f"{ours_ms * 1e3:.1f}",
            "plain TVM us": f"{plain_ms * 1e3:.1f}", "speed-up": f"{plain_ms / ours_ms:.2f}x",
            "tvmfuse GFLOP/s": f"{_flops(kind, case) / ours_ms / 1e6:.0f}",
            "max diff (of max)": f"{np.abs(ours - ref).max() / scale:.1e}"}


def _kernel_ms(func, target, repeat: int, arrays=None) -> tuple[float, list]:
    """GPU-timed median ms of one PrimFunc (``main``) on random arguments in its dtypes, and those arguments."""
    import tvm

    with target:
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    if arrays is None:
        arrays = [rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)) for p in func.params]
    tensors = [tvm.runtime.tensor(a, dev) for a in arrays]
    timer = getattr(lib, "mod", lib).time_evaluator("main", dev, number=10, repeat=repeat)
    return statistics.median(timer(*tensors).results) * 1e3, arrays


def copy_func(elements: int, dtype: str):
    """A copy of ``elements`` values (a multiple of 4 is taken): 4 consecutive elements a thread, 256 threads a
    block, the reference a kernel's bandwidth is held to."""
    from tvm import s_tir, te

    n = -(-elements // 1024) * 1024
    src = te.placeholder((n,), dtype, name="src")
    dst = te.compute((n,), lambda i: src[i], name="dst")
    sch = s_tir.Schedule(te.create_prim_func([src, dst]))
    (loop,) = sch.get_loops(sch.get_sblock("dst"))
    block, thread, vec = sch.split(loop, [None, 256, 4])
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.vectorize(vec)
    return sch.mod["main"]


def kernel_bytes(func) -> int:
    """Bytes a kernel moves at least: each argument (inputs, weights, output) once."""
    return sum(int(np.prod([int(d) for d in p.ty.shape])) * np.dtype(str(p.ty.dtype)).itemsize
               for p in func.params)


def bandwidth_kernels(case, target: str, precision: str) -> tuple:
    """A depthwise layer's partition kernel scheduled by default, its channels a thread (1 or 2:
    ``depthwise_conv2d.pairs_for``) and the same kernel with the other number (None where no tile fits): the
    figure that says whether fp16's default of two (half2 reads of an interleaved tile) pays."""
    from tvm import s_tir

    import tvmfuse
    from tvmfuse import targets
    from tvmfuse.passes.lower import make_kernel
    from tvmfuse.schedules.cuda import depthwise_conv2d

    model, _ = _grid()._model("depthwise", case)
    spec = targets.resolve(target)
    cm = tvmfuse.compile(model, target=spec, precision=precision)
    (fn, _), = cm.record.kernels.values()
    func, _ = make_kernel(fn, spec)
    plain, _ = make_kernel(fn, spec, schedule=False)
    sms = spec.backend().sms
    pairs = depthwise_conv2d.kernel_default(plain, sms).pairs
    other = depthwise_conv2d.kernel_default(plain, sms, 3 - pairs)
    sch = s_tir.Schedule(plain)
    return func, pairs, sch.mod["main"] if other is not None and depthwise_conv2d.schedule(sch, sms, other) else None


def bandwidth(case, target: str, precision: str, repeat: int) -> dict:
    """A depthwise layer's kernel against a copy of as many bytes (module docstring)."""
    from tvmfuse import targets

    tvm_target = targets.resolve(target).tvm_target()
    func, pairs, other = bandwidth_kernels(case, target, precision)
    ms, _ = _kernel_ms(func, tvm_target, repeat)
    other_ms = _kernel_ms(other, tvm_target, repeat)[0] if other is not None else float("nan")
    moved = kernel_bytes(func)
    dtype = str(func.params[0].ty.dtype)
    copy_ms, _ = _kernel_ms(copy_func(moved // 2 // np.dtype(dtype).itemsize, dtype), tvm_target, repeat)
    ours, copy = moved / ms / 1e6, moved / copy_ms / 1e6
    return {"layer": "depthwise " + " ".join(str(v) for v in case), "dtype": dtype, "MB": f"{moved / 1e6:.2f}",
            "channels a thread": pairs, "kernel us": f"{ms * 1e3:.1f}",
            f"{3 - pairs} a thread us": f"{other_ms * 1e3:.1f}", "kernel GB/s": f"{ours:.0f}",
            "copy us": f"{copy_ms * 1e3:.1f}", "copy GB/s": f"{copy:.0f}", "of copy": f"{ours / copy:.0%}"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--kinds", default="depthwise,conv,dense")
    p.add_argument("--bandwidth", action="store_true", help="depthwise layers of 56x56 and larger against a copy")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16"], help="with --bandwidth")
    args = p.parse_args(argv)
    from tvmfuse import cuda_driver
    CASES = _grid().CASES

    if not cuda_driver.cuda_available():
        print("bench/cuda_kernels.py needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
    if args.bandwidth:
        rows = [bandwidth(case, args.target, args.precision, args.repeat) for kind, case in CASES
                if kind == "depthwise" and case[1] >= 56]
        print(f"target {args.target}, batch 1, GPU-timed medians of {args.repeat} x 10 runs\n")
        print(table(rows, list(rows[0])))
        return 0
    kinds = args.kinds.split(",")
    rows = []
    for kind, case in CASES:
        if kind in kinds:
            rows.append(measure(kind, case, args.target, args.repeat))
            print(rows[-1], flush=True)
    print(f"\ntarget {args.target}, batch 1, GPU-synchronized medians of {args.repeat} x 10 runs\n")
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
