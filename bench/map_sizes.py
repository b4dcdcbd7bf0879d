"""Conv kernels across map sizes: find the sizes a schedule falls off a cliff at.

Real models bring odd map sizes (299-, 300-, 416- and 513-pixel inputs give 149, 75, 73, 65, 37, 19, 13 ...),
and a tile that fits one width badly can halve a kernel's speed: a 3x3 conv on a 73-wide map in 4-pixel
tiles ran at half speed while a test around its taps kept LLVM from holding the register tile in registers
(see ``schedules/padding_taps.py``). For each conv shape this builds a two-conv model per size (a 1x1 conv
first, so the conv measured reads a blocked input as it does inside a network), compiles it, times the conv's
kernel at every size in turn (rounds in alternating order, the best of each size kept: this VM's slow
phases halve single readings), and prints GFLOP/s per size, with ``!`` where a size runs under 60% of the
row's median.

    python bench/map_sizes.py --conv 32,64,3,1,1 --conv 96,96,3,2,96 --sizes 28/27/29/73/75

``--conv CIN,COUT,K,STRIDE,GROUPS`` (repeatable; padding K // 2). Nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CLIFF = 0.6  # a size under this share of its row's median GFLOP/s is flagged


def bench_profile():
    """``bench/profile.py`` (loaded by path: the standard library's ``profile`` may be imported first)."""
    import importlib.util

    name = "tvmfuse_bench_profile"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("profile.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def conv_model(cin: int, cout: int, k: int, stride: int, groups: int, size: int):
    """``x -> 1x1 conv -> ReLU -> conv (k x k, stride, groups, padding k // 2) + bias -> ReLU`` on a
    ``size`` x ``size`` map (an ONNX ModelProto, seeded weights)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng, out = np.random.default_rng(0), out_size(size, k, stride)
    w0 = numpy_helper.from_array((rng.standard_normal((cin, cin, 1, 1)) * 0.1).astype(np.float32), "w0")
    w = numpy_helper.from_array((rng.standard_normal((cout, cin // groups, k, k)) * 0.1).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(cout, np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w", "b"], ["c1"], kernel_shape=[k, k], pads=[k // 2] * 4,
                              strides=[stride, stride], group=groups),
             helper.make_node("Relu", ["c1"], ["y"])]
    graph = helper.make_graph(nodes, "map_size", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, out, out])], [w0, w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def out_size(size: int, k: int, stride: int) -> int:
    return (size + 2 * (k // 2) - k) // stride + 1


def gflop(cin: int, cout: int, k: int, stride: int, groups: int, size: int) -> float:
    """The measured conv's multiply-adds x 2, in GFLOP."""
    return 2 * cin // groups * cout * k * k * out_size(size, k, stride) ** 2 / 1e9


def target_kernel(cm, cin: int, cout: int, k: int, stride: int, groups: int = 1) -> str:
    """The name of the kernel of the conv measured (not the 1x1 conv before it); the profile names a grouped
    conv by its input channels per group (``1->96`` for a 96-channel depthwise conv)."""
    prof = bench_profile()
    names = [n for n in prof.kernel_times(cm, runs=1) if n.startswith("tvmfuse_")]
    for name in reversed(names):
        row = prof._anchor_row(name, 1.0, 1, cm)
        if row and row["op"].startswith(f"{cin // groups}->{cout} {k}x{k} s{stride}"):
            return name
    raise LookupError(f"no kernel for the {cin}->{cout} {k}x{k} stride-{stride} conv in {groups} groups among {names}")


def flag_cliffs(gflops: dict) -> dict:
    """``{size: True}`` for the sizes under ``CLIFF`` of the median GFLOP/s of ``gflops``."""
    median = statistics.median(gflops.values())
    return {size: value < CLIFF * median for size, value in gflops.items()}


def sweep(spec: tuple, sizes: list, target: str, rounds: int, logs) -> dict:
    """``{size: GFLOP/s}`` of one conv shape, the best of ``rounds`` interleaved readings per size."""
    prof = bench_profile()
    import tvmfuse

    cin, cout, k, stride, groups = spec
    models = {size: tvmfuse.compile(conv_model(*spec, size), target=target, logs=logs) for size in sizes}
    names = {size: target_kernel(cm, cin, cout, k, stride, groups) for size, cm in models.items()}
    best = {size: float("inf") for size in sizes}
    for rd in range(rounds):
        for size in (sizes if rd % 2 == 0 else sizes[::-1]):
            seconds = sum(prof.kernel_times(models[size], runs=5)[names[size]]) / 5
            best[size] = min(best[size], seconds)
    return {size: gflop(*spec, size) / best[size] for size in sizes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conv", action="append", required=True, metavar="CIN,COUT,K,STRIDE,GROUPS")
    ap.add_argument("--sizes", default="14/13/19/27/28/29/37/55/56/73/75", help="input map sizes, /-separated")
    ap.add_argument("--target", default="x86-host")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--logs", action="store_true", help="apply the shipped tuning logs (default: schedules only)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split("/")]
    print(f"# GFLOP/s per input size (best of {args.rounds} interleaved rounds), target {args.target}; "
          f"! = under {CLIFF:.0%} of the row's median")
    print("| conv | " + " | ".join(str(s) for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for text in args.conv:
        spec = tuple(int(v) for v in text.split(","))
        if len(spec) != 5:
            ap.error(f"--conv {text}: want CIN,COUT,K,STRIDE,GROUPS")
        gflops = sweep(spec, sizes, args.target, args.rounds, None if args.logs else False)
        cliffs = flag_cliffs(gflops)
        cells = " | ".join(f"{gflops[s]:.3g}{'!' if cliffs[s] else ''}" for s in sizes)
        print(f"| {text} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
