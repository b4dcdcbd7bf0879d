"""QuantizeGraph on tiny hand-built models: which partitions become INT8 kernels, the quantize/dequantize ops
inserted at region borders, the output dtype of each INT8 kernel, and the partitions kept FP32 (and why).

Structure tests use a synthetic calibration table (every observed tensor in [-4, 4]): borders do not depend
on the ranges. Numbers are checked in tests/test_quantize_api.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import relax

from helpers import HOST
from helpers import make_model
from helpers.quantize import (conv_pool_conv, conv_relu_conv, conv_silu_conv, depthwise_s2, grouped_conv_sigmoid,
                              squeeze_excite,
                              residual_block, sandwich, spelt_hardswish, two_outputs)
from tvmfuse import frontend, targets, zoo
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes
from tvmfuse.passes.utils import bindings_of
from tvmfuse.passes.quantize import QuantizeGraph, QuantizeWarning
from tvmfuse.quant.keys import observed_tensors
from tvmfuse.quant.table import CalibrationTable

SPEC = targets.resolve(HOST)


def _partitioned(model):
    imported = frontend.import_model(model)
    record = PassRecord()
    run_graph_passes(imported.mod, SPEC, SPEC.tvm_target(), record, int8=True)  # as quantize partitions
    return record.partitioned


def _table(mod, drop=()):
    return CalibrationTable({key: (-4.0, 4.0) for key, _ in observed_tensors(mod) if key not in drop}, "minmax")


AVX2 = targets.resolve({"kind": "llvm", "mcpu": "znver3"})  # no VNNI: the INT8 kernels' plain weight layouts
AVX512 = targets.resolve("x86-avx512")


def _quantize(model, drop=(), blocked=False, spec=SPEC):
    """Quantized ``model``: NCHW uint8 activations by default (the borders tests), NCHW16c with ``blocked``;
    ``spec`` picks the weight packing (graphs only: nothing runs)."""
    mod = _partitioned(model)
    report = {}
    with spec.tvm_target():
        out = QuantizeGraph(_table(mod, drop), spec, report, blocked=blocked)(mod)
    assert relax.analysis.check_well_formed(out)
    return out, report


def _main_calls(mod):
    """(kind, value, var) per call bound in main; kind: the op name, a kernel's family or ``partition:<Composite>``."""
    calls = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if not isinstance(value, relax.Call):
                continue
            if value.op == tvm.ir.Op.get("relax.call_tir"):
                family = mod[value.args[0]].attrs.get("tvmfuse.family")
                calls.append((str(family) if family else "call_tir", value, b.var))
            elif isinstance(value.op, tvm.ir.GlobalVar):
                calls.append(("partition:" + str(mod[value.op].attrs["Composite"]), value, b.var))
            else:
                calls.append((value.op.name, value, b.var))
    return calls


def _kinds(mod):
    return [kind for kind, _, _ in _main_calls(mod)]


def _kernel_args(call):
    return list(call.args[1].fields)


def test_conv_relu_conv_quantizes_once_and_passes_uint8_between():
    mod, report = _quantize(conv_relu_conv())
    calls = _main_calls(mod)
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    (_, q, q_var), (_, first, first_var), (_, last, last_var) = calls
    assert q.args[0].same_as(mod["main"].params[0]) and str(q_var.ty.dtype) == "uint8"
    assert _kernel_args(first)[0].same_as(q_var) and str(first_var.ty.dtype) == "uint8"
    assert _kernel_args(last)[0].same_as(first_var) and str(last_var.ty.dtype) == "float32"
    assert mod["main"].body.body.same_as(last_var)  # the float output of the last kernel is the model output
    assert report == {"int8_partitions": 2, "fp32_partitions": 0, "fp32_reasons": [], "uint8_outputs": 1,
                      "float32_outputs": 1, "quantize_ops": 1, "dequantize_ops": 0, "uint8_pools": 0,
                      "uint8_means": 0, "uint8_gates": 0, "blocked_outputs": 0, "layout_transforms": 0,
                      "table_outputs": 0}
    # The kernels carry what the scheduler and reports read; weights are packed int8 constants.
    kernel = mod[first.args[0]]
    assert str(kernel.attrs["tvmfuse.family"]) == "int8_conv2d"
    assert str(kernel.attrs["tvmfuse.ops"]) == "conv2d,add,relu,requantize"
    assert str(mod[last.args[0]].attrs["tvmfuse.ops"]) == "conv2d,add,dequantize"
    weight, bias, multiplier = (a.value.numpy() for a in _kernel_args(first)[1:])
    assert weight.dtype == np.int8 and weight.shape == (1, 1, 3, 3, 16, 4) and weight.min() >= -127
    assert bias.dtype == np.int32 and multiplier.dtype == np.float32 and bias.shape == multiplier.shape == (16,)
    assert not any(isinstance(f, relax.Function) and "Composite" in (f.attrs or {}) for _, f in mod.functions_items())


