"""tvmfuse's CUDA rules over a grid of shapes: each one-op model compiles for CUDA with its partition on the
expected rule, within the target's limits, with no cross-thread reduction in a depthwise kernel (no GPU
needed: nvcc builds the library); on a GPU (marker ``gpu``) the outputs match onnxruntime's."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from helpers import make_model, ort_run
from helpers.cuda_source import guarded_partial_sums, kernels, shared_bytes

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

TARGET = "cuda-sm90"


def _epilogue(nodes: list, inits: list, rng, epilogue: str, out_channels: int, shape: list) -> None:
    """Append ``epilogue`` after node output ``c`` so the model's output is ``y``."""
    if epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif epilogue == "relu6":
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
        inits += [numpy_helper.from_array(np.array(0, "float32"), "lo"),
                  numpy_helper.from_array(np.array(6, "float32"), "hi")]
    elif epilogue == "hardswish":
        nodes.append(helper.make_node("HardSwish", ["c"], ["y"]))
    elif epilogue == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif epilogue == "bn_residual":
        scale = rng.uniform(0.5, 1.5, out_channels).astype("float32")
        shift = rng.standard_normal(out_channels).astype("float32")
        inits += [numpy_helper.from_array(scale.reshape(-1, 1, 1), "bn_s"),
                  numpy_helper.from_array(shift.reshape(-1, 1, 1), "bn_b"),
                  numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), "res")]
        nodes += [helper.make_node("Mul", ["c", "bn_s"], ["m"]), helper.make_node("Add", ["m", "bn_b"], ["a"]),
                  helper.make_node("Add", ["a", "res"], ["y"])]
    else:
        raise ValueError(epilogue)


def conv_model(cin, cout, hw, k, stride=1, dilation=1, group=1, epilogue="relu", seed=0):
    """x[1, cin, hw, hw] -> Conv(bias, 'same'-style padding) -> ``epilogue``."""
    rng = np.random.default_rng(seed)
    pad = dilation * (k - 1) // 2
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype("float32")
    b = rng.standard_normal(cout).astype("float32")
    out_hw = (hw + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[pad] * 4, dilations=[dilation] * 2, group=group)]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    _epilogue(nodes, inits, rng, epilogue, cout, [1, cout, out_hw, out_hw])
    return make_model(nodes, [("x", [1, cin, hw, hw])], [("y", None)], inits)


def dense_model(m, k, n, epilogue="relu", seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["c"])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    _epilogue(nodes, inits, rng, epilogue, n, [m, n])
    return make_model(nodes, [("x", [m, k])], [("y", None)], inits)


# (channels, size, window, stride, dilation, epilogue): every window, stride and dilation the issue names.
DEPTHWISE = [(c, hw, k, s, d, e) for (c, hw), k, s, d, e in [
    ((32, 112), 3, 1, 1, "relu6"), ((96, 112), 3, 2, 1, "relu6"), ((144, 56), 3, 1, 1, "bn_residual"),
    ((144, 56), 5, 2, 1, "silu"), ((240, 28), 5, 1, 1, "hardswish"), ((480, 14), 3, 1, 2, "relu"),
    ((672, 14), 5, 2, 1, "hardswish"), ((960, 7), 3, 1, 1, "relu6"), ((960, 7), 5, 1, 1, "silu"),
    ((64, 33), 7, 1, 1, "relu"), ((64, 32), 7, 2, 2, "relu"), ((40, 17), 3, 2, 2, "bn_residual"),
    ((256, 65), 3, 1, 2, "relu"), ((8, 9), 7, 2, 1, "relu")]]
CONV = [(3, 16, 224, 3, 2, 1, "relu6"), (16, 96, 112, 1, 1, 1, "relu6"), (64, 64, 56, 3, 1, 1, "bn_residual"),
        (128, 256, 28, 3, 2, 1, "relu"), (512, 2048, 7, 1, 1, 1, "bn_residual"), (320, 1280, 7, 1, 1, 1, "relu6"),
        (24, 40, 29, 5, 1, 2, "silu"), (7, 10, 13, 3, 1, 1, "hardswish"),
        # squeeze-excite convs on a 1x1 map (a warp per output): fewer input channels than a warp's lanes
        (24, 72, 1, 1, 1, 1, "relu"), (72, 24, 1, 1, 1, 1, "hardswish"), (5, 40, 1, 1, 1, 1, "relu")]
DENSE = [(1, 1280, 1000, "relu"), (1, 960, 1280, "hardswish"), (1, 100, 7, "relu"), (1, 20, 50, "relu"),
         (2, 3, 10, "relu"), (4, 512, 256, "silu"),
         (32, 256, 100, "relu"), (64, 768, 3072, "relu")]


