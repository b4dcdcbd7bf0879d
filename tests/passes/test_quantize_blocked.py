"""QuantizeGraph with the blocked uint8 layout (NCHW16c codes between INT8 kernels): layouts from kernel to
kernel, transforms where NCHW is read, the depthwise weight packing, max-pools, means and gates on codes, and
every zoo model's INT8 graph. Synthetic calibration table, graphs only (numbers: tests/test_quantize_api.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from helpers import make_model
from helpers.quantize import (conv_pool_conv, conv_relu_conv, depthwise_5x5, depthwise_s2, residual_block,
                              squeeze_excite, stem_concat, two_outputs)
from helpers.quantize_graph import AVX2, AVX512, call_kinds, kernel_args, main_calls, quantized, shape_of
from tvmfuse import zoo
from tvmfuse.schedules.computes import int8_depthwise as int8_dw


def test_blocked_codes_pass_nchw16c_from_kernel_to_kernel():
    mod, report = quantized(conv_relu_conv(), blocked=True)
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    (_, _, q_var), (_, first, first_var), (_, last, last_var) = main_calls(mod)
    assert shape_of(q_var) == [1, 3, 8, 8]  # the conv repacks its input: the quantized model input stays NCHW
    assert shape_of(first_var) == [1, 1, 8, 8, 16] and str(first_var.ty.dtype) == "uint8"
    assert kernel_args(last)[0].same_as(first_var)
    assert shape_of(last_var) == [1, 8, 8, 8] and str(last_var.ty.dtype) == "float32"  # dequantized: NCHW
    assert (report["blocked_outputs"], report["layout_transforms"]) == (1, 0)
    assert "NCHW -> NCHW16c" in str(mod[first.args[0]].attrs["tvmfuse.layout"])


def test_blocked_output_read_as_nchw_gets_one_to_plain():
    """Mixed consumers: the INT8 conv reads the NCHW16c codes, the model output their NCHW dequantization."""
    mod, report = quantized(two_outputs(), blocked=True)
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "layout_transform", "relax.dequantize", "int8_conv2d"]
    calls = main_calls(mod)
    codes, plain = calls[1][2], calls[2][2]
    assert shape_of(codes) == [1, 1, 8, 8, 16] and shape_of(plain) == [1, 8, 8, 8]  # 8 channels: one padded block
    assert calls[3][1].args[0].same_as(plain) and kernel_args(calls[4][1])[0].same_as(codes)
    assert (report["blocked_outputs"], report["layout_transforms"], report["dequantize_ops"]) == (1, 1, 1)


def test_residual_is_read_in_the_output_layout():
    """The residual conv's float output is the model's (NCHW), so its residual is read NCHW too."""
    mod, _ = quantized(residual_block(from_input=False), blocked=True)
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "layout_transform", "int8_conv2d"]
    calls = main_calls(mod)
    args = kernel_args(calls[3][1])
    assert args[0].same_as(calls[1][2]) and shape_of(calls[1][2]) == [1, 1, 6, 6, 16]
    assert args[4].same_as(calls[2][2]) and shape_of(calls[2][2]) == [1, 8, 6, 6]


def test_depthwise_reads_nchw16c_and_a_quantized_input_is_transformed_once():
    mod, report = quantized(depthwise_s2(channels=24, size=8), blocked=True, spec=AVX2)
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_depthwise_conv2d", "int8_conv2d"]
    calls = main_calls(mod)
    assert shape_of(calls[1][2]) == shape_of(kernel_args(calls[2][1])[0]) == [1, 2, 8, 8, 16]  # 24 channels, padded
    assert shape_of(calls[2][2]) == [1, 2, 4, 4, 16]
    weight = kernel_args(calls[2][1])[1].value.numpy()
    # AVX2: the taps in fours as int16 pairs; the padded channels weigh nothing
    assert weight.shape == (2, 3, 1, 2, 16, 2) and weight.dtype == np.int16 and not weight[1, :, :, :, 8:].any()
    for conv in (calls[1], calls[3]):  # the convs: 7-bit codes in int8 blocks (the vpmaddubsw step)
        codes = kernel_args(conv[1])[1].value.numpy()
        assert codes.dtype == np.int8 and np.abs(codes).max() == 64
    assert report["layout_transforms"] == 0
    plain_in, _ = quantized(make_model([helper.make_node("Conv", ["x", "w"], ["y"], group=24, pads=[1] * 4)],
                                       [("x", [1, 24, 6, 6])], [("y", [1, 24, 6, 6])],
                                       [_weight("w", (24, 1, 3, 3))]), blocked=True)
    assert call_kinds(plain_in) == ["relax.quantize", "layout_transform", "int8_depthwise_conv2d"]
    assert shape_of(main_calls(plain_in)[2][2]) == [1, 24, 6, 6]  # float32 output for the model: NCHW


@pytest.mark.parametrize("dilation", [1, 2])
def test_depthwise_weight_has_taps_in_fours_with_row_dilation_1(dilation):
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], group=24, pads=[2] * 4, dilations=[dilation] * 2),
                        helper.make_node("Relu", ["c"], ["h"]),
                        helper.make_node("Conv", ["h", "w2"], ["y"], group=24, pads=[2] * 4)],
                       [("x", [1, 24, 9, 9])], [("y", [1, 24, 13 - 4 * dilation, 13 - 4 * dilation])],
                       [_weight("w", (24, 1, 5, 5)), _weight("w2", (24, 1, 5, 5))])
    shapes = {}
    for spec in (AVX512, AVX2):
        mod, _ = quantized(model, blocked=True, spec=spec)
        calls = [call for kind, call, _ in main_calls(mod) if kind == "int8_depthwise_conv2d"]
        shapes[spec.name] = [kernel_args(call)[1].value.numpy().shape for call in calls]
    # The dilated conv's taps are 2 pixels apart: no 4 of them lie in one 64-byte load. AVX2 (no VNNI) sums
    # 5-wide rows in float (pack_weight_float: exact float32 codes), dilated or not.
    plain = (2, 5, 5, 16)
    assert shapes == {"x86-avx512": [(2, 5, 2, 16, 4) if dilation == 1 else plain, (2, 5, 2, 16, 4)],
                      "custom": [plain, plain]}


def test_without_vnni_wide_kernel_rows_sum_in_float():
    """A 5x5 depthwise on AVX2 takes exact float32 weights (7-bit codes) and its bias without the input zero
    point folded in (the kernel sums q - za: tests/test_quantize_api.py checks the integers against the NCHW
    kernel's); a 3x3 one keeps the int16 pairs."""
    for model, dtype in ((depthwise_5x5(), np.float32), (depthwise_s2(channels=24, size=8), np.int16)):
        mod, _ = quantized(model, blocked=True, spec=AVX2)
        (call,) = [c for kind, c, _ in main_calls(mod) if kind == "int8_depthwise_conv2d"]
        weight, bias = (kernel_args(call)[i].value.numpy() for i in (1, 2))
        assert weight.dtype == dtype and bias.dtype == (np.float32 if dtype == np.float32 else np.int32)
        if dtype == np.float32:  # a float32 bias too, exact: added to the float sums without a round trip
            assert np.array_equal(weight, np.round(weight)) and np.abs(weight).max() <= 127
            assert np.array_equal(bias, np.round(bias)) and np.abs(bias).max() <= int8_dw.FLOAT_BIAS


def test_float_sums_keep_an_int32_bias_float32_cannot_hold():
    """A bias code beyond 2^24 (a tiny input scale under a large float bias) stays int32: the float form then
    converts its sums to int32 first, as before."""
    from tvmfuse.passes.int8 import kernels as k

    model = depthwise_5x5()
    mod, _ = quantized(model, blocked=True, spec=AVX2)
    (call,) = [c for kind, c, _ in main_calls(mod) if kind == "int8_depthwise_conv2d"]
    small = kernel_args(call)[2].value.numpy()
    original = k._int32_bias
    try:
        k._int32_bias = lambda part, *_: np.full(part.weight.shape[0], 2**25, np.int32)
        mod, _ = quantized(model, blocked=True, spec=AVX2)
    finally:
        k._int32_bias = original
    (call,) = [c for kind, c, _ in main_calls(mod) if kind == "int8_depthwise_conv2d"]
    bias = kernel_args(call)[2].value.numpy()
    assert small.dtype == np.float32 and bias.dtype == np.int32 and bias.max() > int8_dw.FLOAT_BIAS


@pytest.mark.parametrize("channels", [16, 24])
def test_pool_and_tiny_convnet_regions_blocked(channels):
    """A uint8 max-pool between blocked kernels pools the NCHW16c codes (the blocked pool kernel), so its
    producer writes NCHW16c and the next conv reads the pooled codes in place (24 channels: the padded
    block pooled too); tiny_convnet keeps its regions and counts."""
    mod, report = quantized(conv_pool_conv(channels=channels), blocked=True)
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "pool2d_nchwc", "int8_conv2d"]
    (_, _, _), (_, _, conv_var), (_, pool, pool_var), (_, last, _) = main_calls(mod)
    assert len(conv_var.ty.shape) == len(pool_var.ty.shape) == 5 and str(pool_var.ty.dtype) == "uint8"
    assert [int(d) for d in pool_var.ty.shape] == [1, -(-channels // 16), 8, 8, 16]
    assert pool.args[1].fields[0].same_as(conv_var) and kernel_args(last)[0].same_as(pool_var)
    assert report["blocked_outputs"] == 1 and report["layout_transforms"] == 0
    mod, report = quantized("zoo:tiny_convnet", blocked=True)
    assert (report["int8_partitions"], report["quantize_ops"], report["uint8_outputs"]) == (7, 2, 5)
    assert report["blocked_outputs"] >= 3 and "layout_transform" not in call_kinds(mod)


def _weight(name, shape):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.random.default_rng(5).standard_normal(shape).astype(np.float32) * 0.3, name)


@pytest.mark.parametrize("blocked", [True, False], ids=["nchw16c", "nchw"])
def test_squeeze_and_excitation_runs_on_codes(blocked):
    """The SE block's mean and channel gate between INT8 kernels run on uint8 codes: the depthwise writes
    codes (NCHW16c when blocked), one kernel averages them into the first FC conv's codes, one applies the
    float gate to them in the last conv's parameters. No float tensor, quantize or dequantize in between."""
    mod, report = quantized(squeeze_excite(), blocked=blocked)
    kinds = call_kinds(mod)
    assert kinds == ["relax.quantize", "int8_conv2d", "int8_depthwise_conv2d", "codes_mean", "int8_conv2d",
                     "int8_conv2d", "codes_gate", "int8_conv2d"], kinds
    calls = main_calls(mod)
    dw, mean, gate = calls[2][2], calls[3][1], calls[6][1]
    assert str(dw.ty.dtype) == "uint8" and len(dw.ty.shape) == (5 if blocked else 4)
    assert mean.args[1].fields[0].same_as(dw) and gate.args[1].fields[0].same_as(dw)
    assert str(calls[5][2].ty.dtype) == "float32"  # the gate itself stays float32, from its kernel's epilogue
    assert gate.args[1].fields[1].same_as(calls[5][2])
    assert (report["uint8_means"], report["uint8_gates"], report["quantize_ops"], report["dequantize_ops"]) == (1, 1, 1, 0)


def test_squeeze_and_excitation_whose_gate_is_also_an_output_keeps_the_float_gate():
    mod, report = quantized(squeeze_excite(gate_output=True), blocked=True)
    assert report["uint8_gates"] == 1 and "codes_gate" in call_kinds(mod)
    assert report["dequantize_ops"] == 0  # the gate is float32 for both readers


@pytest.mark.parametrize("name", zoo.names())
def test_every_zoo_model_quantizes_to_blocked_int8_kernels(name):
    """Every zoo model's INT8 graph builds on a VNNI target, its kernels' computes included (ShuffleNetV2's
    stem pool of 24 channels once gave the next depthwise one NCHW16c block for two)."""
    mod, report = quantized("zoo:" + name, blocked=True, spec=AVX512)
    assert report["int8_partitions"] > 0 and report["blocked_outputs"] > 0


@pytest.mark.parametrize("channels,blocked", [(16, True), (12, True), (16, False)],
                         ids=["whole-blocks", "part-blocks", "nchw"])
def test_a_channel_concat_of_codes_joins_the_int8_region(channels, blocked):
    """PP-HGNet's stem: the max-pool and the conv branch write codes and one kernel concatenates them into the
    last conv's parameters; no float tensor, quantize or dequantize after the input's. NCHW16c codes where
    every input fills whole blocks, NCHW otherwise."""
    mod, report = quantized(stem_concat(channels), blocked=blocked)
    kinds = call_kinds(mod)
    assert "codes_concat" in kinds and "relax.concat" not in kinds and "relax.dequantize" not in kinds, kinds
    assert (report["uint8_concats"], report["uint8_pools"], report["quantize_ops"], report["dequantize_ops"]) \
        == (1, 1, 1, 0)
    (concat,) = [c for c in main_calls(mod) if c[0] == "codes_concat"]
    assert str(concat[2].ty.dtype) == "uint8" and len(concat[2].ty.shape) == (5 if channels % 16 == 0 and blocked
                                                                              else 4)


def test_a_concat_read_by_an_fp32_op_stays_float():
    model = stem_concat(16)
    model.graph.output.append(helper.make_tensor_value_info("cat", 1, None))  # the concat is an output too
    mod, report = quantized(model)
    assert report["uint8_concats"] == 0 and "relax.concat" in call_kinds(mod)


def test_float_packing_keeps_weights_at_minus_128():
    """A quantized model's own weights may hold -128, which the packers refuse: packed by parts as the integer
    forms are, the float form's weight stays float32 and holds every code."""
    from tvmfuse.passes.int8.kernels import _pack
    from tvmfuse.schedules.computes import int8_depthwise as int8_dw

    w = np.random.default_rng(3).integers(-128, 128, (24, 1, 5, 5)).astype(np.int8)
    w[0, 0, 0, :] = -128
    packed = _pack(int8_dw.pack_weight_float, w)
    assert packed.dtype == np.float32 and packed.min() == -128
    np.testing.assert_array_equal(int8_dw.unpack_weight(packed, 24), w.astype(np.float32))
