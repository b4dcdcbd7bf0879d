"""INT8 kernels vs tvmfuse's FP32 kernels of the same layers, on one target, timed in alternation.

    python bench/int8_kernels.py [--target x86-host] [--repeat 30]

Each row is one layer at batch 1: the INT8 kernel (requantize epilogue with relu, u8 output; depthwise relu6)
against the FP32 kernel tvmfuse compiles for the same Conv+Relu / MatMul+Add+Relu partition (packed weights,
fused epilogue). Reported: medians and the ratio FP32 / INT8 (above 1: INT8 is faster). On a CPU without VNNI the
3x3 stride-1 convs are timed as integer Winograd too (``int8_winograd``, NCHW16c codes in and out: what compile
runs there between NCHW16c INT8 kernels for 8-bit weights, in place of ``--full-range``'s pair step). The weights are packed
as compile packs them for the target: on a CPU without AVX512-VNNI conv2d and dense take 7-bit codes in int8
blocks and the vpmaddubsw step (``--full-range``: full-range codes as int16 pairs and the vpmaddwd step, what
a quantized model's own weights get there); VNNI does 64 multiply-adds per instruction.

    TVMFUSE_HOST_CPU=znver3 python bench/int8_kernels.py [--full-range]   # AVX2 code, on any AVX2 host
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import statistics  # noqa: E402

from common import THREADS, conv_layer, single_partition, table  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402
from tvm import te  # noqa: E402

from tvmfuse import targets  # noqa: E402
from tvmfuse.passes.lower import make_kernel  # noqa: E402
from tvmfuse.schedules.computes import int8, int8_ref  # noqa: E402
from tvmfuse.schedules.computes import int8_depthwise as int8_dw  # noqa: E402
from tvmfuse.schedules.computes import int8_winograd  # noqa: E402
from tvmfuse.schedules.x86.intrin import vnni  # noqa: E402
from tvmfuse.schedules.x86 import int8_conv2d, int8_dense, int8_depthwise  # noqa: E402
from tvmfuse.schedules.x86 import int8_winograd as x86_winograd  # noqa: E402

# (kind, in channels, out channels, size, kernel, stride, pad); dense: (kind, K, N)
LAYERS = [
    ("conv", 64, 64, 56, 3, 1, 1),
    ("conv", 128, 128, 28, 3, 1, 1),
    ("conv", 64, 256, 56, 1, 1, 0),
    ("conv", 256, 256, 14, 3, 1, 1),
    ("conv", 512, 512, 7, 3, 1, 1),
    ("conv", 96, 24, 160, 3, 1, 1),  # en_ppocrv3_det's FPN
    ("depthwise", 144, 144, 56, 3, 1, 1),
    ("depthwise", 192, 192, 28, 3, 2, 1),
    ("dense", 2048, 1000),
]


def _compile(func, spec):
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=spec.tvm_target())


def _random(shape, dtype, rng, limit=127):
    if dtype == "float32":
        return rng.standard_normal(shape).astype(dtype)
    lo, hi = (0, 255) if dtype == "uint8" else (-limit, limit)
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def _alternate(kernels: dict, repeat: int, number: int = 5) -> dict[str, float]:
    """Median ms per run of each ``(lib, tensors)``, measured in alternation (``repeat`` rounds of ``number``
    runs each) so that load from other jobs hits every contender alike."""
    timers = {}
    for name, (lib, tensors) in kernels.items():
        args = [tvm.runtime.tensor(t) for t in tensors]
        timers[name] = (lib.mod.time_evaluator("main", tvm.cpu(), number=number, repeat=1), args)
    times = {name: [] for name in kernels}
    for _ in range(repeat):
        for name, (f, args) in timers.items():
            times[name].append(f(*args).mean * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _fp32_kernel(layer, spec, rng):
    """tvmfuse's FP32 kernel of the layer (as LowerPartitions builds it) and random arguments."""
    kind = layer[0]
    if kind == "dense":
        _, k, n = layer
        nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["c"]),
                 helper.make_node("Relu", ["c"], ["y"])]
        inits = [numpy_helper.from_array(_random((k, n), "float32", rng), "W"),
                 numpy_helper.from_array(_random((n,), "float32", rng), "B")]
        graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", 1, [1, k])],
                                  [helper.make_tensor_value_info("y", 1, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    else:
        _, c, o, size, kern, stride, pad = layer
        model = conv_layer(c, o, size, kern, stride, pad, c if kind == "depthwise" else 1, rng)
    fn = single_partition(model, spec)
    func, _ = make_kernel(fn, spec)
    tensors = [_random([int(d) for d in p.ty.shape], "float32", rng) for p in func.params]
    return _compile(func, spec), tensors


def _int8_kernel(layer, spec, rng, full_range=False):
    """The INT8 kernel of the layer, scheduled for ``spec``, and random arguments: without VNNI, conv2d and dense
    on 7-bit codes marked exact for vpmaddubsw, or (``full_range``) on int16 pairs."""
    bits, has_vnni = spec.vector_bits(), vnni.target_has_vnni(spec.tvm_target())
    exact = spec.backend().int8_weights == "pairs" and not full_range and layer[0] != "depthwise"
    pairs = spec.backend().int8_weights == "pairs" and full_range
    kind = layer[0]
    if kind == "dense":
        _, k, n = layer
        x = te.placeholder((1, k), "uint8", name="x")
        shape = (-(-n // 16), -(-k // 4), 16, 4)
        w = te.placeholder(_pairs_shape(shape) if pairs else shape, "int16" if pairs else "int8", name="w")
        channels, out_kw = n, {"out_features": n}
    else:
        _, c, o, size, kern, stride, pad = layer
        x = te.placeholder((1, c, size, size), "uint8", name="x")
        shape = (c, 1, kern, kern) if kind == "depthwise" else (-(-o // 16), -(-c // 4), kern, kern, 16, 4)
        as_pairs = kind == "conv" and pairs
        w = te.placeholder(_pairs_shape(shape) if as_pairs else shape, "int16" if as_pairs else "int8", name="w")
        channels = o
        out_kw = {"strides": stride, "padding": pad, "input_zero_point": 3}
        if kind == "conv":
            out_kw["out_channels"] = o
    b, m = te.placeholder((channels,), "int32", name="b"), te.placeholder((channels,), "float32", name="m")
    epilogue = int8.Epilogue.make("uint8", 3, 0.05, "relu6" if kind == "depthwise" else "relu")
    compute = {"conv": int8.conv2d_compute, "depthwise": int8_dw.depthwise_conv2d_compute, "dense": int8.dense_compute}
    out = compute[kind](x, w, b, m, epilogue=epilogue, **out_kw)
    rule = {"conv": int8_conv2d, "depthwise": int8_depthwise, "dense": int8_dense}[kind]
    func = int8.prim_func([x, w, b, m, out])
    func = rule.apply(func.with_attr(int8.EXACT_PAIRS_ATTR, True) if exact else func, bits, has_vnni)
    limit = int8_ref.PAIR_SAFE_CODE if exact else 127
    tensors = [_random([int(d) for d in t.shape], str(t.dtype), rng, limit) for t in (x, w, b, m)]
    tensors.append(np.zeros([int(d) for d in out.shape], "uint8"))
    return _compile(func, spec), tensors


def _winograd_kernel(layer, spec, rng):
    """The integer Winograd kernel of a 3x3 stride-1 conv (NCHW16c codes in and out) on a target without VNNI,
    and random arguments; None for any other layer or target."""
    if layer[0] != "conv" or spec.backend().int8_weights != "pairs":
        return None
    _, c, o, size, kern, stride, pad = layer
    if not int8_winograd.pays((kern, kern), (stride,) * 2, (1, 1), (pad,) * 4, c, o):
        return None
    x = te.placeholder((1, -(-c // 16), size, size, 16), "uint8", name="x")
    weight = int8_winograd.pack_weight(_random((o, c, 3, 3), "int8", rng))
    w = te.placeholder(weight.shape, "int16", name="w")
    channels = -(-o // 16) * 16
    b, m = te.placeholder((channels,), "int32", name="b"), te.placeholder((channels,), "float32", name="m")
    epilogue = int8.Epilogue.make("uint8", 3, 0.05, "relu")
    out = int8_winograd.conv2d_compute(x, w, b, m, out_channels=o, input_zero_point=3, epilogue=epilogue)
    sch = tvm.s_tir.Schedule(int8.prim_func([x, w, b, m, out]))
    assert x86_winograd.schedule(sch, spec.vector_bits())
    tensors = [_random([int(d) for d in x.shape], "uint8", rng), weight,
               _random((channels,), "int32", rng), _random((channels,), "float32", rng),
               np.zeros([int(d) for d in out.shape], "uint8")]
    return _compile(sch.mod["main"], spec), tensors


def _pairs_shape(blocks) -> tuple:
    """The int16 pair form of a 16x4-block weight shape (``int8_ref.to_pairs``)."""
    return tuple(blocks[:-2]) + (2, 16, 2)


def _name(layer) -> str:
    if layer[0] == "dense":
        return f"dense {layer[1]}->{layer[2]}"
    _, c, o, size, kern, stride, _ = layer
    return f"{layer[0]} {c}->{o} {size}x{size} {kern}x{kern}" + (f" s{stride}" if stride > 1 else "")


def _ops(layer) -> float:
    if layer[0] == "dense":
        return 2.0 * layer[1] * layer[2]
    kind, c, o, size, kern, stride, pad = layer
    out = (size + 2 * pad - kern) // stride + 1
    return 2.0 * o * out * out * kern * kern * (1 if kind == "depthwise" else c)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="x86-host")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--full-range", action="store_true",
                   help="without VNNI: full-range weight codes on the int16-pair step (default: 7-bit, vpmaddubsw)")
    args = p.parse_args(argv)
    spec = targets.resolve(args.target)
    if not spec.backend().runs_on_this_cpu():
        print(f"this CPU cannot run {args.target} code (missing {targets.missing_host_features(spec)})")
        return 2
    rng = np.random.default_rng(0)
    has_vnni = vnni.target_has_vnni(spec.tvm_target())
    print(f"# INT8 vs FP32 kernels: batch 1, {THREADS} threads, target {args.target} ({spec.config.get('mcpu')}, "
          f"{spec.vector_bits()}-bit vectors, {'VNNI' if has_vnni else 'no VNNI: ' + ('int16-pair vpmaddwd step' if args.full_range else '7-bit weights, vpmaddubsw step')})")
    rows = []
    for layer in LAYERS:
        kernels = {"int8": _int8_kernel(layer, spec, rng, args.full_range), "fp32": _fp32_kernel(layer, spec, rng)}
        winograd = _winograd_kernel(layer, spec, rng)
        if winograd is not None:
            kernels["winograd"] = winograd
        ms = _alternate(kernels, args.repeat)
        int8_ms, fp32_ms = ms["int8"], ms["fp32"]
        row = {"layer": _name(layer), "INT8 ms": f"{int8_ms:.3f}", "FP32 ms": f"{fp32_ms:.3f}",
               "FP32 / INT8": f"{fp32_ms / int8_ms:.2f}x", "INT8 GOP/s": f"{_ops(layer) / int8_ms / 1e6:.0f}"}
        if spec.backend().int8_weights == "pairs":
            wino_ms = ms.get("winograd")
            row["INT8 Winograd ms"] = f"{wino_ms:.3f}" if wino_ms else "-"
            row["FP32 / Winograd"] = f"{fp32_ms / wino_ms:.2f}x" if wino_ms else "-"
        rows.append(row)
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