def _model(kind: str, case):
    if kind == "depthwise":
        c, hw, k, s, d, e = case
        return conv_model(c, c, hw, k, s, d, group=c, epilogue=e), "tvmfuse.cuda.depthwise_conv2d"
    if kind == "conv":
        cin, cout, hw, k, s, d, e = case
        return conv_model(cin, cout, hw, k, s, d, epilogue=e), "tvmfuse.cuda.conv2d"
    m, k, n, e = case
    return dense_model(m, k, n, epilogue=e), "tvmfuse.cuda.dense"


CASES = ([("depthwise", c) for c in DEPTHWISE] + [("conv", c) for c in CONV] + [("dense", c) for c in DENSE])
IDS = [f"{kind}-" + "-".join(str(v) for v in case) for kind, case in CASES]


def _source(cm) -> str:
    return cm.executable.mod.imports[0].imports[0].inspect_source()


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(kind, case):
        key = (kind, case)
        if key not in cache:
            model, rule = _model(kind, case)
            cache[key] = (model, rule, tvmfuse.compile(model, target=TARGET))
        return cache[key]

    return get


@pytest.mark.parametrize("kind,case", CASES, ids=IDS)
def test_partition_is_on_its_rule_within_limits(compiled, kind, case):
    _, rule, cm = compiled(kind, case)
    scheduled_by = cm.manifest()["scheduled_by"]
    partitions = {k: v for k, v in scheduled_by.items() if k.startswith("tvmfuse_")}
    assert list(partitions.values()) == [rule], scheduled_by
    bodies = kernels(_source(cm))
    (name,) = [n for n in bodies if n.startswith(next(iter(partitions)))]
    body = bodies[name]
    assert shared_bytes(body) <= 48 * 1024
    threads = re.search(rf"__launch_bounds__\((\d+)\) {name}\(", _source(cm))
    assert threads is not None and int(threads.group(1)) <= 1024
    assert guarded_partial_sums(_source(cm)) == []
    if kind == "depthwise":
        assert "red_buf" not in body and "__shfl" not in body, "cross-thread reduction in a depthwise kernel"
        assert "__shared__" in body, "the input tile is not staged in shared memory"


@pytest.mark.gpu
@pytest.mark.parametrize("kind,case", CASES, ids=IDS)
def test_rule_matches_onnxruntime_on_gpu(compiled, kind, case, tmp_path):
    model, _, cm = compiled(kind, case)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = {"x": np.random.default_rng(1).standard_normal(shape).astype("float32")}
    out = tvmfuse.load(cm.export(tmp_path / "k.so")).run(x)[0]
    np.testing.assert_allclose(out, ort_run(model, x)[0], rtol=2e-4, atol=2e-4)


def test_every_warp_lane_has_a_term():
    # A lane without a term never initialises its partial sum (see gemv.lanes_for).
    from tvmfuse.schedules.cuda.gemv import lanes_for

    for k in range(1, 200):
        lanes = lanes_for(k)
        assert lanes <= min(k, 32) and lanes & (lanes - 1) == 0, k
    assert lanes_for(24) == 16 and lanes_for(1280) == 32


def test_depthwise_whose_tile_cannot_fit_shared_memory_falls_back():
    # A 7x7 window dilated by 24 reads 145 rows a tile: no tile fits in 48 KiB, so the fallback rule takes it.
    from tvmfuse.schedules.cuda.depthwise_conv2d import default_config

    assert default_config(8, 160, 160, (7, 7), (1, 1), (24, 24)) is None
    cm = tvmfuse.compile(conv_model(8, 8, 160, 7, dilation=24, group=8), target=TARGET, logs=False)
    assert [v for k, v in cm.manifest()["scheduled_by"].items() if k.startswith("tvmfuse_")] == ["tvmfuse.cuda.fused"]


@pytest.mark.parametrize("exponent,kernel", [(2.0, "square"), (3.0, "power")])
def test_square_is_a_multiply_other_powers_tvms_rule(exponent, kernel):
    # TVM's CUDA pow is __powf, NaN for a negative base: x ** 2 (a LayerNorm's variance) must not use it.
    nodes = [helper.make_node("Pow", ["x", "e"], ["y"])]
    model = make_model(nodes, [("x", [1, 8])], [("y", None)], [numpy_helper.from_array(np.array(exponent, "float32"), "e")])
    cm = tvmfuse.compile(model, target=TARGET)
    body = kernels(_source(cm))
    assert [n for n in body if n.startswith(kernel)], list(body)
    if kernel == "square":
        assert not any("pow" in b for b in body.values())


# fp16 depthwise: a stride-1 3x3, a strided 5x5, a dilated 3x3 on a 14x14 map, 7x7 maps stacking channels, and
# the smallest map; channel counts all even (an odd count keeps one channel a thread: depthwise_conv2d.pairs_for).
FP16_DEPTHWISE = [DEPTHWISE[i] for i in (2, 3, 5, 7, 13)]


