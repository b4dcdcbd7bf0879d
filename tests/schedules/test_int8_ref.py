"""The numpy side of the INT8 kernels (tvmfuse.schedules.computes.int8_ref) and the epilogue parameters: weight packing,
zero-point folding, requantization by known answers, activation bounds."""

from __future__ import annotations

import numpy as np
import pytest

from tvmfuse.schedules.computes import int8, int8_ref


def test_pack_conv2d_weight_layout_and_padding():
    w = np.random.default_rng(0).integers(-127, 128, (37, 19, 3, 2)).astype("int8")
    p = int8_ref.pack_conv2d_weight(w)
    assert p.shape == (3, 5, 3, 2, 16, 4) and p.dtype == np.int8 and p.flags.c_contiguous
    assert p[1, 2, 0, 1, 5, 3] == w[16 + 5, 8 + 3, 0, 1]
    assert not p[2, :, :, :, 5:].any() and not p[:, 4, :, :, :, 3:].any()  # O 37..47 and I 19 are zeros
    np.testing.assert_array_equal(int8_ref.unpack_conv2d_weight(p, 37, 19), w)


def test_pack_dense_weight_layout_and_padding():
    w = np.random.default_rng(0).integers(-127, 128, (70, 130)).astype("int8")
    p = int8_ref.pack_dense_weight(w)
    assert p.shape == (5, 33, 16, 4)
    assert p[4, 32, 5, 1] == w[69, 129] and not p[4, :, 6:].any() and not p[:, 32, :, 2:].any()
    np.testing.assert_array_equal(int8_ref.unpack_dense_weight(p, 70, 130), w)


def test_pack_rejects_minus_128_and_wrong_dtype():
    with pytest.raises(int8.Int8KernelError, match="-128"):
        int8_ref.pack_conv2d_weight(np.full((16, 4, 1, 1), -128, np.int8))
    with pytest.raises(int8.Int8KernelError, match="int8"):
        int8_ref.pack_dense_weight(np.zeros((16, 4), np.float32))


def test_fold_zero_point_is_the_zero_point_compensation():
    rng = np.random.default_rng(0)
    x, w = rng.integers(0, 256, (3, 50)), rng.integers(-127, 128, (7, 50)).astype("int8")
    bias = rng.integers(-999, 999, 7).astype("int32")
    folded = int8_ref.fold_zero_point(bias, w, 201)
    assert folded.dtype == np.int32
    np.testing.assert_array_equal(x @ w.T.astype(int) + folded, (x - 201) @ w.T.astype(int) + bias)
    np.testing.assert_array_equal(int8_ref.fold_zero_point(None, w, 0), np.zeros(7, np.int32))
    with pytest.raises(int8.Int8KernelError, match="bias"):
        int8_ref.fold_zero_point(bias[:3], w, 1)


def test_requantize_rounds_half_to_even_and_clips():
    ep = int8.Epilogue.make("uint8", zero_point=10)
    acc = np.array([[5, 7, -5, 1000, -1000]], np.int64)  # x 0.5: 2.5, 3.5, -2.5, 500, -500
    np.testing.assert_array_equal(int8_ref.requantize(acc, np.full(5, 0.5, np.float32), ep), [[12, 14, 8, 255, 0]])
    out = int8_ref.requantize(acc, np.full(5, 0.5, np.float32), int8.Epilogue.make("float32", activation="relu6"))
    np.testing.assert_array_equal(out, np.array([[2.5, 3.5, 0, 6, 0]], np.float32))


def test_epilogue_activation_bounds():
    assert int8.Epilogue.make("uint8", 20, 0.05, "relu").bounds() == (20, 255)
    assert int8.Epilogue.make("uint8", 20, 0.05, "relu6").bounds() == (20, 140)
    assert int8.Epilogue.make("int8", -100, 0.01, "relu6").bounds() == (-100, 127)
    assert int8.Epilogue.make("float32", activation="relu6").bounds() == (0.0, 6.0)
    assert int8.Epilogue.make("float32").bounds() == (None, None)
    assert int8.Residual(3, 0.1).scale == float(np.float32(0.1))
    with pytest.raises(int8.Int8KernelError, match="activation"):
        int8.Epilogue.make("uint8", activation="gelu")
    with pytest.raises(int8.Int8KernelError, match="out_dtype"):
        int8.Epilogue("int16")
    assert int8.Epilogue("int32").bounds() == (None, None)  # the accumulator as it is (MatMulInteger)
    with pytest.raises(int8.Int8KernelError, match="zero point"):
        int8.Epilogue("float32", zero_point=3)
    with pytest.raises(int8.Int8KernelError, match="zero point"):
        int8.Epilogue("int8", zero_point=128)
    with pytest.raises(int8.Int8KernelError, match="empty clip"):
        int8.Epilogue("uint8", clip_min=200, clip_max=100)