def test_max_pool_between_int8_partitions_pools_the_uint8_codes():
    mod, report = _quantize(conv_pool_conv())
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.nn.max_pool2d", "int8_conv2d"]
    (_, _, _), (_, _, conv_var), (_, pool, pool_var), (_, last, _) = _main_calls(mod)
    assert pool.args[0].same_as(conv_var) and str(conv_var.ty.dtype) == str(pool_var.ty.dtype) == "uint8"
    assert _kernel_args(last)[0].same_as(pool_var)
    assert (report["quantize_ops"], report["dequantize_ops"], report["uint8_pools"]) == (1, 0, 1)


def test_max_pool_of_stride_1_read_by_an_fp32_consumer_stays_float():
    mod, report = _quantize(conv_pool_conv(pool_is_output=True, stride=1))  # the output is an FP32 consumer
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.nn.max_pool2d"]
    assert str(_main_calls(mod)[-1][2].ty.dtype) == "float32" and report["uint8_pools"] == 0


@pytest.mark.parametrize("blocked", [False, True], ids=["nchw", "nchw16c"])
def test_max_pool_that_shrinks_the_map_pools_codes_and_dequantizes_for_an_fp32_consumer(blocked):
    """A classifier's last conv -> 2x2 max-pool -> global mean (FP32): the conv writes codes, the pool pools
    them (exact: max commutes with the monotonic dequantize) and one dequantize of the pooled map follows."""
    mod, report = _quantize(conv_pool_conv(pool_is_output=True), blocked=blocked)
    pool_kind = "pool2d_nchwc" if blocked else "relax.nn.max_pool2d"
    kinds = _kinds(mod)
    assert kinds[:3] == ["relax.quantize", "int8_conv2d", pool_kind] and kinds[-1] == "relax.dequantize", kinds
    calls = _main_calls(mod)
    assert str(calls[1][2].ty.dtype) == str(calls[2][2].ty.dtype) == "uint8"
    assert str(calls[-1][2].ty.dtype) == "float32" and [int(d) for d in calls[-1][2].ty.shape] == [1, 16, 8, 8]
    assert (report["uint8_pools"], report["dequantize_ops"]) == (1, 1)


def test_fp32_partition_stays_fp32_with_borders_around_it():
    mod, report = _quantize(sandwich("Relu", group=2))
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "partition:tvmfuse.conv2d_relu",
                           "relax.quantize", "int8_conv2d"]
    calls = _main_calls(mod)
    # Before the FP32 partition the INT8 kernel outputs float32 itself; after it the float result is quantized.
    assert str(calls[1][2].ty.dtype) == "float32" and calls[2][1].args[0].same_as(calls[1][2])
    assert calls[3][1].args[0].same_as(calls[2][2]) and _kernel_args(calls[4][1])[0].same_as(calls[3][2])
    assert report["fp32_reasons"] == [{"partition": "tvmfuse.conv2d_relu", "tensor": "lv1",
                                       "reason": "grouped conv2d (groups=2) has no INT8 kernel"}]
    assert (report["int8_partitions"], report["quantize_ops"], report["dequantize_ops"]) == (2, 2, 0)


