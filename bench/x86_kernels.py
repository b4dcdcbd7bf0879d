"""Per-kernel x86 table: conv2d and depthwise layers of ResNet-50 / MobileNetV2 / EfficientNet-Lite0, the
blocked NCHW[b]c kernel tvmfuse compiles by default against its NCHW kernel (``layout="nchw"``), default
schedules, no tuning. GFLOP/s (of the direct convolution's multiply-adds) and the ratio, all kernels timed
in one run; where the default is Winograd, the direct blocked kernel's time too.

    python bench/x86_kernels.py [--target x86-host] [--repeat 20]

Each kernel is timed alone with its inputs in cache (``time_evaluator``), as it runs between neighbours
that have just written its input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import THREADS, conv_layer, single_partition, table  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402

from tvmfuse import targets  # noqa: E402
from tvmfuse.passes.lower import make_kernel  # noqa: E402
from tvmfuse.schedules.computes import winograd as winograd_rule  # noqa: E402
from tvmfuse.schedules.computes.blocked import block_for  # noqa: E402

# (name, in channels, out channels, input size, kernel, stride, groups)
LAYERS = [
    ("resnet50 3x3", 64, 64, 56, 3, 1, 1),
    ("resnet50 3x3 s2", 128, 128, 56, 3, 2, 1),
    ("resnet50 3x3 s2", 512, 512, 14, 3, 2, 1),
    ("resnet50 3x3", 256, 256, 14, 3, 1, 1),
    ("resnet50 3x3", 512, 512, 7, 3, 1, 1),
    ("resnet50 1x1", 64, 256, 56, 1, 1, 1),
    ("resnet50 1x1", 1024, 256, 14, 1, 1, 1),
    ("resnet50 1x1", 2048, 512, 7, 1, 1, 1),
    ("resnet50 1x1 s2", 1024, 2048, 14, 1, 2, 1),
    ("mobilenet_v2 1x1", 24, 144, 56, 1, 1, 1),
    ("mobilenet_v2 1x1", 144, 24, 56, 1, 1, 1),
    ("mobilenet_v2 dw 3x3", 144, 144, 56, 3, 1, 144),
    ("mobilenet_v2 dw 3x3 s2", 96, 96, 112, 3, 2, 96),
    ("mobilenet_v2 dw 3x3", 576, 576, 14, 3, 1, 576),
    ("mobilenet_v2 dw 3x3", 960, 960, 7, 3, 1, 960),
    ("efficientnet dw 5x5 s2", 144, 144, 56, 5, 2, 144),
    ("efficientnet dw 5x5", 672, 672, 14, 5, 1, 672),
]


def _ms(fn, spec, blocks, repeat: int, winograd: bool = True) -> tuple[float, str]:
    """(median ms, family) of the partition's default kernel; ``winograd=False`` forces the direct conv."""
    with mock.patch.object(winograd_rule, "pays", winograd_rule.pays if winograd else (lambda *a, **k: False)):
        kernel, _ = make_kernel(fn, spec, blocks=blocks)
    lib = tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), target=spec.tvm_target())
    rng = np.random.default_rng(1)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32"))
            for p in kernel.params]
    timer = lib.mod.time_evaluator("main", tvm.cpu(), number=10, repeat=repeat, min_repeat_ms=20)
    return timer(*args).median * 1e3, str(kernel.attrs["tvmfuse.family"])


def row(layer, spec, repeat: int) -> dict:
    name, cin, cout, size, k, stride, groups = layer
    fn = single_partition(conv_layer(cin, cout, size, k, stride, k // 2, groups, np.random.default_rng(0)), spec)
    lanes = spec.vector_bits() // 32
    block = block_for(cin, lanes)
    blocks = {0: block} if block else {}
    (nchw, _), (blocked, family) = _ms(fn, spec, None, repeat), _ms(fn, spec, blocks, repeat)
    # Where the default is Winograd, the direct blocked kernel too (what the Winograd kernel replaced).
    direct = _ms(fn, spec, blocks, repeat, winograd=False)[0] if family == "conv2d_winograd" else None
    out = (size + 2 * (k // 2) - k) // stride + 1
    flops = 2 * cout * out * out * (cin // groups) * k * k
    return {"layer": name, "shape": f"{cin}->{cout} {size}x{size}", "NCHW ms": f"{nchw:.3f}",
            "NCHW GFLOP/s": f"{flops / nchw / 1e6:.0f}", "blocked kernel": family, "blocked ms": f"{blocked:.3f}",
            "blocked GFLOP/s": f"{flops / blocked / 1e6:.0f}", "NCHW / blocked": f"{nchw / blocked:.2f}x",
            "direct blocked ms": f"{direct:.3f}" if direct else "-"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="x86-host")
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    spec = targets.resolve(args.target)
    print(f"# x86 kernels, default schedules: {THREADS} threads, target {args.target} ({spec.config.get('mcpu')}, "
          f"{spec.vector_bits()}-bit vectors); conv + bias + relu")
    rows = [row(layer, spec, args.repeat) for layer in LAYERS]
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