def test_fma32_rounds_once_like_llvm_fma():
    """int8_ref.fma32 against a fused multiply-add compiled by TVM (llvm.fma, the residual epilogue's op),
    on values whose float64 sum is inexact and on float32 ties, where rounding twice gives another answer."""
    import tvm
    from tvm import te, tirx

    rng = np.random.default_rng(0)
    n = 1 << 16
    a = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 30, n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(-30, 30, n).astype(np.float32)
    # a * b = 1 + 2**-11 + 2**-24, halfway between two float32: plus 2**-80 it rounds up, but the float64 sum
    # drops the 2**-80 and a second rounding (ties to even) goes down.
    a[:4], b[:4], c[:4] = [1 + 2.0 ** -12] * 4, [1 + 2.0 ** -12] * 4, [2.0 ** -80, -(2.0 ** -80), 2.0 ** -30, 0.0]
    x, y, z = (te.placeholder((n,), "float32", name=s) for s in "xyz")
    out = te.compute((n,), lambda i: tirx.call_llvm_pure_intrin("float32", "llvm.fma", x[i], y[i], z[i]), name="o")
    lib = tvm.compile(te.create_prim_func([x, y, z, out]), target="llvm")
    got = tvm.runtime.tensor(np.zeros(n, np.float32))
    lib(*[tvm.runtime.tensor(v) for v in (a, b, c)], got)
    ref = int8_ref.fma32(a, b, c)
    np.testing.assert_array_equal(ref, got.numpy())
    twice = a * b + c
    assert (twice != ref).sum() > 100  # the test can tell one rounding from two
    assert ref[0] == np.float32(1 + 2.0 ** -11 + 2.0 ** -23)
    assert (a[:1].astype(np.float64) * b[:1] + c[:1]).astype(np.float32)[0] == np.float32(1 + 2.0 ** -11)


def test_pairs_fit_int16_is_the_vpmaddubsw_bound():
    """A pair of codes fits when 255 times its positive (negative) codes stays within int16: sums up to 128."""
    def fits(pair):
        block = np.zeros((1, 1, 16, 4), np.int8)
        block[0, 0, 5, 2:] = pair
        return int8_ref.pairs_fit_int16(block)

    assert fits((64, 64)) and fits((-64, -64)) and fits((127, 1)) and fits((127, -127)) and fits((-128, 0))
    assert not fits((100, 29)) and not fits((-100, -29)) and not fits((127, 2))
    assert int8_ref.PAIR_SAFE_CODE * 2 == int8_ref.PAIR_SUM_LIMIT and 255 * int8_ref.PAIR_SUM_LIMIT <= 32767
    codes = np.random.default_rng(0).integers(-64, 65, (3, 4, 16, 4)).astype(np.int8)
    assert int8_ref.pairs_fit_int16(codes)


def test_requantized_codes_go_with_a_residual_and_a_quantized_output():
    rq = int8.Requantized("uint8", 120, 0.03, 0.05)
    res = int8.Residual(128, 0.02)
    assert int8.Epilogue("uint8", 3, residual=res, requantized=rq).requantized == rq
    for kwargs in ({"out_dtype": "uint8"}, {"out_dtype": "float32", "residual": res},
                   {"out_dtype": "uint8", "residual": res, "hardswish": int8.HardSwish()},
                   {"out_dtype": "uint8", "residual": res, "clip_min": 2.5}):
        with pytest.raises(int8.Int8KernelError, match="requantized codes go with a residual"):
            int8.Epilogue(requantized=rq, **kwargs)
    with pytest.raises(int8.Int8KernelError, match="scale must be positive"):
        int8.Requantized("uint8", 120, 0.0, 0.05)
    with pytest.raises(int8.Int8KernelError, match="do not fit int8"):
        int8.Requantized("int8", 128, 0.03, 0.05)
    with pytest.raises(int8.Int8KernelError, match="must be uint8/int8"):
        int8.Requantized("int32", 0, 0.03, 0.05)


def test_requantized_reference_rounds_the_codes_then_the_sum():
    # codes 120 + 3 = 123 (acc 100 * 0.03), the sum (3 * 0.03 + 2 * 0.02) / 0.05 = 2.6 -> 3, + zero point 3
    rq = int8.Requantized("uint8", 120, 0.03, 0.05, clip_min=120)
    ep = int8.Epilogue("uint8", 3, residual=int8.Residual(128, 0.02), requantized=rq)
    acc = np.array([[100, -100]], np.int32).reshape(1, 1, 1, 2)
    residual = np.array([130, 130], np.uint8).reshape(1, 1, 1, 2)
    got = int8_ref.requantize(acc, np.array([0.03], np.float32), ep, residual)
    # -100 * 0.03 = -3 codes, clipped to the relu's 120: the sum is the residual's 0.04 / 0.05 = 0.8 -> 1
    np.testing.assert_array_equal(got.reshape(-1), [6, 4])
