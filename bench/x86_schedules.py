"""x86 schedules without tuning: depthwise kernel vs the memory roofline, zoo models vs onnxruntime FP32,
and compile time. All measured in one run; contenders are timed in alternation (the machine is shared).

    python bench/x86_schedules.py [--models mobilenet_v2,resnet50,efficientnet_lite0] [--repeat 30]

Bars (issue 4): depthwise 3x3 C=144 56x56 within 1.25x of the roofline; each model at most 1.5x
onnxruntime; resnet50 compile under 60 s.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import THREADS, compile_and_session, ort_session, ours_vs_ort, single_partition, table  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import s_tir, te  # noqa: E402

import tvmfuse  # noqa: E402
from tvmfuse import targets  # noqa: E402


def copy_bandwidth(target) -> float:
    """Bytes/s of a large parallel vectorized copy (read + write), measured now on this machine."""
    n = 64 * 1024 * 1024 // 4
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i], name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_sblock("b"))
    outer, inner = sch.split(i, [None, 4096])
    sch.parallel(outer)
    sch.vectorize(sch.split(inner, [None, 8])[1])
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=target)
    src, dst = tvm.runtime.tensor(np.ones(n, "float32")), tvm.runtime.tensor(np.zeros(n, "float32"))
    seconds = lib.mod.time_evaluator("main", tvm.cpu(), number=5, repeat=5)(src, dst).median
    return 2 * n * 4 / seconds


def depthwise_row(target_name: str, bandwidth: float, repeat: int) -> dict:
    """Depthwise 3x3, C=144, 56x56, stride 1, pad 1, + bias + relu6: the kernel tvmfuse compiles between
    two blocked neighbours (NCHW[b]c in and out), timed alone from memory (against the roofline) and in
    cache (repeated runs); onnxruntime runs the same one-op model, in cache."""
    from onnx import helper, numpy_helper

    from tvmfuse.passes.lower import make_kernel
    from tvmfuse.schedules.computes.blocked import block_for

    c, h = 144, 56
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3)).astype("float32"), "W"),
             numpy_helper.from_array(rng.standard_normal(c).astype("float32"), "B"),
             numpy_helper.from_array(np.array(0, "float32"), "lo"), numpy_helper.from_array(np.array(6, "float32"), "hi")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", 1, [1, c, h, h])],
                              [helper.make_tensor_value_info("y", 1, [1, c, h, h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    spec = targets.resolve(target_name)
    kernel, layout = make_kernel(single_partition(model, spec), spec, blocks={0: block_for(c, spec.vector_bits() // 32)})
    lib = tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), target=spec.tvm_target())
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32"))
            for p in kernel.params]
    hot_ms = lib.mod.time_evaluator("main", tvm.cpu(), number=20, repeat=repeat)(*args).median * 1e3
    # From memory: a 64 MB write evicts the 3.6 MB working set from every cache level before each run.
    once, evict, cold = lib.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=1), np.zeros(16 << 20, "float32"), []
    for _ in range(repeat):
        evict += 1.0
        cold.append(once(*args).mean * 1e3)
    kernel_ms = float(np.median(cold))
    ort_ms = ours_vs_ort(tvmfuse.compile(model, target=target_name, logs=False), ort_session(model),
                         {"x": rng.standard_normal((1, c, h, h)).astype("float32")}, repeat)["onnxruntime"]
    moved = 4 * (2 * c * h * h + c * 9 + c)  # input + output + weights + bias, each once
    roof_ms = moved / bandwidth * 1e3
    return {"kernel": f"depthwise 3x3 C=144 56x56 +bias+relu6 ({layout.describe()})",
            "bytes moved": f"{moved / 1e6:.2f} MB", "roofline ms": f"{roof_ms:.3f}",
            "tvmfuse ms (caches flushed)": f"{kernel_ms:.3f}", "tvmfuse / roofline": f"{kernel_ms / roof_ms:.2f}x",
            "tvmfuse ms (in cache)": f"{hot_ms:.3f}", "onnxruntime ms (in cache)": f"{ort_ms:.3f}"}


def model_row(name: str, target_name: str, repeat: int) -> dict:
    _, cm, sess, x, compile_s = compile_and_session(name, target_name, logs=False)
    ms = ours_vs_ort(cm, sess, x, repeat)
    return {"model": name, "onnxruntime ms": f"{ms['onnxruntime']:.2f}", "tvmfuse ms": f"{ms['tvmfuse']:.2f}",
            "tvmfuse / ORT": f"{ms['tvmfuse'] / ms['onnxruntime']:.2f}x", "compile s": f"{compile_s:.1f}"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="mobilenet_v2,resnet50,efficientnet_lite0")
    p.add_argument("--target", default="x86-host")
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args(argv)
    spec = targets.resolve(args.target)
    bandwidth = copy_bandwidth(spec.tvm_target())
    print(f"# x86 schedules, no tuning: batch 1, {THREADS} threads, target {args.target} "
          f"({spec.config.get('mcpu')}, {spec.vector_bits()}-bit vectors), copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    row = depthwise_row(args.target, bandwidth, args.repeat)
    print(table([row], list(row)))
    print()
    rows = [model_row(m, args.target, args.repeat) for m in args.models.split(",")]
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
