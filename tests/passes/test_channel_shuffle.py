"""ShuffleNet's channel shuffle (reshape to ``[N, g, C/g, H, W]``, swap the channel axes, reshape back) of a
blocked activation stays blocked (``blocked.channel_shuffle``, ``BlockedOps._blocked_channel_shuffle``): the
concat before it, the split after it and the convs after that need no layout transform."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import te

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.computes import blocked

from helpers import HOST, make_model, ort_run
from helpers.layout import to_blocked, to_plain, transforms

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32


@pytest.mark.parametrize("channels,groups,block", [(32, 2, 16), (32, 4, 8), (48, 2, 8), (24, 3, 8)])
def test_channel_shuffle_compute(channels, groups, block):
    x = np.random.default_rng(0).standard_normal((1, channels, 3, 5)).astype("float32")
    data = te.placeholder((1, channels // block, 3, 5, block), name="x")
    out = blocked.channel_shuffle(data, groups)
    lib = tvm.compile(te.create_prim_func([data, out]), target="llvm")
    got = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], "float32"))
    lib(tvm.runtime.tensor(to_blocked(x, block)), got)
    want = x.reshape(1, groups, channels // groups, 3, 5).transpose(0, 2, 1, 3, 4).reshape(1, channels, 3, 5)
    np.testing.assert_array_equal(to_plain(got.numpy()), want)


def _shuffle_unit(channels=32, groups=2, units=2, seed=0):
    """x -> Conv 3x3 to ``channels`` -> ``units`` x (split in halves -> Conv 1x1 + Relu on the second half ->
    concat -> channel shuffle) -> Conv 1x1: ShuffleNetV2's stride-1 unit."""
    rng = np.random.default_rng(seed)
    half = channels // 2
    inits = [numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) / 5).astype("float32"), "W0"),
             numpy_helper.from_array((rng.standard_normal((channels, channels, 1, 1)) / 6).astype("float32"), "Wo"),
             numpy_helper.from_array(np.array([half, half], "int64"), "halves"),
             numpy_helper.from_array(np.array([1, groups, channels // groups, 8, 8], "int64"), "grouped"),
             numpy_helper.from_array(np.array([1, channels, 8, 8], "int64"), "flat")]
    nodes = [helper.make_node("Conv", ["x", "W0"], ["u0"], kernel_shape=[3, 3], pads=[1] * 4)]
    for k in range(units):
        inits.append(numpy_helper.from_array((rng.standard_normal((half, half, 1, 1)) / 4).astype("float32"), f"W{k}b"))
        nodes += [helper.make_node("Split", [f"u{k}", "halves"], [f"a{k}", f"b{k}"], axis=1),
                  helper.make_node("Conv", [f"b{k}", f"W{k}b"], [f"c{k}"]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"]),
                  helper.make_node("Concat", [f"a{k}", f"r{k}"], [f"j{k}"], axis=1),
                  helper.make_node("Reshape", [f"j{k}", "grouped"], [f"g{k}"]),
                  helper.make_node("Transpose", [f"g{k}"], [f"t{k}"], perm=[0, 2, 1, 3, 4]),
                  helper.make_node("Reshape", [f"t{k}", "flat"], [f"u{k + 1}"])]
    nodes.append(helper.make_node("Conv", [f"u{units}", "Wo"], ["y"]))
    return make_model(nodes, [("x", [1, 3, 8, 8])], [("y", None)], inits)


@pytest.mark.parametrize("channels,groups", [(32, 2), (64, 4)])
def test_shuffle_units_stay_blocked_and_match_onnxruntime(channels, groups):
    model = _shuffle_unit(channels, groups)
    counts = transforms(model, SPEC)
    # one transform: the output's; the split halves (whole blocks), their convs, the concats and shuffles blocked
    assert counts["to_blocked"] == 0 and counts["to_plain"] == 1, counts
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)
    assert sum(blocked.CHANNEL_SHUFFLE in gv.name_hint for gv in cm.lowered.functions) >= 1


def test_a_shuffle_of_a_plain_tensor_stays_plain():
    # 24 channels in halves of 12: a split inside a block leaves the tensors plain, the shuffle too
    model = _shuffle_unit(24, 2, units=1)
    x = {"x": np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)
    assert not [gv for gv in cm.lowered.functions if blocked.CHANNEL_SHUFFLE in gv.name_hint]
