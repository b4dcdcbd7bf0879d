"""One-layer models on an NVIDIA GPU: tvmfuse's CUDA rules against TVM's default CUDA pipeline (dlight).

    python bench/cuda_kernels.py [--target cuda-sm90] [--repeat 50] [--kinds depthwise,conv,dense]

Each layer of ``tests/schedules/test_cuda_rules.py``'s grid (depthwise, conv2d, dense, each with its
epilogue) is one ONNX model, compiled by tvmfuse and by plain TVM (``from_onnx`` + ``tvm.compile``);
both are GPU-synchronized medians of ``repeat`` x 10 runs (``time_evaluator``), checked against each other.
Prints a Markdown table with the layer's FLOPs and tvmfuse's GFLOP/s.
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cuda-sm90")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--kinds", default="depthwise,conv,dense")
    args = p.parse_args(argv)
    from tvmfuse import cuda_driver
    CASES = _grid().CASES

    if not cuda_driver.cuda_available():
        print("bench/cuda_kernels.py needs a CUDA GPU; none is visible", file=sys.stderr)
        return 1
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