def test_an_activation_without_int8_epilogue_is_its_int8_convs_output_table():
    """SiLU has no INT8 epilogue: the INT8 table leaves it out of the conv's partition. Both its input and its
    result are calibrated, so the conv's kernel requantizes to the input's codes and writes the SiLU's codes
    from a 256-entry table: no float32 output, no SiLU kernel, no quantize before the next conv."""
    mod, report = _quantize(conv_silu_conv())
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    first = _main_calls(mod)[1][1]
    assert "sigmoid,multiply" in str(mod[first.args[0]].attrs["tvmfuse.ops"])
    assert (report["int8_partitions"], report["table_outputs"], report["quantize_ops"]) == (2, 1, 1)


def test_a_tabled_activation_read_as_a_model_output_too_is_dequantized_once():
    mod, report = _quantize(conv_silu_conv(silu_output=True))
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.dequantize", "int8_conv2d"]
    calls = _main_calls(mod)
    codes = calls[1][2]
    assert calls[2][1].args[0].same_as(codes) and _kernel_args(calls[3][1])[0].same_as(codes)
    outputs = mod["main"].body.blocks[-1].bindings[-1].value
    assert isinstance(outputs, relax.Tuple) and outputs.fields[1].same_as(calls[2][2])
    assert (report["table_outputs"], report["dequantize_ops"]) == (1, 1)


def test_an_activation_whose_result_is_not_calibrated_follows_its_int8_conv():
    """Without a range for the SiLU's result there is no table (and no INT8 reader): the conv writes float32
    and the SiLU runs on it."""
    mod = _partitioned(conv_silu_conv())
    products = {b.var for b in bindings_of(mod["main"]) if getattr(b.value.op, "name", None) == "relax.multiply"}
    silu = [key for key, var in observed_tensors(mod) if var in products]
    assert len(silu) == 1
    out, report = _quantize(conv_silu_conv(), drop=silu)
    assert _kinds(out)[:4] == ["relax.quantize", "int8_conv2d", "relax.sigmoid", "relax.multiply"]
    assert (report["int8_partitions"], report["table_outputs"]) == (1, 0)


def test_mixed_consumers_get_uint8_plus_one_dequantize():
    mod, report = _quantize(two_outputs())
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "relax.dequantize", "int8_conv2d"]
    calls = _main_calls(mod)
    codes, dequantized = calls[1][2], calls[2][2]
    assert str(codes.ty.dtype) == "uint8" and calls[2][1].args[0].same_as(codes)
    assert _kernel_args(calls[3][1])[0].same_as(codes)  # the INT8 consumer reads the codes
    outputs = mod["main"].body.blocks[-1].bindings[-1].value  # the tuple of model outputs
    assert isinstance(outputs, relax.Tuple) and outputs.fields[0].same_as(dequantized)
    assert (report["uint8_outputs"], report["float32_outputs"], report["dequantize_ops"]) == (1, 1, 1)


def test_residual_from_an_int8_partition_is_read_as_uint8():
    mod, report = _quantize(residual_block(from_input=False))
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    calls = _main_calls(mod)
    residual_kernel = calls[2][1]
    args = _kernel_args(residual_kernel)
    assert len(args) == 5 and args[0].same_as(calls[1][2]) and args[4].same_as(calls[1][2])
    assert str(mod[residual_kernel.args[0]].attrs["tvmfuse.partition"]) == "tvmfuse.conv2d_add_relu"
    assert report["quantize_ops"] == 1 and report["uint8_outputs"] == 1


def test_float_residual_shares_the_quantize_of_the_data():
    mod, report = _quantize(residual_block(from_input=True))
    calls = _main_calls(mod)
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    args = _kernel_args(calls[2][1])
    assert args[4].same_as(calls[0][2])  # the model input, quantized once for conv1 and the residual
    assert report["quantize_ops"] == 1


