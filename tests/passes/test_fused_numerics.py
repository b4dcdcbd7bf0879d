"""Numbers of every fused pattern: tvmfuse.compile (partitioned, fused kernels) vs onnxruntime, over a grid of
conv/depthwise/dense shapes and every epilogue; a few cases also vs TVM's own unfused build of the same module.

Each case also checks that the expected partition was formed, so the fused kernel is what gets measured.
"""

from __future__ import annotations

import collections
import dataclasses
import zlib

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

import tvmfuse
from tvmfuse import frontend, targets
from tvmfuse.passes.partition import composites
from tvmfuse.passes.pipeline import canonicalize_passes
from tvmfuse.schedules.computes.anchors import phase_split_pays

from helpers import HOST, ort_run
from helpers import make_model


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype="float32"), name)


# Epilogue -> (ONNX nodes from "c" to "y", extra initializers, composite suffix, extra graph inputs)
def _epilogue(kind: str, out_shape):
    if kind == "none":
        return [helper.make_node("Identity", ["c"], ["y"])], [], "", []
    if kind == "relu":
        return [helper.make_node("Relu", ["c"], ["y"])], [], "_relu", []
    if kind == "relu6":
        inits = [_init("lo", np.array(0.0)), _init("hi", np.array(6.0))]
        return [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], inits, "_clip", []
    if kind == "hardswish":
        return [helper.make_node("HardSwish", ["c"], ["y"])], [], "_hardswish", []
    if kind == "leakyrelu":
        return [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.15)], [], "_leakyrelu", []
    if kind == "sigmoid":
        return [helper.make_node("Sigmoid", ["c"], ["y"])], [], "_sigmoid", []
    if kind == "gelu":  # x * (erf(x / sqrt(2)) + 1) * 0.5, as Paddle and torch export GELU
        inits = [_init("sqrt2", np.array(np.sqrt(2.0))), _init("one", np.array(1.0)), _init("half", np.array(0.5))]
        return ([helper.make_node("Div", ["c", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["c", "f"], ["g"]),
                 helper.make_node("Mul", ["g", "half"], ["y"])], inits, "_gelu", [])
    if kind == "silu":  # x * sigmoid(x), as YOLO exports SiLU
        return [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])], [], "_silu", []
    if kind == "hardswish_paddle":  # (x * clip(x + 3, 0, 6)) / 6, as Paddle exports hardswish
        inits = [_init("three", np.array(3.0)), _init("lo", np.array(0.0)), _init("hi", np.array(6.0))]
        return ([helper.make_node("Add", ["c", "three"], ["p"]), helper.make_node("Clip", ["p", "lo", "hi"], ["q"]),
                 helper.make_node("Mul", ["c", "q"], ["hm"]), helper.make_node("Div", ["hm", "hi"], ["y"])],
                inits, "_hardswish", [])
    if kind == "add":
        return [helper.make_node("Add", ["c", "r"], ["y"])], [], "_add", [("r", out_shape)]
    if kind == "add_relu":  # residual first: the other operand order
        return ([helper.make_node("Add", ["r", "c"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], [],
                "_add_relu", [("r", out_shape)])
    raise ValueError(kind)


@dataclasses.dataclass(frozen=True)
class Conv:
    cin: int
    cout: int
    hw: tuple[int, int]
    k: int
    stride: int = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: int = 1
    group: int = 1
    epilogue: str = "none"
    batch: int = 1
    bias: bool = True
    tol: float = 1e-4

    @property
    def family(self) -> str:
        return "depthwise_conv2d" if self.group > 1 and self.group == self.cin else "conv2d"

    def out_shape(self):
        def size(n, lo, hi):
            return (n + lo + hi - self.dilation * (self.k - 1) - 1) // self.stride + 1
        p = self.pads
        return [self.batch, self.cout, size(self.hw[0], p[0], p[2]), size(self.hw[1], p[1], p[3])]

    def model(self, rng):
        fan_in = self.cin // self.group * self.k * self.k
        # Scaled so outputs are O(2): both clip bounds, the hardswish knees and sigmoid's slope all get hit.
        w = rng.standard_normal((self.cout, self.cin // self.group, self.k, self.k)) * 2.0 / np.sqrt(fan_in)
        inits, conv_in = [_init("W", w)], ["x", "W"]
        if self.bias:
            inits.append(_init("B", rng.standard_normal(self.cout) * 0.5))
            conv_in.append("B")
        conv = helper.make_node("Conv", conv_in, ["c"], kernel_shape=[self.k, self.k], strides=[self.stride] * 2,
                                pads=list(self.pads), dilations=[self.dilation] * 2, group=self.group)
        nodes, extra, suffix, extra_in = _epilogue(self.epilogue, self.out_shape())
        model = make_model([conv] + nodes, [("x", [self.batch, self.cin, *self.hw])] + extra_in, [("y", None)],
                           inits + extra)
        feeds = {"x": rng.standard_normal((self.batch, self.cin, *self.hw)).astype("float32")}
        for name, shape in extra_in:
            feeds[name] = rng.standard_normal(shape).astype("float32")
        return model, feeds, f"tvmfuse.{self.family}{suffix}"

    def id(self) -> str:
        kind = {"conv2d": "conv", "depthwise_conv2d": "dw"}[self.family]
        if self.family == "depthwise_conv2d":
            kind += f"m{self.cout // self.cin}"
        elif self.group > 1:
            kind = f"g{self.group}conv"
        pads = "".join(map(str, self.pads)) if len(set(self.pads)) > 1 else str(self.pads[0])
        return (f"{kind}-n{self.batch}c{self.cin}to{self.cout}-{self.hw[0]}x{self.hw[1]}-k{self.k}s{self.stride}"
                f"p{pads}d{self.dilation}{'' if self.bias else '-nobias'}-{self.epilogue}")


@dataclasses.dataclass(frozen=True)
class Dense:
    m: int
    k: int
    n: int
    epilogue: str = "none"
    gemm: bool = False  # Gemm(transB=1) + bias instead of MatMul (+ Add bias)
    bias: bool = True
    tol: float = 1e-5

    def model(self, rng):
        w = rng.standard_normal((self.k, self.n)) * 2.0 / np.sqrt(self.k)
        b = rng.standard_normal(self.n) * 0.5
        if self.gemm:
            head = [helper.make_node("Gemm", ["x", "W", "B"], ["c"], transB=1)]
            inits = [_init("W", w.T), _init("B", b)]
        elif self.bias:
            head = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["c"])]
            inits = [_init("W", w), _init("B", b)]
        else:
            head = [helper.make_node("MatMul", ["x", "W"], ["c"])]
            inits = [_init("W", w)]
        nodes, extra, suffix, extra_in = _epilogue(self.epilogue, [self.m, self.n])
        assert not extra_in, "dense has no residual entries"
        model = make_model(head + nodes, [("x", [self.m, self.k])], [("y", None)], inits + extra)
        return model, {"x": rng.standard_normal((self.m, self.k)).astype("float32")}, f"tvmfuse.dense{suffix}"

    def id(self) -> str:
        head = "gemm" if self.gemm else ("matmul_bias" if self.bias else "matmul")
        return f"{head}-{self.m}x{self.k}x{self.n}-{self.epilogue}"


P1, P2, P3 = (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3)

CONV_CASES = [
    # kernel 1/3/5/7, stride 1/2, pad 0..3, dilation 1/2, channels 3/5/17, odd spatial sizes
    Conv(3, 5, (7, 7), 1),
    Conv(17, 5, (7, 7), 1, stride=2, epilogue="relu"),
    Conv(5, 17, (13, 13), 3, pads=P1, epilogue="relu6"),  # unit tile: 17 channels x 13 pixels
    Conv(3, 5, (15, 15), 3, stride=2, pads=P1, epilogue="hardswish"),
    Conv(5, 5, (7, 7), 3, pads=P2, dilation=2, epilogue="leakyrelu"),
    Conv(3, 5, (13, 13), 5, pads=P2, epilogue="sigmoid"),  # unit tile: 5 channels x 13 pixels
    Conv(5, 3, (15, 15), 5, stride=2, dilation=2, epilogue="relu"),
    Conv(3, 17, (15, 15), 7, stride=2, pads=P3, epilogue="relu"),
    Conv(3, 5, (13, 7), 7, pads=(3, 0, 1, 2), epilogue="relu6"),  # asymmetric pads, non-square input
    Conv(5, 3, (7, 7), 7, epilogue="none"),  # 1x1 spatial output
    Conv(17, 3, (3, 3), 3, epilogue="hardswish"),  # 1x1 spatial output
    Conv(3, 5, (7, 7), 3, pads=P1, batch=2, epilogue="sigmoid"),
    Conv(3, 5, (7, 7), 3, pads=P1, bias=False, epilogue="leakyrelu"),
    Conv(3, 8, (13, 13), 3, pads=P1, epilogue="relu6"),  # 13-pixel rows with an 8-channel tile
    Conv(5, 17, (13, 13), 3, pads=P1, epilogue="silu"),
    Conv(16, 32, (9, 9), 1, epilogue="silu"),
    Conv(16, 24, (11, 11), 3, pads=P1, epilogue="gelu"),
    Conv(5, 17, (13, 13), 3, stride=2, pads=P1, epilogue="hardswish_paddle"),
    # grouped (not depthwise): conv2d family
    Conv(8, 8, (7, 7), 3, pads=P1, group=2, epilogue="relu"),
    Conv(6, 4, (13, 13), 3, stride=2, pads=P1, group=2, epilogue="none"),
    # residual add (both operand orders) and residual add + relu
    Conv(5, 5, (7, 7), 3, pads=P1, epilogue="add"),
    Conv(5, 5, (7, 7), 3, pads=P1, epilogue="add_relu"),
    Conv(17, 17, (13, 13), 1, epilogue="add_relu"),  # unit tile
    Conv(3, 5, (15, 15), 3, stride=2, pads=P1, epilogue="add"),
    Conv(5, 5, (7, 7), 3, pads=P1, bias=False, epilogue="add_relu"),
    # depthwise: kernel 3/5, stride 1/2, dilation 1/2, multiplier 1/2
    Conv(5, 5, (7, 7), 3, pads=P1, group=5, epilogue="relu6", tol=1e-5),
    Conv(5, 10, (13, 13), 3, stride=2, pads=P1, group=5, epilogue="relu", tol=1e-5),
    Conv(17, 17, (13, 13), 3, pads=P2, dilation=2, group=17, epilogue="hardswish", tol=1e-5),
    Conv(3, 6, (15, 15), 5, pads=P2, group=3, epilogue="leakyrelu", tol=1e-5),
    Conv(5, 5, (15, 15), 5, stride=2, pads=P3, dilation=2, group=5, epilogue="sigmoid", tol=1e-5),
    Conv(3, 3, (7, 7), 5, stride=2, group=3, epilogue="none", tol=1e-5),
    Conv(16, 16, (13, 13), 3, pads=P1, group=16, epilogue="silu", tol=1e-5),
    Conv(24, 24, (13, 13), 5, pads=P2, group=24, epilogue="gelu", tol=1e-5),
    Conv(16, 16, (13, 13), 3, pads=P1, group=16, epilogue="hardswish_paddle", tol=1e-5),
    Conv(5, 10, (13, 15), 3, stride=2, pads=(0, 1, 2, 3), dilation=2, group=5, epilogue="relu6", tol=1e-5),
    Conv(5, 5, (7, 7), 3, pads=P1, group=5, epilogue="add_relu", tol=1e-5),
    Conv(17, 17, (7, 7), 3, pads=P1, group=17, epilogue="add", tol=1e-5),
    Conv(5, 5, (7, 7), 3, pads=P1, group=5, bias=False, batch=2, epilogue="relu", tol=1e-5),
    Conv(5, 5, (17, 17), 3, pads=P1, group=5, epilogue="relu", tol=1e-5),  # unit tile: 17-pixel rows
    Conv(3, 6, (19, 19), 3, pads=P1, group=3, epilogue="none", tol=1e-5),  # unit tile: 19-pixel rows
]

# Stride-2 depthwise read from an even/odd column split of the input (anchors.phase_split_pays: 3x3 from
# 28-wide outputs, 5x5 always): odd sizes, pads 0/1/2 (symmetric and EfficientNet's asymmetric), every epilogue.
PHASE_SPLIT_CASES = [
    Conv(3, 3, (9, 57), 3, stride=2, pads=P1, group=3, epilogue="relu6", tol=1e-5),
    Conv(3, 3, (11, 59), 3, stride=2, pads=(0, 0, 1, 1), group=3, epilogue="relu", tol=1e-5),
    Conv(5, 5, (9, 61), 3, stride=2, group=5, batch=2, epilogue="hardswish", tol=1e-5),
    Conv(5, 5, (9, 57), 3, stride=2, pads=P1, group=5, epilogue="add_relu", tol=1e-5),
    Conv(3, 3, (13, 13), 5, stride=2, pads=P2, group=3, epilogue="leakyrelu", tol=1e-5),
    Conv(3, 6, (11, 15), 5, stride=2, pads=(1, 1, 2, 2), group=3, epilogue="sigmoid", tol=1e-5),
    Conv(3, 3, (7, 9), 5, stride=2, pads=P1, group=3, epilogue="add", tol=1e-5),
    Conv(3, 3, (15, 17), 5, stride=2, pads=P2, group=3, bias=False, epilogue="none", tol=1e-5),
    Conv(3, 3, (9, 57), 3, stride=2, pads=P1, group=3, epilogue="silu", tol=1e-5),
    Conv(3, 3, (11, 59), 3, stride=2, pads=P1, group=3, epilogue="gelu", tol=1e-5),
    Conv(5, 5, (13, 13), 5, stride=2, pads=P2, group=5, epilogue="hardswish_paddle", tol=1e-5),
]
CONV_CASES += PHASE_SPLIT_CASES

DENSE_CASES = [
    Dense(1, 10, 7),
    Dense(3, 10, 17, epilogue="relu", gemm=True),
    Dense(3, 10, 17, epilogue="silu"),
    Dense(1, 32, 24, epilogue="gelu"),
    Dense(2, 16, 9, epilogue="hardswish_paddle"),
    Dense(2, 24, 33, epilogue="relu6"),
    Dense(4, 9, 10, epilogue="hardswish"),
    Dense(3, 16, 5, epilogue="leakyrelu"),
    Dense(2, 7, 19, epilogue="sigmoid"),
    Dense(5, 10, 6, epilogue="none", bias=False),
    Dense(1, 33, 15, epilogue="relu", gemm=True),
    Dense(1, 10, 37, epilogue="relu", gemm=True),  # unit tile at batch 1 is harmless
    Dense(3, 10, 37, epilogue="none", gemm=True),  # unit tile: N = 37
    Dense(2, 12, 41, epilogue="relu"),  # unit tile: N = 41
]



CASES = CONV_CASES + DENSE_CASES
# Prime widths/channels/N make 1-wide register tiles: a schedule must then vectorize nothing, not the tile loop.
PARAMS = [pytest.param(c, id=c.id()) for c in CASES]


def _partition_names(cm) -> collections.Counter:
    part = cm.record.partitioned
    comps = composites(part)
    counts = collections.Counter()
    for block in part["main"].body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar):
                counts[str(comps[b.value.op.name_hint].attrs["Composite"])] += 1
    return counts


@pytest.mark.parametrize("case", PARAMS)
def test_fused_matches_onnxruntime(case):
    rng = np.random.default_rng(zlib.crc32(case.id().encode()))  # stable per case
    model, feeds, partition = case.model(rng)
    cm = tvmfuse.compile(model, target=HOST)
    assert dict(_partition_names(cm)) == {partition: 1}, "the fused kernel must be what is measured"
    out = cm.run(feeds)[0]
    ref = ort_run(model, feeds)[0]
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=case.tol, atol=case.tol)


