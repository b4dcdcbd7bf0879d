"""ONNX's own backend node tests, compiled with tvmfuse for x86-host and compared like ONNX's runner.

Cases come from the generators shipped in the onnx wheel (see ``onnx_node_cases.py``), for the op types a
CNN compiler must handle; weights, scales, shapes and pads are frozen into initializers as real exports
carry them. Every case runs: the ones that do not pass are listed in EXPECTED_FAILURES with the reason and
marked ``xfail(strict=True)``, so a case that starts passing (or a new case from a newer onnx) shows up.

``python -m pytest tests/frontend/test_onnx_node_suite.py -s -k summary`` prints the per-op pass counts.
"""

from __future__ import annotations

import pytest

import tvmfuse

from helpers import onnx_node_cases as node_cases

TRAINING = "training mode: tvmfuse is an inference compiler and rejects BatchNormalization(training_mode=1)"
BLOCKED = "TVM importer: blocked quantization (block_size attribute) is not supported yet"
FLOAT8 = "TVM importer: float8 (e4m3fn/e5m2) zero_point dtype not supported by relax (de)quantize"
SUB_BYTE_DQ = "TVM: relax.op.dequantize rejects int4/uint4/int2/uint2/float4e2m1 input ('Unsupported input datatype')"
SUB_BYTE_Q = ("TVM importer: packed int4/uint4/int2/uint2 zero_point initializer fails to load "
              "('TensorCopyFromBytes: size mismatch')")
FLOAT4_Q = "TVM importer: float4_e2m1fn output dtype not supported by relax quantize"
ARGMAX = "TVM importer: MaxPool second output (Indices) not supported ('Missing outputs during conversion')"
NOT_TENSOR = "optional/sequence graph inputs: tvmfuse compiles tensor inputs only"
EMPTY_INPUT = "a 0 dim in a graph input reads as dynamic (Paddle and old converters write 0 for 'any')"
LN_STATS = "LayerNormalization's Mean/InvStdDev outputs are training statistics; refused (TVM drops them)"
INT_POW = "Pow of integer tensors: TVM's power is float only; refused by name"
RESIZE_SCALE = ("Resize by a scale whose output size is not scale * input exactly: ONNX samples by the scale, TVM by "
                "the size ratio; refused rather than computed differently")
ANTIALIAS = "Resize antialias=1 when downsampling: TVM has no antialiasing filter; refused"

