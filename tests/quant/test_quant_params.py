"""Quantization parameters: known scales/zero points, ONNX QuantizeLinear agreement, edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvmfuse.errors import TvmfuseError
from tvmfuse.quant.params import QuantParams, QuantParamsError, activation_params, bias_params, weight_params


def test_activation_params_known_answer():
    p = activation_params(-1.0, 3.0)
    assert p.dtype == "uint8" and p.axis is None
    assert p.scale == pytest.approx(4.0 / 255, rel=1e-7)
    assert p.zero_point == 64 and isinstance(p.zero_point, int)  # round(1 / (4 / 255)) = round(63.75)


@pytest.mark.parametrize("lo, hi, zp", [(2.0, 5.0, 0), (-5.0, -2.0, 255), (0.0, 6.0, 0)])
def test_activation_range_is_widened_to_hold_zero(lo, hi, zp):
    p = activation_params(lo, hi)
    assert p.zero_point == zp
    assert p.scale == pytest.approx(5.0 / 255 if lo != 0 else 6.0 / 255, rel=1e-7)
    assert p.dequantize(p.quantize(np.float32(0.0))) == 0.0


def test_activation_zero_is_exact_and_error_is_half_a_step():
    p = activation_params(-0.7, 2.3)
    x = np.linspace(-0.7, 2.3, 10001, dtype=np.float32)
    err = np.abs(p.dequantize(p.quantize(x)) - x)
    assert err.max() <= p.scale / 2 * 1.0001
    assert p.dequantize(p.quantize(np.zeros(3, np.float32))).tolist() == [0.0, 0.0, 0.0]


def test_activation_values_outside_the_range_saturate():
    p = activation_params(0.0, 1.0)
    assert p.quantize(np.array([-5.0, 0.25, 9.0], np.float32)).tolist() == [0, 64, 255]


@pytest.mark.parametrize("lo, hi", [(0.0, 0.0), (3.0, 3.0), (-2.0, -2.0), (0.0, 1e-45)])
def test_activation_degenerate_ranges_give_finite_params(lo, hi):
    p = activation_params(lo, hi)
    assert np.isfinite(p.scale) and p.scale > 0
    assert p.dequantize(p.quantize(np.float32(0.0))) == 0.0
    if lo == hi != 0:  # widened to [0, hi] or [lo, 0]: the value itself is the end of the grid
        assert p.dequantize(p.quantize(np.float32(lo))) == pytest.approx(lo, rel=1e-6)


def test_activation_int8_asymmetric():
    p = activation_params(-1.0, 3.0, dtype="int8")
    assert p.zero_point == -128 + 64
    assert p.quantize(np.float32(-1.0)) == -128 and p.quantize(np.float32(3.0)) == 127


@pytest.mark.parametrize("lo, hi", [(1.0, 0.0), (float("nan"), 1.0), (0.0, float("inf"))])
def test_activation_params_reject_bad_ranges(lo, hi):
    with pytest.raises(QuantParamsError, match="range"):
        activation_params(lo, hi)


def test_activation_params_reject_other_dtypes():
    with pytest.raises(QuantParamsError, match="uint8 or int8"):
        activation_params(0.0, 1.0, dtype="int32")


def test_round_half_to_even():
    p = QuantParams(1.0, 0, "int8")
    halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], np.float32)
    assert p.quantize(halves).tolist() == [0, 2, 2, 0, -2, -2]


def _ort_quantize_linear(x, scale, zero_point, axis=None):
    import onnxruntime as ort

    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "s"),
             numpy_helper.from_array(np.asarray(zero_point), "z")]
    attrs = {"axis": axis} if axis is not None else {}
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], **attrs)
    out_type = TensorProto.UINT8 if np.asarray(zero_point).dtype == np.uint8 else TensorProto.INT8
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", out_type, x.shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_quantize_matches_onnx_quantize_linear_per_tensor():
    rng = np.random.default_rng(0)
    p = activation_params(-1.3, 4.1)
    # Values on and near the half steps, where rounding mode and division precision matter.
    x = ((np.arange(-400, 1200) / 2.0) * np.float32(p.scale) - 1.5).astype(np.float32)
    x = np.concatenate([x, rng.uniform(-3, 6, 5000).astype(np.float32)])
    ours = p.quantize(x)
    assert ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, _ort_quantize_linear(x, p.scale, np.uint8(p.zero_point)))


def test_quantize_matches_onnx_quantize_linear_per_channel():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * np.array([1, 10, 0.01, 3], np.float32)[:, None, None, None]
    p = weight_params(w, axis=0)
    np.testing.assert_array_equal(p.quantize(w), _ort_quantize_linear(w, p.scale, p.zero_point.astype(np.int8), 0))


def test_weight_params_symmetric_per_output_channel():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    p = weight_params(w)
    amax = np.abs(w).reshape(8, -1).max(axis=1)
    np.testing.assert_allclose(p.scale, amax / 127, rtol=1e-6)
    assert p.axis == 0 and p.dtype == "int8" and not np.any(p.zero_point)
    q = p.quantize(w)
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and q.min() >= -127
    # Each channel's largest magnitude lands on +-127 exactly.
    assert np.all(np.abs(q).reshape(8, -1).max(axis=1) == 127)
    err = np.abs(p.dequantize(q) - w)
    assert np.all(err <= p.scale[:, None, None, None] / 2 * 1.0001)


def test_weight_params_7_bit_for_cpus_without_vnni():
    """limit=64 (onnxruntime's reduce_range): each channel's largest magnitude lands on +-64; other limits
    than 1 to 127 are refused."""
    w = np.random.default_rng(3).standard_normal((6, 5, 3, 3)).astype(np.float32)
    p = weight_params(w, limit=64)
    np.testing.assert_allclose(p.scale, np.abs(w).reshape(6, -1).max(axis=1) / 64, rtol=1e-6)
    assert np.all(np.abs(p.quantize(w)).reshape(6, -1).max(axis=1) == 64)
    for bad in (0, 128):
        with pytest.raises(QuantParamsError, match="weight code limit must be 1 to 127"):
            weight_params(w, limit=bad)


def test_weight_params_narrow_range_never_gives_minus_128():
    p = weight_params(np.array([[1.0, -1.0]], np.float32))
    assert p.quantize(np.array([[5.0, -5.0]], np.float32)).tolist() == [[127, -127]]


def test_weight_params_other_axis_for_matmul_weights():
    w = np.array([[1.0, -4.0, 0.5], [-2.0, 2.0, 0.25]], np.float32)  # (in, out)
    p = weight_params(w, axis=1)
    np.testing.assert_allclose(p.scale, np.array([2.0, 4.0, 0.5]) / 127, rtol=1e-7)
    assert p.quantize(w)[:, 1].tolist() == [-127, 64]
    assert weight_params(w, axis=-1).axis == 1


def test_weight_params_all_zero_channel_gets_finite_scale():
    w = np.zeros((3, 2, 1, 1), np.float32)
    w[1] = 0.5
    p = weight_params(w)
    assert np.all(np.isfinite(p.scale)) and np.all(p.scale > 0)
    q = p.quantize(w)
    assert not q[0].any() and not q[2].any() and np.all(q[1] == 127)
    np.testing.assert_array_equal(p.dequantize(q), w)


def test_weight_params_errors():
    with pytest.raises(QuantParamsError, match="non-finite"):
        weight_params(np.array([[np.nan]], np.float32))
    with pytest.raises(QuantParamsError, match="axis 2"):
        weight_params(np.zeros((2, 2), np.float32), axis=2)


def test_bias_params_scale_is_product():
    w = weight_params(np.array([[1.27], [0.127]], np.float32))
    p = bias_params(0.05, w, axis=0)
    np.testing.assert_allclose(p.scale, 0.05 * np.asarray(w.scale), rtol=1e-7)
    assert p.dtype == "int32" and not np.any(p.zero_point)
    bias = np.array([0.3, -0.02], np.float32)
    q = p.quantize(bias)
    assert q.dtype == np.int32
    np.testing.assert_array_equal(q, np.rint(bias / (0.05 * np.array([0.01, 0.001]))).astype(np.int32))
    # A (1, C, 1, 1) bias uses axis 1.
    assert bias_params(0.05, w, axis=1).quantize(bias.reshape(1, 2, 1, 1)).ravel().tolist() == q.tolist()


def test_bias_params_rejects_bad_input_scale():
    with pytest.raises(QuantParamsError, match="input scale"):
        bias_params(0.0, weight_params(np.ones((1, 1), np.float32)))


@pytest.mark.parametrize("kwargs, match", [
    ({"scale": 0.0, "zero_point": 0, "dtype": "uint8"}, "scale"),
    ({"scale": 1.0, "zero_point": 256, "dtype": "uint8"}, "zero point"),
    ({"scale": 1.0, "zero_point": 0, "dtype": "int4"}, "dtype"),
    ({"scale": np.ones(2, np.float32), "zero_point": 0, "dtype": "int8"}, "without an axis"),
])
def test_quant_params_validation(kwargs, match):
    with pytest.raises(QuantParamsError, match=match) as info:
        QuantParams(**kwargs)
    assert isinstance(info.value, TvmfuseError)


def test_per_channel_quantize_checks_channel_count():
    p = weight_params(np.ones((3, 2), np.float32))
    with pytest.raises(QuantParamsError, match="has 4 channels"):
        p.quantize(np.ones((4, 2), np.float32))

