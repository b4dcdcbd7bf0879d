"""Grouped convs that are not depthwise run on the blocked conv kernel (one group per output block; groups of
4 or 8 channels on their own groups, a shuffle step per channel), with RegroupConv merging the other groups
narrower than a block; all match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import targets
from tvmfuse.passes.regroup_conv import factor, merge_groups
from tvmfuse.schedules.computes.blocked import NARROW_GROUP

from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(5)


def _grouped(c_in, c_out, groups, k=3, stride=1, residual=False):
    """Conv(groups) + bias [+ x] + Relu on a [1, c_in, 10, 12] input."""
    w = numpy_helper.from_array((RNG.standard_normal((c_out, c_in // groups, k, k)) / k).astype("float32"), "W")
    b = numpy_helper.from_array(RNG.standard_normal(c_out).astype("float32"), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], group=groups, kernel_shape=[k, k],
                              pads=[k // 2] * 4, strides=[stride] * 2)]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "x"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    return make_model(nodes, [("x", [1, c_in, 10, 12])], [("y", None)], [w, b])


def _check(model, c_in):
    x = {"x": RNG.standard_normal((1, c_in, 10, 12)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    got, want = cm.run(x)[0], ort_run(model, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))
    return cm


def _families(cm) -> set[str]:
    return {str(f.attrs["tvmfuse.family"]) for _, f in cm.lowered.functions_items()
            if f.attrs is not None and "tvmfuse.partition" in f.attrs}


def _narrow(cm) -> bool:
    """Whether a kernel runs narrow groups as they are (the blocked compute's annotation)."""
    return any(NARROW_GROUP in f.script() for _, f in cm.lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


@pytest.mark.parametrize("c_in,c_out,groups,stride,residual", [
    (64, 64, 2, 1, True),    # 32 channels per group: two blocks each
    (64, 64, 4, 2, False),   # 16 per group: one block each, strided
    (128, 128, 32, 1, False),  # ResNeXt: 4 per group, on the groups themselves (a shuffle step per channel)
    (64, 64, 8, 1, True),    # 8 per group, with a residual: its own groups on AVX-512, regrouped 2 -> 16 on AVX2
    (64, 64, 8, 2, False),   # the same, strided
    (48, 32, 2, 1, False),   # 24 input channels per group: a 16-block would straddle groups, input stays NCHW
])
def test_grouped_conv_runs_blocked_and_matches(c_in, c_out, groups, stride, residual):
    cm = _check(_grouped(c_in, c_out, groups, stride=stride, residual=residual), c_in)
    assert "group_conv2d_nchwc" in _families(cm)
    lanes = targets.resolve(HOST).backend().vector_lanes()
    assert _narrow(cm) == (c_out // groups == 4 or (c_out // groups == 8 and lanes == 16))


def test_narrow_groups_are_merged_for_nchw_kernels():
    # layout="nchw" has no blocked kernel to run them on: RegroupConv merges them, as before
    model = _grouped(128, 128, 32)
    x = {"x": RNG.standard_normal((1, 128, 10, 12)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST, layout="nchw")
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-4)
    assert _families(cm) == {"group_conv2d"} and not _narrow(cm)


def test_groups_too_narrow_to_merge_stay_on_the_nchw_kernel():
    # 2 output channels per group would need 8 groups merged (8x the multiply-adds): left grouped.
    cm = _check(_grouped(32, 32, 16), 32)
    assert _families(cm) == {"group_conv2d"}


@pytest.mark.parametrize("out_channels,groups,want", [(128, 32, 4), (256, 32, 2), (512, 32, None),
                                                      (32, 16, None), (48, 12, 4), (24, 6, None), (24, 4, None)])
def test_factor(out_channels, groups, want):
    assert factor(out_channels, groups) == want


def test_merged_weight_computes_the_grouped_conv():
    # 1x1 grouped conv as a matrix per group, in numpy: the merged groups give the same products.
    c, groups, f = 16, 8, 4
    w = RNG.standard_normal((c, c // groups, 1, 1))
    x = RNG.standard_normal((c,))
    per = c // groups
    want = np.array([w[o, :, 0, 0] @ x[(o // per) * per:(o // per + 1) * per] for o in range(c)])
    merged = merge_groups(w, groups, f)
    per_merged = per * f
    got = np.array([merged[o, :, 0, 0] @ x[(o // per_merged) * per_merged:(o // per_merged + 1) * per_merged]
                    for o in range(c)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert merged.shape == (c, per_merged, 1, 1) and np.count_nonzero(merged) == w.size