def _run_unfused(model, feeds) -> np.ndarray:
    """The same canonicalized module built by TVM's default Relax pipeline (no tvmfuse partitions)."""
    target = targets.resolve(HOST).tvm_target()
    mod = frontend.import_model(model).mod
    with target, tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(canonicalize_passes())(mod)
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    names = [i.name for i in model.graph.input]
    return vm["main"](*[tvm.runtime.tensor(feeds[n]) for n in names]).numpy()


_BY_ID = {c.id(): c for c in CASES}
UNFUSED_CASES = [_BY_ID[i] for i in ("conv-n1c3to5-15x15-k3s2p1d1-hardswish", "conv-n1c5to5-7x7-k3s1p1d1-add_relu",
                                     "dwm2-n1c5to10-13x15-k3s2p0123d2-relu6", "matmul_bias-2x24x33-relu6")]


@pytest.mark.parametrize("case", UNFUSED_CASES, ids=[c.id() for c in UNFUSED_CASES])
def test_fused_matches_unfused_tvm(case):
    rng = np.random.default_rng(5)
    model, feeds, partition = case.model(rng)
    cm = tvmfuse.compile(model, target=HOST)
    assert partition in _partition_names(cm)
    np.testing.assert_allclose(cm.run(feeds)[0], _run_unfused(model, feeds), rtol=1e-5, atol=1e-5)