EXPECTED_FAILURES = {
    "test_batchnorm_epsilon_training_mode": TRAINING,
    "test_batchnorm_example_training_mode": TRAINING,
    "test_dequantizelinear_blocked": BLOCKED,
    "test_quantizelinear_blocked_asymmetric": BLOCKED,
    "test_quantizelinear_blocked_symmetric": BLOCKED,
    "test_dequantizelinear_e4m3fn": FLOAT8,
    "test_dequantizelinear_e4m3fn_float16": FLOAT8,
    "test_dequantizelinear_e4m3fn_zero_point": FLOAT8,
    "test_dequantizelinear_e5m2": FLOAT8,
    "test_quantizelinear_e4m3fn": FLOAT8,
    "test_quantizelinear_e5m2": FLOAT8,
    "test_dequantizelinear_float4e2m1": SUB_BYTE_DQ,
    "test_dequantizelinear_int2": SUB_BYTE_DQ,
    "test_dequantizelinear_int4": SUB_BYTE_DQ,
    "test_dequantizelinear_uint2": SUB_BYTE_DQ,
    "test_dequantizelinear_uint4": SUB_BYTE_DQ,
    "test_quantizelinear_int2": SUB_BYTE_Q,
    "test_quantizelinear_int4": SUB_BYTE_Q,
    "test_quantizelinear_uint2": SUB_BYTE_Q,
    "test_quantizelinear_uint4": SUB_BYTE_Q,
    "test_quantizelinear_float4e2m1": FLOAT4_Q,
    "test_maxpool_with_argmax_2d_precomputed_pads": ARGMAX,
    "test_maxpool_with_argmax_2d_precomputed_strides": ARGMAX,
    "test_identity_opt": NOT_TENSOR,
    "test_identity_sequence": NOT_TENSOR,
    "test_reshape_allowzero_reordered": EMPTY_INPUT,
    "test_split_zero_size_splits_opset13": EMPTY_INPUT,
    "test_split_zero_size_splits_opset18": EMPTY_INPUT,
    "test_layer_normalization_2d_axis0": LN_STATS,
    "test_layer_normalization_2d_axis1": LN_STATS,
    "test_layer_normalization_2d_axis_negative_1": LN_STATS,
    "test_layer_normalization_2d_axis_negative_2": LN_STATS,
    "test_layer_normalization_3d_axis0_epsilon": LN_STATS,
    "test_layer_normalization_3d_axis1_epsilon": LN_STATS,
    "test_layer_normalization_3d_axis2_epsilon": LN_STATS,
    "test_layer_normalization_3d_axis_negative_1_epsilon": LN_STATS,
    "test_layer_normalization_3d_axis_negative_2_epsilon": LN_STATS,
    "test_layer_normalization_3d_axis_negative_3_epsilon": LN_STATS,
    "test_layer_normalization_4d_axis0": LN_STATS,
    "test_layer_normalization_4d_axis1": LN_STATS,
    "test_layer_normalization_4d_axis2": LN_STATS,
    "test_layer_normalization_4d_axis3": LN_STATS,
    "test_layer_normalization_4d_axis_negative_1": LN_STATS,
    "test_layer_normalization_4d_axis_negative_2": LN_STATS,
    "test_layer_normalization_4d_axis_negative_3": LN_STATS,
    "test_layer_normalization_4d_axis_negative_4": LN_STATS,
    "test_layer_normalization_default_axis": LN_STATS,
    "test_pow_types_int32_float32": INT_POW,
    "test_pow_types_int32_int32": INT_POW,
    "test_pow_types_int64_float32": INT_POW,
    "test_pow_types_int64_int64": INT_POW,
    "test_resize_downsample_scales_cubic": RESIZE_SCALE,
    "test_resize_downsample_scales_cubic_A_n0p5_exclude_outside": RESIZE_SCALE,
    "test_resize_downsample_scales_cubic_align_corners": RESIZE_SCALE,
    "test_resize_downsample_scales_linear": RESIZE_SCALE,
    "test_resize_downsample_scales_linear_half_pixel_symmetric": RESIZE_SCALE,
    "test_resize_downsample_scales_nearest": RESIZE_SCALE,
    "test_resize_upsample_scales_linear_half_pixel_symmetric": RESIZE_SCALE,
    "test_resize_downsample_scales_linear_align_corners": RESIZE_SCALE,
    "test_resize_downsample_scales_cubic_antialias": RESIZE_SCALE,
    "test_resize_downsample_scales_linear_antialias": RESIZE_SCALE,
    "test_resize_downsample_sizes_cubic_antialias": ANTIALIAS,
    "test_resize_downsample_sizes_linear_antialias": ANTIALIAS,
}

# Every expected failure must be a clean tvmfuse error, not a crash or a wrong number.
_RAISES: dict = {}

CASE_NAMES = list(node_cases.cases())


def _param(name: str):
    reason = EXPECTED_FAILURES.get(name)
    marks = [pytest.mark.xfail(strict=True, reason=reason, raises=_RAISES.get(reason, tvmfuse.TvmfuseError))] \
        if reason else []
    return pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", [_param(n) for n in CASE_NAMES])
def test_onnx_node_case(name):
    node_cases.run_case(name)


def test_expected_failures_name_collected_cases():
    """Every name in EXPECTED_FAILURES is a case onnx generates. (That the others pass and these fail is each
    case's own test: a strict xfail fails when its case passes.)"""
    stale = sorted(set(EXPECTED_FAILURES) - set(CASE_NAMES))
    assert not stale, f"EXPECTED_FAILURES names cases onnx no longer generates: {stale}"


def test_suite_summary():
    table = node_cases.summary(set(EXPECTED_FAILURES))
    assert set(table) == set(node_cases.OP_TYPES)
    empty = sorted(op for op, (_, total) in table.items() if total == 0)
    assert not empty, f"onnx generated no node cases for {empty}"
    passed, total = sum(p for p, _ in table.values()), sum(t for _, t in table.values())
    assert total == len(CASE_NAMES) and passed == total - len(EXPECTED_FAILURES)
    print(f"\nONNX backend node tests on tvmfuse ({node_cases.TARGET}): passed/total")
    for op, (p, t) in table.items():
        print(f"  {op:<20} {p:>3}/{t:<3}")
    print(f"  {'all':<20} {passed:>3}/{total:<3}")