def test_missing_range_keeps_the_partition_fp32():
    mod = _partitioned(conv_relu_conv())
    last = observed_tensors(mod)[-1][0]
    out, report = _quantize(conv_relu_conv(), drop=(last,))
    assert _kinds(out) == ["relax.quantize", "int8_conv2d", "partition:tvmfuse.conv2d"]
    assert report["fp32_reasons"][0]["reason"] == f"no calibration range for tensor {last!r}"
    assert str(_main_calls(out)[1][2].ty.dtype) == "float32"


@pytest.mark.parametrize("model, why", [
    (make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [1, 4])], [("y", [1, 4])]),
     "the model has no conv2d, depthwise conv2d or dense partition"),
    (grouped_conv_sigmoid(),
     r"none of its 1 partition\(s\) has an INT8 kernel \(tvmfuse.conv2d -> lv: grouped conv2d \(groups=2\)"),
])
def test_nothing_quantizable_warns_and_leaves_the_module(model, why):
    mod = _partitioned(model)
    report = {}
    with pytest.warns(QuantizeWarning, match=f"nothing to quantize, the model stays FP32: {why}"):
        out = QuantizeGraph(_table(mod), SPEC, report)(mod)
    assert out.same_as(mod) and report["int8_partitions"] == 0 and report["quantize_ops"] == 0


def test_non_cpu_targets_keep_every_partition_fp32():
    mod = _partitioned(conv_relu_conv())
    report = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = QuantizeGraph(_table(mod), targets.resolve("cuda-sm80"), report)(mod)
    assert out.same_as(mod) and len(caught) == 1
    assert report["fp32_reasons"][0]["reason"] == "target cuda-sm80 has no INT8 kernels (backend cuda)"


def test_tiny_convnet_regions():
    """Depthwise, dense and hardswish too: one INT8 region from the input to the pooling before the head."""
    mod, report = _quantize("zoo:tiny_convnet")
    kinds = _kinds(mod)
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
    mod, report = _quantize(sandwich("HardSwish"))
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d", "int8_conv2d"]
    calls = _main_calls(mod)
    assert [str(c[2].ty.dtype) for c in calls[1:]] == ["uint8", "uint8", "float32"]
    kernel = mod[calls[2][1].args[0]]
    assert str(kernel.attrs["tvmfuse.ops"]) == "conv2d,add,hardswish,requantize"
    assert (report["int8_partitions"], report["fp32_partitions"], report["quantize_ops"]) == (3, 0, 1)


@pytest.mark.parametrize("spelling", ["paddle", "torch"])
def test_hardswish_spellings_read_their_constants(spelling):
    from tvmfuse.passes.int8_partition import analyze

    for shift in (3.0, 2.5):
        mod = _partitioned(spelt_hardswish(spelling, shift))
        calls = [c for k, c, _ in _main_calls(mod) if k == "partition:tvmfuse.conv2d_hardswish"]
        assert len(calls) == 1
        part, why = analyze(mod[calls[0].op], calls[0].args)
        assert why is None and part.hardswish == (shift, 0.0, 6.0, 6.0) and part.clip is None
        assert part.ops == ["conv2d", "add", "hardswish"]


# ----------------------------------------------------------------------------------------------- NCHW16c


def _shape(var):
    return [int(d) for d in var.ty.shape]


def test_blocked_codes_pass_nchw16c_from_kernel_to_kernel():
    mod, report = _quantize(conv_relu_conv(), blocked=True)
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_conv2d"]
    (_, _, q_var), (_, first, first_var), (_, last, last_var) = _main_calls(mod)
    assert _shape(q_var) == [1, 3, 8, 8]  # the conv repacks its input: the quantized model input stays NCHW
    assert _shape(first_var) == [1, 1, 8, 8, 16] and str(first_var.ty.dtype) == "uint8"
    assert _kernel_args(last)[0].same_as(first_var)
    assert _shape(last_var) == [1, 8, 8, 8] and str(last_var.ty.dtype) == "float32"  # dequantized: NCHW
    assert (report["blocked_outputs"], report["layout_transforms"]) == (1, 0)
    assert "NCHW -> NCHW16c" in str(mod[first.args[0]].attrs["tvmfuse.layout"])