@pytest.fixture(scope="module")
def compiled_fp16():
    cache = {}

    def get(case):
        if case not in cache:
            c, hw, k, s, d, e = case
            model = conv_model(c, c, hw, k, s, d, group=c, epilogue=e)
            cache[case] = (model, tvmfuse.compile(model, target=TARGET, precision="fp16", logs=False))
        return cache[case]

    return get


@pytest.mark.parametrize("case", FP16_DEPTHWISE, ids=lambda c: "-".join(map(str, c)))
def test_fp16_depthwise_reads_channel_pairs_as_half2(compiled_fp16, case):
    # Two channels a thread, their inputs interleaved in the shared tile: one half2 read per tap for both
    # (nvcc built it: a cubin is in the library), float32 sums, the limits kept.
    _, cm = compiled_fp16(case)
    scheduled_by = cm.manifest()["scheduled_by"]
    (name,) = [k for k, v in scheduled_by.items() if v == "tvmfuse.cuda.depthwise_conv2d"]
    source = _source(cm)
    body = kernels(source)[name + "_kernel"]
    assert re.search(r"__shared__ alignas\(\d+\) half2 PaddedInput_shared_ptr\[", body), body[:400]
    assert re.search(r"half2 \w+ = PaddedInput_shared_ptr\[", body)
    assert re.search(r"float DepthwiseConv2d_local_ptr\[", body)
    assert 0 < shared_bytes(body) <= 48 * 1024
    threads = re.search(rf"__launch_bounds__\((\d+)\) {name}_kernel\(", source)
    assert threads is not None and 64 <= int(threads.group(1)) <= 1024


def test_depthwise_pairs_are_the_fp16_default_for_even_channels():
    from tvmfuse.schedules.cuda.depthwise_conv2d import default_config, pairs_for

    assert pairs_for(144, "float16") == 2 and pairs_for(3, "float16") == 1 and pairs_for(144, "float32") == 1
    for c, hw, k, s, d, _ in DEPTHWISE:
        out = (hw + 2 * (d * (k - 1) // 2) - d * (k - 1) - 1) // s + 1
        config = default_config(c, out, out, (k, k), (s, s), (d, d), 132, pairs_for(c, "float16"))
        assert config.pairs == 2 and config.channels % 2 == 0 and c % config.channels == 0, config
        assert 64 <= config.threads <= 1024 or config.channels == 2, config


@pytest.mark.gpu
@pytest.mark.parametrize("case", FP16_DEPTHWISE, ids=lambda c: "-".join(map(str, c)))
def test_fp16_depthwise_matches_onnxruntime_on_gpu(compiled_fp16, case, tmp_path):
    from tvmfuse.comparison import correctness

    model, cm = compiled_fp16(case)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = {"x": np.random.default_rng(1).standard_normal(shape).astype("float32")}
    out, want = tvmfuse.load(cm.export(tmp_path / "k.so")).run(x)[0], ort_run(model, x)[0]
    assert np.linalg.norm(out - want) / np.linalg.norm(want) <= correctness.FP16_REL


@pytest.mark.parametrize("precision,load", [("fp32", "float4"), ("fp16", "uint4")])
def test_a_long_gemv_reads_16_bytes_a_lane(precision, load):
    # A batch-1 dense of K = 1280: each lane loads 16 bytes of the input and of its weight row at once (a warp
    # 512 contiguous bytes a step); nvcc built it.
    cm = tvmfuse.compile(dense_model(1, 1280, 1000), target=TARGET, precision=precision, logs=False)
    (name,) = [k for k, v in cm.manifest()["scheduled_by"].items() if v == "tvmfuse.cuda.dense"]
    body = kernels(_source(cm))[name + "_kernel"]
    assert re.search(rf"\*\({load}\*\)\(p1_local_ptr \+ 0\) = \*\({load}\*\)\(p1_ptr", body), body[:600]
    assert re.search(rf"\*\({load}\*\)\(p0_local_ptr \+ 0\) = \*\({load}\*\)\(p0_ptr", body)
    assert guarded_partial_sums(_source(cm)) == []


def test_gemv_vectors_need_whole_warp_steps():
    from tvm import te

    from tvmfuse.schedules.cuda.gemv import vector_for

    def block(dtype, k):
        x, w = te.placeholder((1, k), dtype), te.placeholder((8, k), dtype)
        r = te.reduce_axis((0, k))
        y = te.compute((1, 8), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r))
        from tvm import s_tir
        sch = s_tir.Schedule(te.create_prim_func([x, w, y]))
        return sch.get(sch.get_sblock(y.op.name))

    assert vector_for(block("float16", 1280), 1280) == 8 and vector_for(block("float32", 1280), 1280) == 4
    assert vector_for(block("float16", 72), 72) == 1  # 9 vectors: fewer than a warp's lanes
    assert vector_for(block("float32", 1000), 1000) == 1  # 250 vectors: no whole number of 32-lane steps
    assert vector_for(block("int8", 1024), 1024) == 1
