"""Channel counts no block divides, padded to whole blocks (``blocked.padded_block``: ShuffleNetV2's 58 and 116,
60, 50, 36 ...): conv2d and depthwise kernels read and write NCHW[b]c with zero weights for the padded channels
and zeros stored in them (``blocked.zero_padding``); the ops around them see the padded tensor or its cropped
plain value. Checked against onnxruntime, by the transforms, and by the zeros in the padded lanes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import targets
from tvmfuse.passes.lower import make_kernel
from tvmfuse.schedules.computes import blocked

from helpers import HOST, make_model, ort_run
from helpers.blocked import partition_call
from helpers.layout import to_blocked, transforms

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32


@pytest.mark.parametrize("channels,lanes,block", [
    (58, 16, 16), (116, 16, 8),  # 64 in blocks of 16, 120 in blocks of 8 (4 padded channels, 128 would pad 12)
    (60, 16, 16), (50, 16, 8), (36, 16, 8), (22, 16, 8),  # 64; 56; 40; 24
    (58, 8, 8), (116, 8, 8),  # AVX2: 64 / 120
    (12, 16, None), (42, 16, None), (20, 16, None), (4, 16, None),  # a third, a seventh, a fifth, ... more work
    (64, 16, None), (24, 16, None),  # whole blocks: block_for's
])
def test_padded_block(channels, lanes, block):
    assert blocked.padded_block(channels, lanes) == block
    assert blocked.channel_block(channels, lanes) == (block or blocked.block_for(channels, lanes))


def _branch(c=58, hw=12, act="Relu", tail=None, seed=0):
    """x[1, 3, hw, hw] -> Conv 3x3 to ``c`` (+ Relu) -> depthwise 3x3 -> Conv 1x1 ``c`` -> ``act`` [-> tail]: the
    convs of a ShuffleNetV2 branch with a channel count no block divides."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((c, 3, 3, 3)) / 5).astype("float32"), "W0"),
             numpy_helper.from_array(rng.standard_normal(c).astype("float32"), "B0"),
             numpy_helper.from_array((rng.standard_normal((c, 1, 3, 3)) / 3).astype("float32"), "W1"),
             numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)).astype("float32"), "W2"),
             numpy_helper.from_array(rng.standard_normal(c).astype("float32"), "B2")]
    nodes = [helper.make_node("Conv", ["x", "W0", "B0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["a0"]),
             helper.make_node("Conv", ["a0", "W1"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=c),
             helper.make_node("Conv", ["d", "W2", "B2"], ["c2"]),
             helper.make_node(act, ["c2"], ["y" if tail is None else "a2"])]
    if tail == "maxpool":
        nodes.append(helper.make_node("MaxPool", ["a2"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    elif tail == "mean":
        nodes.append(helper.make_node("GlobalAveragePool", ["a2"], ["y"]))
    elif tail == "mul":  # an elementwise op outside the partitions: it reads the cropped plain value
        nodes.append(helper.make_node("Mul", ["a2", "a0"], ["y"]))
    return make_model(nodes, [("x", [1, 3, hw, hw])], [("y", None)], inits)


@pytest.mark.parametrize("c", [58, 116, 36])
@pytest.mark.parametrize("act,tail", [("Relu", None), ("Sigmoid", None), ("Relu", "maxpool"), ("Relu", "mean"),
                                      ("Sigmoid", "mul")])
def test_padded_chain_matches_onnxruntime(c, act, tail):
    model = _branch(c, act=act, tail=tail)
    counts = transforms(model, SPEC)
    assert counts["nchwc"] == 3, counts  # the three convs blocked, padded
    # one to_plain for the output (none after a global mean, which writes NCHW), one more for the Mul's operand
    assert counts["to_blocked"] == 0 and counts["to_plain"] == {"mean": 0, "mul": 2}.get(tail, 1), counts
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)
    assert len(cm.opcheck(x)) == 3  # kernels unpacked and cropped to the partitions' shapes


def test_padded_lanes_hold_zeros():
    # A sigmoid of the zero-weight channels would be 0.5: the kernel stores zeros there.
    model = _branch(58, act="Sigmoid")
    for _ in range(3):
        model.graph.node.remove(model.graph.node[0])  # left: d -> Conv 1x1 -> Sigmoid
    model.graph.input[0].name = "d"
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 58
    fn, args = partition_call(model)
    block = blocked.padded_block(58, LANES)
    kernel, layout = make_kernel(fn, SPEC, blocks={0: block})
    assert str(kernel.attrs["tvmfuse.family"]) == "conv2d_nchwc"
    x = np.random.default_rng(2).standard_normal((1, 58, 12, 12)).astype("float32")
    arrays = [to_blocked(x, block)] + [np.ascontiguousarray(layout.pack(i, a)) for i, a in enumerate(args) if i]
    out = tvm.runtime.tensor(np.full([int(d) for d in kernel.params[-1].ty.shape], np.nan, "float32"))
    lib = tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    padded = out.numpy().transpose(0, 1, 4, 2, 3).reshape(1, -1, 12, 12)
    assert padded.shape[1] == -(-58 // block) * block
    np.testing.assert_array_equal(padded[:, 58:], 0)
    np.testing.assert_allclose(padded[:, :58], ort_run(model, {"d": x})[0], rtol=1e-4, atol=1e-4)


def test_shufflenet_runs_every_conv_blocked():
    # zoo:shufflenet_v2: 58 and 116 channels a branch, padded to 64 and 120
    from tvmfuse import zoo

    cm = tvmfuse.compile("zoo:shufflenet_v2", target=HOST, logs=False)
    families = [str(f.attrs["tvmfuse.family"]) for f in cm.lowered.functions.values()
                if "tvmfuse.family" in (f.attrs or {})]
    assert "conv2d_nchwc" in families and not {"conv2d", "depthwise_conv2d"} & set(families), families
    (name, shape), = zoo.default_shapes("shufflenet_v2").items()
    x = {name: np.random.default_rng(3).standard_normal(shape).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], ort_run(zoo.get("shufflenet_v2"), x)[0], rtol=1e-4, atol=1e-4)