def test_blocked_output_read_as_nchw_gets_one_to_plain():
    """Mixed consumers: the INT8 conv reads the NCHW16c codes, the model output their NCHW dequantization."""
    mod, report = _quantize(two_outputs(), blocked=True)
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "layout_transform", "relax.dequantize", "int8_conv2d"]
    calls = _main_calls(mod)
    codes, plain = calls[1][2], calls[2][2]
    assert _shape(codes) == [1, 1, 8, 8, 16] and _shape(plain) == [1, 8, 8, 8]  # 8 channels: one padded block
    assert calls[3][1].args[0].same_as(plain) and _kernel_args(calls[4][1])[0].same_as(codes)
    assert (report["blocked_outputs"], report["layout_transforms"], report["dequantize_ops"]) == (1, 1, 1)


def test_residual_is_read_in_the_output_layout():
    """The residual conv's float output is the model's (NCHW), so its residual is read NCHW too."""
    mod, _ = _quantize(residual_block(from_input=False), blocked=True)
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "layout_transform", "int8_conv2d"]
    calls = _main_calls(mod)
    args = _kernel_args(calls[3][1])
    assert args[0].same_as(calls[1][2]) and _shape(calls[1][2]) == [1, 1, 6, 6, 16]
    assert args[4].same_as(calls[2][2]) and _shape(calls[2][2]) == [1, 8, 6, 6]


def test_depthwise_reads_nchw16c_and_a_quantized_input_is_transformed_once():
    mod, report = _quantize(depthwise_s2(channels=24, size=8), blocked=True, spec=AVX2)
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "int8_depthwise_conv2d", "int8_conv2d"]
    calls = _main_calls(mod)
    assert _shape(calls[1][2]) == _shape(_kernel_args(calls[2][1])[0]) == [1, 2, 8, 8, 16]  # 24 channels, padded
    assert _shape(calls[2][2]) == [1, 2, 4, 4, 16]
    weight = _kernel_args(calls[2][1])[1].value.numpy()
    assert weight.shape == (2, 3, 3, 16) and not weight[1, :, :, 8:].any()  # the padded channels weigh nothing
    assert report["layout_transforms"] == 0
    plain_in, _ = _quantize(make_model([helper.make_node("Conv", ["x", "w"], ["y"], group=24, pads=[1] * 4)],
                                       [("x", [1, 24, 6, 6])], [("y", [1, 24, 6, 6])],
                                       [_weight("w", (24, 1, 3, 3))]), blocked=True)
    assert _kinds(plain_in) == ["relax.quantize", "layout_transform", "int8_depthwise_conv2d"]
    assert _shape(_main_calls(plain_in)[2][2]) == [1, 24, 6, 6]  # float32 output for the model: NCHW


@pytest.mark.parametrize("dilation", [1, 2])
def test_depthwise_weight_has_taps_in_fours_on_vnni_targets_with_row_dilation_1(dilation):
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], group=24, pads=[2] * 4, dilations=[dilation] * 2),
                        helper.make_node("Relu", ["c"], ["h"]),
                        helper.make_node("Conv", ["h", "w2"], ["y"], group=24, pads=[2] * 4)],
                       [("x", [1, 24, 9, 9])], [("y", [1, 24, 13 - 4 * dilation, 13 - 4 * dilation])],
                       [_weight("w", (24, 1, 5, 5)), _weight("w2", (24, 1, 5, 5))])
    shapes = {}
    for spec in (AVX512, AVX2):
        mod, _ = _quantize(model, blocked=True, spec=spec)
        calls = [call for kind, call, _ in _main_calls(mod) if kind == "int8_depthwise_conv2d"]
        shapes[spec.name] = [_kernel_args(call)[1].value.numpy().shape for call in calls]
    # The dilated conv's taps are 2 pixels apart: no 4 of them lie in one 64-byte load.
    first = (2, 5, 2, 16, 4) if dilation == 1 else (2, 5, 5, 16)
    assert shapes == {"x86-avx512": [first, (2, 5, 2, 16, 4)], "custom": [(2, 5, 5, 16)] * 2}