# Cases whose register tile is 1 wide (prime width / channels / N): they once came out wrong because a
# schedule vectorized the tile loop itself. Pinned so the grid keeps covering them.
UNIT_TILE_CASES = {
    "conv-n1c5to17-13x13-k3s1p1d1-relu6",
    "conv-n1c3to5-13x13-k5s1p2d1-sigmoid",
    "conv-n1c17to17-13x13-k1s1p0d1-add_relu",
    "dwm1-n1c5to5-17x17-k3s1p1d1-relu",
    "dwm2-n1c3to6-19x19-k3s1p1d1-none",
    "gemm-3x10x37-none",
    "matmul_bias-2x12x41-relu",
}


def test_unit_tile_cases_stay_in_the_grid():
    assert UNIT_TILE_CASES <= {c.id() for c in CASES}


def test_grid_covers_the_brief():
    """The grid keeps covering what it is meant to (kernel sizes, strides, pads, dilations, epilogues...)."""
    convs = [c for c in CONV_CASES if c.family == "conv2d"]
    dws = [c for c in CONV_CASES if c.family == "depthwise_conv2d"]
    assert {c.k for c in convs} >= {1, 3, 5, 7}
    assert {c.stride for c in convs} == {1, 2} and {c.dilation for c in convs} == {1, 2}
    assert {p for c in convs for p in c.pads} >= {0, 1, 2, 3}
    assert {c.k for c in dws} == {3, 5} and {c.stride for c in dws} == {1, 2}
    assert {c.dilation for c in dws} == {1, 2} and {c.cout // c.cin for c in dws} == {1, 2}
    assert any(c.out_shape()[2:] == [1, 1] for c in convs)
    assert any(c.group > 1 and c.family == "conv2d" for c in convs)
    epilogues = {"none", "relu", "relu6", "hardswish", "hardswish_paddle", "leakyrelu", "gelu", "silu", "sigmoid",
                 "add", "add_relu"}
    assert {c.epilogue for c in convs} == epilogues
    assert {c.epilogue for c in dws} == epilogues
    assert {c.epilogue for c in DENSE_CASES} == epilogues - {"add", "add_relu"}
    split = [c for c in PHASE_SPLIT_CASES
             if phase_split_pays(c.stride, c.dilation, c.out_shape()[3], c.k) and c.family == "depthwise_conv2d"]
    assert split == PHASE_SPLIT_CASES
    assert {c.k for c in split} == {3, 5} and {p for c in split for p in c.pads} == {0, 1, 2}
    assert {c.epilogue for c in split} == epilogues and any(c.hw[1] % 2 for c in split)
    assert any(c.n % 16 for c in DENSE_CASES) and any(c.n % 8 for c in DENSE_CASES)
