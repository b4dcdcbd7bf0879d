"""Pooling of blocked activations (schedules/computes/blocked.py pool2d / spatial_mean, schedules/x86/pool.py): a
max/average pool between blocked convs stays blocked, a global average reads the last feature map blocked;
each against onnxruntime, where the layout transforms go, the schedules' structure, and no tuning task."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import frontend, targets
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes
from tvmfuse.schedules import x86
from tvmfuse.schedules.computes import blocked

from helpers import HOST, ort_run
from helpers import make_model
from helpers.schedules import Structure

SPEC = targets.resolve(HOST)


def _pool_model(op, c=16, hw=15, **attrs):
    """x[1, 3, hw, hw] -> Conv 3x3 -> Relu -> ``op`` -> Conv 1x1: the pool sits between two blocked kernels."""
    rng = np.random.default_rng(0)
    w0 = (rng.standard_normal((c, 3, 3, 3)) / 5).astype("float32")
    w1 = (rng.standard_normal((c, c, 1, 1)) / 4).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["a0"]),
             helper.make_node(op, ["a0"], ["p"], **attrs),
             helper.make_node("Conv", ["p", "W1"], ["y"], kernel_shape=[1, 1])]
    return make_model(nodes, [("x", [1, 3, hw, hw])], [("y", None)],
                      [numpy_helper.from_array(w0, "W0"), numpy_helper.from_array(w1, "W1")])


def _kernels(model) -> dict:
    """Kernel name (``tvmfuse.kernel``) -> how many times main calls it, after the graph passes."""
    mod = run_graph_passes(frontend.import_model(model).mod, SPEC, SPEC.tvm_target(), PassRecord())
    counts = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs and func.attrs.get("tvmfuse.kernel") is not None:
            name = str(func.attrs["tvmfuse.kernel"])
            counts[name] = counts.get(name, 0) + str(mod["main"]).count(f"call_tir({gv.name_hint},")
    return {name: n for name, n in counts.items() if n}


POOLS = [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),  # ResNet's
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),  # 15 -> 8: a window past the edge
    ("MaxPool", dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2] * 4)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4)),  # divisor excludes the padding
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4, count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),
]


@pytest.mark.parametrize("op,attrs", POOLS, ids=[f"{op}-{i}" for i, (op, _) in enumerate(POOLS)])
def test_pool_between_blocked_convs_matches_onnxruntime(op, attrs):
    model = _pool_model(op, **attrs)
    x = np.random.default_rng(1).standard_normal((1, 3, 15, 15)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    # Stem writes blocked, the pool pools blocked, the 1x1 conv reads it: one transform, for the model output.
    pool = "max_pool2d_nchwc" if op == "MaxPool" else "avg_pool2d_nchwc"
    assert _kernels(model) == {pool: 1, "to_plain": 1}


def test_pool_of_a_plain_tensor_stays_tvms():
    """A pool whose input is not blocked (here: the model input) is left to TVM's NCHW op."""
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                       [("x", [1, 16, 8, 8])], [("y", None)], [])
    assert _kernels(model) == {}
    x = np.random.default_rng(2).standard_normal((1, 16, 8, 8)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_array_equal(cm.run({"x": x})[0], ort_run(model, {"x": x})[0])


def test_channels_without_a_block_pool_nchw():
    assert _kernels(_pool_model("MaxPool", c=12, kernel_shape=[2, 2], strides=[2, 2])) == {}


def _mean_model(c=16, hw=9, keepdims=True):
    """x -> Conv 3x3 -> Relu -> GlobalAveragePool (or ReduceMean over H, W without keepdims)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((c, 3, 3, 3)) / 5).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["a"])]
    inits = [numpy_helper.from_array(w, "W")]
    if keepdims:
        nodes.append(helper.make_node("GlobalAveragePool", ["a"], ["y"]))
    else:
        nodes.append(helper.make_node("ReduceMean", ["a", "axes"], ["y"], keepdims=0))
        inits.append(numpy_helper.from_array(np.array([2, 3], "int64"), "axes"))
    return make_model(nodes, [("x", [1, 3, hw, hw])], [("y", None)], inits, opset=18)  # ReduceMean's axes input


@pytest.mark.parametrize("c,hw,keepdims", [(16, 9, True), (24, 7, True), (16, 5, False)])
def test_global_average_reads_blocked_and_writes_nchw(c, hw, keepdims):
    model = _mean_model(c, hw, keepdims)
    x = np.random.default_rng(4).standard_normal((1, 3, hw, hw)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    got, want = cm.run({"x": x})[0], ort_run(model, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert _kernels(model) == {"mean_nchwc": 1}  # no transform of the feature map


def _pool_kernel(model, kernel: str):
    mod = run_graph_passes(frontend.import_model(model).mod, SPEC, SPEC.tvm_target(), PassRecord())
    (func,) = [f for _, f in mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and f.attrs.get("tvmfuse.kernel") == kernel]
    assert str(func.attrs["tvmfuse.family"]) == "pool2d_nchwc"
    return x86.schedule(func, "pool2d_nchwc", SPEC.vector_bits())


@pytest.mark.parametrize("op,kernel", [("MaxPool", "max_pool2d_nchwc"), ("AveragePool", "avg_pool2d_nchwc")])
def test_pool_schedule_is_parallel_vectorized_without_a_padded_copy(op, kernel):
    s = Structure(_pool_kernel(_pool_model(op, kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), kernel))
    assert "pad_temp" not in s.blocks  # read through a bounds check
    assert {ForKind.PARALLEL, ForKind.VECTORIZED, ForKind.UNROLLED} <= s.kinds()
    assert not s.vectorized_not_innermost()
    # Reduced in registers: a local accumulator tile, the window unrolled.
    assert any(scope == "local" for scope, _ in s.alloc.values())


def test_mean_schedule_sums_a_channel_block_per_parallel_iteration():
    s = Structure(_pool_kernel(_mean_model(), "mean_nchwc"))
    parallel = {int(loop.extent) for loops in s.loops.values() for loop in loops if loop.kind == ForKind.PARALLEL}
    assert parallel == {16 // blocked.block_for(16, SPEC.vector_bits() // 32)}  # N * C/b
    assert ForKind.VECTORIZED in s.kinds() and not s.vectorized_not_innermost()


def test_pooling_kernels_are_not_tuning_tasks():
    from tvmfuse.tune.tuner import extract_tasks

    tasks = extract_tasks(_pool_model("MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), SPEC)
    assert sorted(t.family for t in tasks) == ["conv2d_nchwc", "conv2d_nchwc"]
