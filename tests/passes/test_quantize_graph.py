"""QuantizeGraph on tiny hand-built models: which partitions become INT8 kernels, the quantize/dequantize ops
inserted at region borders, the output dtype of each INT8 kernel, and the partitions kept FP32 (and why).

Structure tests use a synthetic calibration table (every observed tensor in [-4, 4]): borders do not depend
on the ranges. Numbers are checked in tests/test_quantize_api.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper
from tvm import relax

from helpers import make_model
from helpers.quantize import (conv_pool_conv, conv_relu_conv, conv_silu_conv, grouped_conv_sigmoid, residual_block,
                              sandwich, spelt_hardswish, two_outputs)
from helpers.quantize_graph import SPEC, calib_table, call_kinds, kernel_args, main_calls, partitioned, quantized
from tvmfuse import targets
from tvmfuse.passes.utils import bindings_of
from tvmfuse.passes.int8.quantize import QuantizeGraph, QuantizeWarning
from tvmfuse.quant.keys import observed_tensors


def test_conv_relu_conv_quantizes_once_and_passes_uint8_between():
    mod, report = quantized(conv_relu_conv())
    calls = main_calls(mod)
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    (_, q, q_var), (_, first, first_var), (_, last, last_var) = calls
    assert q.args[0].same_as(mod["main"].params[0]) and str(q_var.ty.dtype) == "uint8"
    assert kernel_args(first)[0].same_as(q_var) and str(first_var.ty.dtype) == "uint8"
    assert kernel_args(last)[0].same_as(first_var) and str(last_var.ty.dtype) == "float32"
    assert mod["main"].body.body.same_as(last_var)  # the float output of the last kernel is the model output
    assert report == {"int8_partitions": 2, "fp32_partitions": 0, "fp32_reasons": [], "uint8_outputs": 1,
                      "float32_outputs": 1, "quantize_ops": 1, "dequantize_ops": 0, "uint8_pools": 0,
                      "uint8_means": 0, "uint8_gates": 0, "uint8_concats": 0, "blocked_outputs": 0,
                      "layout_transforms": 0, "table_outputs": 0}
    # The kernels carry what the scheduler and reports read; weights are packed int8 constants.
    kernel = mod[first.args[0]]
    assert str(kernel.attrs["tvmfuse.family"]) == "int8_conv2d"
    assert str(kernel.attrs["tvmfuse.ops"]) == "conv2d,add,relu,requantize"
    assert str(mod[last.args[0]].attrs["tvmfuse.ops"]) == "conv2d,add,dequantize"
    weight, bias, multiplier = (a.value.numpy() for a in kernel_args(first)[1:])
    assert weight.dtype == np.int8 and weight.shape == (1, 1, 3, 3, 16, 4) and weight.min() >= -127
    assert bias.dtype == np.int32 and multiplier.dtype == np.float32 and bias.shape == multiplier.shape == (16,)
    assert not any(isinstance(f, relax.Function) and "Composite" in (f.attrs or {}) for _, f in mod.functions_items())


def test_max_pool_between_int8_partitions_pools_the_uint8_codes():
    mod, report = quantized(conv_pool_conv())
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.nn.max_pool2d", "int8_conv2d"]
    (_, _, _), (_, _, conv_var), (_, pool, pool_var), (_, last, _) = main_calls(mod)
    assert pool.args[0].same_as(conv_var) and str(conv_var.ty.dtype) == str(pool_var.ty.dtype) == "uint8"
    assert kernel_args(last)[0].same_as(pool_var)
    assert (report["quantize_ops"], report["dequantize_ops"], report["uint8_pools"]) == (1, 0, 1)


def test_max_pool_of_stride_1_read_by_an_fp32_consumer_stays_float():
    mod, report = quantized(conv_pool_conv(pool_is_output=True, stride=1))  # the output is an FP32 consumer
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.nn.max_pool2d"]
    assert str(main_calls(mod)[-1][2].ty.dtype) == "float32" and report["uint8_pools"] == 0


@pytest.mark.parametrize("blocked", [False, True], ids=["nchw", "nchw16c"])
def test_max_pool_that_shrinks_the_map_pools_codes_and_dequantizes_for_an_fp32_consumer(blocked):
    """A classifier's last conv -> 2x2 max-pool -> global mean (FP32): the conv writes codes, the pool pools
    them (exact: max commutes with the monotonic dequantize) and one dequantize of the pooled map follows."""
    mod, report = quantized(conv_pool_conv(pool_is_output=True), blocked=blocked)
    pool_kind = "pool2d_nchwc" if blocked else "relax.nn.max_pool2d"
    kinds = call_kinds(mod)
    assert kinds[:3] == ["relax.quantize", "int8_conv2d", pool_kind] and kinds[-1] == "relax.dequantize", kinds
    calls = main_calls(mod)
    assert str(calls[1][2].ty.dtype) == str(calls[2][2].ty.dtype) == "uint8"
    assert str(calls[-1][2].ty.dtype) == "float32" and [int(d) for d in calls[-1][2].ty.shape] == [1, 16, 8, 8]
    assert (report["uint8_pools"], report["dequantize_ops"]) == (1, 1)


def test_fp32_partition_stays_fp32_with_borders_around_it():
    mod, report = quantized(sandwich("Relu", group=2))
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "partition:tvmfuse.conv2d_relu",
                           "relax.quantize", "int8_conv2d"]
    calls = main_calls(mod)
    # Before the FP32 partition the INT8 kernel outputs float32 itself; after it the float result is quantized.
    assert str(calls[1][2].ty.dtype) == "float32" and calls[2][1].args[0].same_as(calls[1][2])
    assert calls[3][1].args[0].same_as(calls[2][2]) and kernel_args(calls[4][1])[0].same_as(calls[3][2])
    assert report["fp32_reasons"] == [{"partition": "tvmfuse.conv2d_relu", "tensor": "lv1",
                                       "reason": "grouped conv2d (groups=2) has no INT8 kernel"}]
    assert (report["int8_partitions"], report["quantize_ops"], report["dequantize_ops"]) == (2, 2, 0)


def test_an_activation_without_int8_epilogue_is_its_int8_convs_output_table():
    """SiLU has no INT8 epilogue: the INT8 table leaves it out of the conv's partition. Both its input and its
    result are calibrated, so the conv's kernel requantizes to the input's codes and writes the SiLU's codes
    from a 256-entry table: no float32 output, no SiLU kernel, no quantize before the next conv."""
    mod, report = quantized(conv_silu_conv())
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    first = main_calls(mod)[1][1]
    assert "sigmoid,multiply" in str(mod[first.args[0]].attrs["tvmfuse.ops"])
    assert (report["int8_partitions"], report["table_outputs"], report["quantize_ops"]) == (2, 1, 1)


def test_a_tabled_activation_read_as_a_model_output_too_is_dequantized_once():
    mod, report = quantized(conv_silu_conv(silu_output=True))
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.dequantize", "int8_conv2d"]
    calls = main_calls(mod)
    codes = calls[1][2]
    assert calls[2][1].args[0].same_as(codes) and kernel_args(calls[3][1])[0].same_as(codes)
    outputs = mod["main"].body.blocks[-1].bindings[-1].value
    assert isinstance(outputs, relax.Tuple) and outputs.fields[1].same_as(calls[2][2])
    assert (report["table_outputs"], report["dequantize_ops"]) == (1, 1)


def test_an_activation_whose_result_is_not_calibrated_follows_its_int8_conv():
    """Without a range for the SiLU's result there is no table (and no INT8 reader): the conv writes float32
    and the SiLU runs on it."""
    mod = partitioned(conv_silu_conv())
    products = {b.var for b in bindings_of(mod["main"]) if getattr(b.value.op, "name", None) == "relax.multiply"}
    silu = [key for key, var in observed_tensors(mod) if var in products]
    assert len(silu) == 1
    out, report = quantized(conv_silu_conv(), drop=silu)
    assert call_kinds(out)[:4] == ["relax.quantize", "int8_conv2d", "relax.sigmoid", "relax.multiply"]
    assert (report["int8_partitions"], report["table_outputs"]) == (1, 0)


def test_mixed_consumers_get_uint8_plus_one_dequantize():
    mod, report = quantized(two_outputs())
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.dequantize", "int8_conv2d"]
    calls = main_calls(mod)
    codes, dequantized = calls[1][2], calls[2][2]
    assert str(codes.ty.dtype) == "uint8" and calls[2][1].args[0].same_as(codes)
    assert kernel_args(calls[3][1])[0].same_as(codes)  # the INT8 consumer reads the codes
    outputs = mod["main"].body.blocks[-1].bindings[-1].value  # the tuple of model outputs
    assert isinstance(outputs, relax.Tuple) and outputs.fields[0].same_as(dequantized)
    assert (report["uint8_outputs"], report["float32_outputs"], report["dequantize_ops"]) == (1, 1, 1)


def test_residual_from_an_int8_partition_is_read_as_uint8():
    mod, report = quantized(residual_block(from_input=False))
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    calls = main_calls(mod)
    residual_kernel = calls[2][1]
    args = kernel_args(residual_kernel)
    assert len(args) == 5 and args[0].same_as(calls[1][2]) and args[4].same_as(calls[1][2])
    assert str(mod[residual_kernel.args[0]].attrs["tvmfuse.partition"]) == "tvmfuse.conv2d_add_relu"
    assert report["quantize_ops"] == 1 and report["uint8_outputs"] == 1


def test_float_residual_shares_the_quantize_of_the_data():
    mod, report = quantized(residual_block(from_input=True))
    calls = main_calls(mod)
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    args = kernel_args(calls[2][1])
    assert args[4].same_as(calls[0][2])  # the model input, quantized once for conv1 and the residual
    assert report["quantize_ops"] == 1


def test_missing_range_keeps_the_partition_fp32():
    mod = partitioned(conv_relu_conv())
    last = observed_tensors(mod)[-1][0]
    out, report = quantized(conv_relu_conv(), drop=(last,))
    assert call_kinds(out) == ["relax.quantize", "int8_conv2d", "partition:tvmfuse.conv2d"]
    assert report["fp32_reasons"][0]["reason"] == f"no calibration range for tensor {last!r}"
    assert str(main_calls(out)[1][2].ty.dtype) == "float32"


@pytest.mark.parametrize("model, why", [
    (make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 4])], [("y", [1, 4])]),
     "the model has no conv2d, depthwise conv2d or dense partition"),
    (grouped_conv_sigmoid(),
     r"none of its 1 partition\(s\) has an INT8 kernel \(tvmfuse.conv2d -> lv: grouped conv2d \(groups=2\)"),
])
def test_nothing_quantizable_warns_and_leaves_the_module(model, why):
    mod = partitioned(model)
    report = {}
    with pytest.warns(QuantizeWarning, match=f"nothing to quantize, the model stays FP32: {why}"):
        out = QuantizeGraph(calib_table(mod), SPEC, report)(mod)
    assert out.same_as(mod) and report["int8_partitions"] == 0 and report["quantize_ops"] == 0


def test_a_target_without_int8_kernels_keeps_every_partition_fp32(monkeypatch):
    from tvmfuse.schedules import cuda

    monkeypatch.setattr(cuda.Backend, "int8_kernels", False)  # a backend that has none (CUDA has, since #51)
    mod = partitioned(conv_relu_conv())
    report = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = QuantizeGraph(calib_table(mod), targets.resolve("cuda-sm80"), report)(mod)
    assert out.same_as(mod) and len(caught) == 1
    assert report["fp32_reasons"][0]["reason"] == "target cuda-sm80 has no INT8 kernels (backend cuda)"


def test_cuda_targets_quantize_with_shifted_inputs_and_nchw_codes():
    # s8 x s8 tensor cores: conv2d kernels sum x - 128 (an int8 data_pack stage), codes stay NCHW between them.
    mod = partitioned(conv_relu_conv())
    report = {}
    with targets.resolve("cuda-sm80").tvm_target():
        out = QuantizeGraph(calib_table(mod), targets.resolve("cuda-sm80"), report, blocked=True)(mod)
    assert report["int8_partitions"] == 2 and report["blocked_outputs"] == 0 and report["layout_transforms"] == 0
    kernels = [f for gv, f in out.functions_items() if gv.name_hint.startswith("tvmfuse_int8_conv2d")]
    assert kernels and all('T.Cast("int8", T.Cast("int32", data[' in f.script() and "- 128)" in f.script()
                           for f in kernels)


def test_tiny_convnet_regions():
    """Depthwise, dense and hardswish too: one INT8 region from the input to the pooling before the head."""
    mod, report = quantized("zoo:tiny_convnet")
    kinds = call_kinds(mod)
    assert kinds.count("int8_conv2d") == 5 and kinds.count("int8_depthwise_conv2d") == 1
    assert kinds.count("int8_dense") == 1 and not any(k.startswith("partition:") for k in kinds)
    assert (report["int8_partitions"], report["fp32_partitions"]) == (7, 0)
    # Quantize at the input and before the dense head (after the FP32 mean and reshape); uint8 inside the
    # region, float32 out of the last conv (read by the mean) and the dense head.
    assert (report["quantize_ops"], report["dequantize_ops"]) == (2, 0)
    assert (report["uint8_outputs"], report["float32_outputs"]) == (5, 2)


def test_hardswish_partition_joins_the_int8_region():
    """conv+relu -> conv+hardswish -> conv: three INT8 kernels, uint8 codes between, the hardswish applied in
    the kernel's epilogue to the real value (multiplier s_x * s_w, 1 / (6 s_y) after the product)."""
    mod, report = quantized(sandwich("HardSwish"))
    assert call_kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d", "int8_conv2d"]
    calls = main_calls(mod)
    assert [str(c[2].ty.dtype) for c in calls[1:]] == ["uint8", "uint8", "float32"]
    kernel = mod[calls[2][1].args[0]]
    assert str(kernel.attrs["tvmfuse.ops"]) == "conv2d,add,hardswish,requantize"
    assert (report["int8_partitions"], report["fp32_partitions"], report["quantize_ops"]) == (3, 0, 1)


@pytest.mark.parametrize("spelling", ["paddle", "torch"])
def test_hardswish_spellings_read_their_constants(spelling):
    from tvmfuse.passes.int8.match import analyze

    for shift in (3.0, 2.5):
        mod = partitioned(spelt_hardswish(spelling, shift))
        calls = [c for k, c, _ in main_calls(mod) if k == "partition:tvmfuse.conv2d_hardswish"]
        assert len(calls) == 1
        part, why = analyze(mod[calls[0].op], calls[0].args)
        assert why is None and part.hardswish == (shift, 0.0, 6.0, 6.0) and part.clip is None
        assert part.ops == ["conv2d", "add", "hardswish"]