@pytest.mark.parametrize("channels", [16, 24])
def test_pool_and_tiny_convnet_regions_blocked(channels):
    """A uint8 max-pool between blocked kernels pools the NCHW16c codes (the blocked pool kernel), so its
    producer writes NCHW16c and the next conv reads the pooled codes in place (24 channels: the padded
    block pooled too); tiny_convnet keeps its regions and counts."""
    mod, report = _quantize(conv_pool_conv(channels=channels), blocked=True)
    assert _kinds(mod) == ["relax.quantize", "int8_conv2d", "pool2d_nchwc", "int8_conv2d"]
    (_, _, _), (_, _, conv_var), (_, pool, pool_var), (_, last, _) = _main_calls(mod)
    assert len(conv_var.ty.shape) == len(pool_var.ty.shape) == 5 and str(pool_var.ty.dtype) == "uint8"
    assert [int(d) for d in pool_var.ty.shape] == [1, -(-channels // 16), 8, 8, 16]
    assert pool.args[1].fields[0].same_as(conv_var) and _kernel_args(last)[0].same_as(pool_var)
    assert report["blocked_outputs"] == 1 and report["layout_transforms"] == 0
    mod, report = _quantize("zoo:tiny_convnet", blocked=True)
    assert (report["int8_partitions"], report["quantize_ops"], report["uint8_outputs"]) == (7, 2, 5)
    assert report["blocked_outputs"] >= 3 and "layout_transform" not in _kinds(mod)


def _weight(name, shape):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.random.default_rng(5).standard_normal(shape).astype(np.float32) * 0.3, name)


@pytest.mark.parametrize("blocked", [True, False], ids=["nchw16c", "nchw"])
def test_squeeze_and_excitation_runs_on_codes(blocked):
    """The SE block's mean and channel gate between INT8 kernels run on uint8 codes: the depthwise writes
    codes (NCHW16c when blocked), one kernel averages them into the first FC conv's codes, one applies the
    float gate to them in the last conv's parameters. No float tensor, quantize or dequantize in between."""
    mod, report = _quantize(squeeze_excite(), blocked=blocked)
    kinds = _kinds(mod)
    assert kinds == ["relax.quantize", "int8_conv2d", "int8_depthwise_conv2d", "codes_mean", "int8_conv2d",
                     "int8_conv2d", "codes_gate", "int8_conv2d"], kinds
    calls = _main_calls(mod)
    dw, mean, gate = calls[2][2], calls[3][1], calls[6][1]
    assert str(dw.ty.dtype) == "uint8" and len(dw.ty.shape) == (5 if blocked else 4)
    assert mean.args[1].fields[0].same_as(dw) and gate.args[1].fields[0].same_as(dw)
    assert str(calls[5][2].ty.dtype) == "float32"  # the gate itself stays float32, from its kernel's epilogue
    assert gate.args[1].fields[1].same_as(calls[5][2])
    assert (report["uint8_means"], report["uint8_gates"], report["quantize_ops"], report["dequantize_ops"]) == (1, 1, 1, 0)


def test_squeeze_and_excitation_whose_gate_is_also_an_output_keeps_the_float_gate():
    mod, report = _quantize(squeeze_excite(gate_output=True), blocked=True)
    assert report["uint8_gates"] == 1 and "codes_gate" in _kinds(mod)
    assert report["dequantize_ops"] == 0  # the gate is float32 for both readers


@pytest.mark.parametrize("name", zoo.names())
def test_every_zoo_model_quantizes_to_blocked_int8_kernels(name):
    """Every zoo model's INT8 graph builds on a VNNI target, its kernels' computes included (ShuffleNetV2's
    stem pool of 24 channels once gave the next depthwise one NCHW16c block for two)."""
    mod, report = _quantize("zoo:" + name, blocked=True, spec=AVX512)
    assert report["int8_partitions"] > 0 and report["blocked_outputs"] > 0
