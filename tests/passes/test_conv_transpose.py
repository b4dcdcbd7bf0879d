"""TransposeConvToConv: transposed convs run as a stride-1 phase conv (its bias inside) + depth-to-space (+ a
slice for padding), matching onnxruntime; stride == kernel is exact (a 1x1 conv). The forms it must leave
alone (dilation) keep TVM's transposed conv; grouped ones become a grouped phase conv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse.partition_report import op_name
from tvmfuse.passes.kernel_names import kind
from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(11)


def _db_head(c=24, size=10, bias=True):
    """PP-OCR's DB head: ConvTranspose(c, c, 2, 2) + BN + ReLU, ConvTranspose(c, 1, 2, 2) + Sigmoid."""
    inits = [numpy_helper.from_array(RNG.standard_normal((c, c, 2, 2)).astype("float32") / c, "W1"),
             numpy_helper.from_array(RNG.standard_normal((c, 1, 2, 2)).astype("float32") / c, "W2"),
             numpy_helper.from_array(RNG.uniform(0.5, 1.5, c).astype("float32"), "g"),
             numpy_helper.from_array(RNG.standard_normal(c).astype("float32"), "b"),
             numpy_helper.from_array(RNG.standard_normal(c).astype("float32"), "m"),
             numpy_helper.from_array(RNG.uniform(0.5, 1.5, c).astype("float32"), "v")]
    first = ["x", "W1"]
    if bias:
        inits += [numpy_helper.from_array(RNG.standard_normal(c).astype("float32"), "B1"),
                  numpy_helper.from_array(RNG.standard_normal(1).astype("float32"), "B2")]
        first.append("B1")
    nodes = [helper.make_node("ConvTranspose", first, ["t1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["t1", "g", "b", "m", "v"], ["n1"]),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("ConvTranspose", ["r1", "W2"] + (["B2"] if bias else []), ["t2"],
                              kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Sigmoid", ["t2"], ["y"])]
    return make_model(nodes, [("x", [1, c, size, size])], [("y", None)], inits)


def _ops(cm) -> set[str]:
    text = cm.mod.script()
    return {op for op in ("conv2d_transpose", "permute_dims") if f"R.nn.{op}(" in text or f"R.{op}(" in text}


@pytest.mark.parametrize("bias", [True, False])
def test_db_head_matches_onnxruntime_on_conv_kernels(bias):
    model = _db_head(bias=bias)
    x = {"x": RNG.standard_normal((1, 24, 10, 10)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    (got,), (want,) = cm.run(x), ort_run(model, x)
    assert got.shape == want.shape == (1, 1, 40, 40)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert _ops(cm) == {"permute_dims"}  # no transposed conv is left
    convs = [fn for fn, _ in cm.record.kernels.values()]
    assert len(convs) == 2
    ops = [[op_name(b.value) for blk in fn.body.blocks for b in blk.bindings] for fn in convs]
    assert ops == [["conv2d", "add"]] * 2 if bias else [["conv2d"]] * 2  # the bias is inside the conv kernel
    # the depth-to-space is fused with what follows it (BN + ReLU, Sigmoid): no kernel of its own
    assert not [gv.name_hint for gv in cm.lowered.functions if gv.name_hint.startswith("fused_reshape")
                and gv.name_hint.endswith("reshape1")]


@pytest.mark.parametrize("bias", [True, False])
def test_a_blocked_depth_to_space_moves_whole_channel_vectors(bias):
    """32 channels (whole blocks): the first upsampling's depth-to-space runs on the blocked activation, with
    no transform around it; the second (one channel) keeps the plain transpose."""
    model = _db_head(c=32, bias=bias)
    x = {"x": RNG.standard_normal((1, 32, 10, 10)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)
    names = [gv.name_hint for gv in cm.lowered.functions]
    assert [kind(n) for n in names if "depth_to_space_nchwc" in n] == ["fused_depth_to_space_nchwc_relu"], names
    assert cm.mod.script().count("R.permute_dims(") == 1  # the one-channel upsampling's
    # BN + ReLU joined the blocked side, and the 4-channel phase conv reads it in place and writes NCHW
    # (compute.plain_output_block): no transform at all
    assert cm.partition_report().transforms == {}
    layouts = [str(f.attrs["tvmfuse.layout"]) for f in cm.lowered.functions.values()
               if "tvmfuse.layout" in (f.attrs or {})]
    assert sum(text.startswith("NCHW (computed NCHW") for text in layouts) == 1, layouts
    assert not [n for n in names if "batch_norm" in n]  # folded into the phase conv, repeated per phase


def _compiled_matches_onnxruntime(attrs, w_shape, x_shape):
    """A biased ``ConvTranspose`` (weight ``w_shape``, IOHW per group) compiled for the host; checks it against
    onnxruntime and returns the compiled model and its one kernel's function."""
    out_channels = w_shape[1] * attrs.get("group", 1)
    w = numpy_helper.from_array(RNG.standard_normal(w_shape).astype("float32"), "W")
    b = numpy_helper.from_array(RNG.standard_normal(out_channels).astype("float32"), "B")
    model = make_model([helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], **attrs)], [("x", list(x_shape))],
                       [("y", None)], [w, b])
    x = {"x": RNG.standard_normal(x_shape).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    got, want = cm.run(x)[0], ort_run(model, x)[0]
    assert got.shape == want.shape
    # float32 sums in another order: |y| reaches ~20 here
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    (fn,) = [fn for fn, _ in cm.record.kernels.values()]
    return cm, fn


GENERAL_FORMS = [  # U-Net (3x3 s2 p1 op1), DCGAN (4x4 s2 p1), stride 1, output padding past the last tap,
    # unequal kernel/stride/padding per axis, a 1x1 kernel smaller than its stride
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    {"kernel_shape": [4, 4], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [4, 4], "strides": [2, 2], "output_padding": [1, 1]},
    {"kernel_shape": [5, 3], "strides": [3, 2], "pads": [2, 0, 1, 1], "output_padding": [2, 1]},
    {"kernel_shape": [1, 1], "strides": [2, 2], "output_padding": [1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [0, 1, 2, 1]},
]


@pytest.mark.parametrize("attrs", GENERAL_FORMS)
def test_padded_and_overlapping_transposed_convs_run_on_conv_kernels(attrs):
    cm, fn = _compiled_matches_onnxruntime(attrs, (8, 5, *attrs["kernel_shape"]), (1, 8, 6, 7))
    assert "conv2d_transpose" not in _ops(cm)
    assert [op_name(b.value) for blk in fn.body.blocks for b in blk.bindings] == ["conv2d", "add"]


def _numpy_conv_transpose(x, w, s, pads, extra):
    """ONNX ConvTranspose (groups 1, dilation 1) by its definition: scatter, then cut the padding."""
    (n, c, h, wd), (_, o, kh, kw) = x.shape, w.shape
    full = np.zeros((n, o, (h - 1) * s[0] + kh + extra[0], (wd - 1) * s[1] + kw + extra[1]), np.float64)
    for i in range(h):
        for j in range(wd):
            full[:, :, i * s[0]:i * s[0] + kh, j * s[1]:j * s[1] + kw] += np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    return full[:, :, pads[0]:full.shape[2] - pads[2], pads[1]:full.shape[3] - pads[3]]


@pytest.mark.parametrize("attrs", GENERAL_FORMS)
def test_phase_weight_computes_the_definition(attrs):
    # The phase conv + depth-to-space + slice, in numpy (float64), against the scatter definition.
    import math

    from tvmfuse.passes.conv_transpose import _axis, phase_weight

    k, s = attrs["kernel_shape"], attrs["strides"]
    pads, extra = attrs.get("pads", [0] * 4), attrs.get("output_padding", [0, 0])
    x, w = RNG.standard_normal((1, 3, 5, 4)), RNG.standard_normal((3, 2, *k))
    top, bottom, qh, y0, y1 = _axis(5, k[0], s[0], pads[0], pads[2], extra[0])
    left, right, qw, x0, x1 = _axis(4, k[1], s[1], pads[1], pads[3], extra[1])
    v = phase_weight(w, tuple(s))
    mh, mw = math.ceil(k[0] / s[0]), math.ceil(k[1] / s[1])
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    conv = np.zeros((1, v.shape[0], qh, qw))
    for t in range(mh):
        for u in range(mw):
            conv += np.einsum("nchw,oc->nohw", xp[:, :, t:t + qh, u:u + qw], v[:, :, t, u])
    phases = conv.reshape(1, s[0], s[1], 2, qh, qw).transpose(0, 3, 4, 1, 5, 2).reshape(1, 2, qh * s[0], qw * s[1])
    np.testing.assert_allclose(phases[:, :, y0:y1, x0:x1], _numpy_conv_transpose(x, w, s, pads, extra), atol=1e-12)


GROUPED_FORMS = [  # U-Net's depthwise 2x2 stride-2 upsampling, two channels per group, overlapping and padded
    ({"kernel_shape": [2, 2], "strides": [2, 2], "group": 8}, (8, 1, 2, 2)),
    ({"kernel_shape": [2, 2], "strides": [2, 2], "group": 2}, (8, 4, 2, 2)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1], "group": 4},
     (8, 3, 3, 3)),
]


@pytest.mark.parametrize("attrs,w_shape", GROUPED_FORMS)
def test_grouped_transposed_convs_run_as_a_grouped_phase_conv(attrs, w_shape):
    cm, fn = _compiled_matches_onnxruntime(attrs, w_shape, (1, 8, 6, 6))
    assert _ops(cm) == {"permute_dims"}
    (conv,) = [b.value for blk in fn.body.blocks for b in blk.bindings if op_name(b.value) == "conv2d"]
    assert int(conv.attrs.groups) == attrs["group"]


def test_grouped_phase_weight_is_each_groups_phase_weight_in_turn():
    from tvmfuse.passes.conv_transpose import phase_weight

    w = RNG.standard_normal((6, 2, 3, 3))
    v = phase_weight(w, (2, 2), groups=3)
    assert v.shape == (3 * 2 * 4, 2, 2, 2)
    for g in range(3):
        np.testing.assert_array_equal(v[g * 8:(g + 1) * 8], phase_weight(w[g * 2:(g + 1) * 2], (2, 2)))


def test_a_dilated_transposed_conv_keeps_tvms_kernel_and_still_matches():
    w = numpy_helper.from_array(RNG.standard_normal((8, 4, 2, 2)).astype("float32"), "W")
    model = make_model([helper.make_node("ConvTranspose", ["x", "W"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                                         dilations=[2, 2])], [("x", [1, 8, 6, 6])], [("y", None)], [w])
    x = {"x": RNG.standard_normal((1, 8, 6, 6)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)
    assert "conv2d_transpose" in _ops(cm)


def test_a_bias_that_is_not_per_channel_is_added_after_the_depth_to_space():
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 2, 2)).astype("float32"), "W")
    full = numpy_helper.from_array(RNG.standard_normal((1, 3, 8, 8)).astype("float32"), "B")
    model = make_model([helper.make_node("ConvTranspose", ["x", "W"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
                        helper.make_node("Add", ["t", "B"], ["y"])], [("x", [1, 4, 4, 4])], [("y", None)], [w, full])
    x = {"x": RNG.standard_normal((1, 4, 4, 4)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)
    assert _ops(cm) == {"permute_dims"}
