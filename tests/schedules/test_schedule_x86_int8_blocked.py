"""INT8 kernels in NCHW16c (uint8 activations blocked by 16 channels, the last block padded): bit-exact
against the numpy references on this host, from NCHW or NCHW16c data, to NCHW or NCHW16c outputs, with the
VNNI tiling checked through its generic step as in test_schedule_x86_int8.py."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import te

from tvmfuse.schedules.computes import blocked, int8, int8_ref
from tvmfuse.schedules.computes import int8_depthwise as int8_dw
from tvmfuse.schedules.x86 import int8_conv2d, int8_depthwise

from helpers.layout import to_blocked as blocked_array, to_plain
from helpers.int8_kernels import (HOST_BITS, Conv, build, codes, epilogue, kernel_data, packed_for, run,
                                  schedule_with, weight_placeholder)

BLOCK = int8.BLOCK_O


def to_blocked(a: np.ndarray, fill: int = 0) -> np.ndarray:
    """NCHW -> NCHW16c, the last block's missing channels ``fill``."""
    return blocked_array(a, BLOCK, fill)


def _padded(values: np.ndarray, length: int) -> np.ndarray:
    return np.concatenate([values, np.zeros(length - values.size, values.dtype)])


CONV_CASES = [
    Conv(19, 37, 14, 3, pad=1, act="relu"),  # C and O not multiples of 16: padded blocks in and out
    Conv(32, 16, 9, 1, act="relu6", residual="uint8"),  # 1x1 with a residual read NCHW16c
    Conv(21, 33, 11, 3, stride=2, residual="int8", out="int8"),
    Conv(24, 48, 7, 3, pad=1, out="float32", act="relu6"),  # dequantized, written NCHW
    Conv(8, 5, 12, 3, pad=2, dilation=2, za=255),
    Conv(24, 40, 6, 1, act="hardswish", residual="uint8"),
    Conv(32, 32, 10, 3, pad=1, act="relu", residual="uint8"),  # AVX2 pairs: 2 blocks x 2 pixels
    Conv(64, 40, 9, 1, act="requantized_relu", residual="uint8"),  # a QDQ model's residual add after its codes
]


def test_the_avx2_pair_step_takes_block_tiles_for_stride_1_convs():
    # 3 blocks x 2 pixels where 3 divide, else 2 x 2; a stride-2 conv keeps the row tile (it loses with 2 x 2).
    assert int8_conv2d.default_config(9, 56, 256, False, pairs=True) == int8_conv2d.Config(3, 2)
    assert int8_conv2d.default_config(4, 56, 256, False, pairs=True) == int8_conv2d.Config(2, 2)
    assert int8_conv2d.default_config(4, 28, 256, False, pairs=True, stride=2) == int8_conv2d.Config(1, 4)
    assert int8_conv2d.default_config(10, 7, 256, False, pairs=True) == int8_conv2d.Config(1, 7)  # odd row
    assert int8_conv2d.default_config(9, 56, 512, False, pairs=True) == int8_conv2d.Config(1, 14)  # zmm: as before
    for case, stride in ((Conv(24, 48, 8, 1), 1), (Conv(16, 32, 9, 3, stride=2, pad=1), 2)):
        x = te.placeholder((1, -(-case.c // BLOCK), *case.in_shape()[2:], BLOCK), "uint8", name="x")
        wt = weight_placeholder((-(-case.o // 16), -(-case.c // 4), case.k, case.k, 16, 4), "avx2")
        channels = -(-case.o // BLOCK) * BLOCK
        b, m = (te.placeholder((channels,), d, name=n) for n, d in (("b", "int32"), ("m", "float32")))
        out = int8.conv2d_compute(x, wt, b, m, out_channels=case.o, strides=case.stride, padding=case.pad,
                                  epilogue=epilogue("uint8", None, None), out_layout=int8.BLOCKED_LAYOUT)
        from tvm import s_tir

        sch = s_tir.Schedule(int8.prim_func([x, wt, b, m, out]))
        assert int8_conv2d._width_stride(sch, sch.get_sblock(int8_conv2d.ANCHOR)) == stride


@pytest.mark.parametrize("data_blocked", [True, False], ids=["nchw16c_in", "nchw_in"])
@pytest.mark.parametrize("mode", ["host", "avx2", "vnni-tiles"])
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv2d_nchw16c_bit_exact(case, mode, data_blocked):
    out_layout = "NCHW" if case.out == "float32" else int8.BLOCKED_LAYOUT
    n, c, h, w = case.in_shape()
    out_shape = int8.out_shape_of(*case.out_shape(), out_layout)
    channels = out_shape[1] * (BLOCK if out_layout != "NCHW" else 1)
    x = te.placeholder((n, -(-c // BLOCK), h, w, BLOCK) if data_blocked else (n, c, h, w), "uint8", name="x")
    wt = weight_placeholder((-(-case.o // 16), -(-c // 4), case.k, case.k, 16, 4), mode)
    b, m = te.placeholder((channels,), "int32", name="b"), te.placeholder((channels,), "float32", name="m")
    r = te.placeholder(out_shape, case.residual, name="r") if case.residual else None
    ep = epilogue(case.out, case.act, case.residual)
    out = int8.conv2d_compute(x, wt, b, m, r, out_channels=case.o, strides=case.stride, padding=case.pad,
                              dilation=case.dilation, input_zero_point=case.za, epilogue=ep, out_layout=out_layout)
    func = int8.prim_func([x, wt, b, m] + ([r] if r is not None else []) + [out])
    sched = schedule_with(int8_conv2d, func, mode, lambda bits, vnni_: int8_conv2d.default_config(
        -(-case.o // 16), case.out_shape()[3], bits, vnni_))
    assert sched is not None
    rng = np.random.default_rng(4)
    xv = codes(rng, case.in_shape(), "uint8", False)
    wv = codes(rng, (case.o, c, case.k, case.k), "int8", False)
    bias, mult, res = kernel_data(rng, case.out_shape(), case.o, case.residual, False, case.act)
    ref = int8_ref.conv2d_ref(xv, wv, bias, mult, res, strides=case.stride, padding=case.pad,
                              dilation=case.dilation, input_zero_point=case.za, epilogue=ep)
    folded = int8_ref.fold_zero_point(bias, wv, case.za)
    args = [to_blocked(xv, fill=200) if data_blocked else xv, packed_for(int8_ref.pack_conv2d_weight(wv), mode),
            _padded(folded, channels), _padded(mult, channels)]
    if res is not None:
        args.append(to_blocked(res))
    got = run(sched, args, out)
    np.testing.assert_array_equal(to_plain(got, case.o) if out_layout != "NCHW" else got, ref)


DW_CASES = [
    Conv(24, 24, 15, 3, pad=1, act="relu6"),  # one and a half blocks
    Conv(40, 40, 16, 3, stride=2, pad=1, residual="int8", out="int8", za=0),
    Conv(16, 16, 14, 5, pad=2, out="float32", za=255),  # written NCHW
    Conv(5, 5, 13, 7, pad=3, act="relu", residual="uint8"),
    Conv(32, 32, 9, 3, pad=2, dilation=2),
    Conv(7, 7, (10, 17), 3, stride=2, pad=(1, 0, 0, 1), n=2),  # batch 2, non-square, asymmetric pad
    Conv(20, 20, 1, 1, out="float32", za=100),  # 1x1 plane
    Conv(24, 24, 12, 5, pad=2, act="hardswish"),
    Conv(32, 32, 10, 3, pad=1, act="hardswish_affine"),  # PP-LCNetV3's hardswish + learnable affine block
    Conv(24, 24, 12, 3, pad=1, act="requantized", residual="int8", out="int8"),
]


def _depthwise(case, extreme, pack, float_bias=False):
    """Build ``case`` with the weight layout of ``pack`` (``pack_weight``, ``pack_weight_vnni`` or
    ``pack_weight_pairs``): the compute, the numpy operands and the reference. ``float_bias``: the float form's
    bias as float32."""
    out_layout = "NCHW" if case.out == "float32" else int8.BLOCKED_LAYOUT
    n, c, h, w = case.in_shape()
    blocks = -(-c // BLOCK)
    out_shape = int8.out_shape_of(*case.out_shape(), out_layout)
    channels = c if out_layout == "NCHW" else blocks * BLOCK
    rng = np.random.default_rng(5)
    xv = codes(rng, case.in_shape(), "uint8", extreme)
    wv = codes(rng, (c, 1, case.k, case.k), "int8", extreme)
    bias, mult, res = kernel_data(rng, case.out_shape(), c, case.residual, extreme, case.act)
    packed = pack(wv)
    x = te.placeholder((n, blocks, h, w, BLOCK), "uint8", name="x")
    wt = te.placeholder(packed.shape, str(packed.dtype), name="w")
    bias_dtype = "float32" if float_bias else "int32"
    b, m = te.placeholder((channels,), bias_dtype, name="b"), te.placeholder((channels,), "float32", name="m")
    r = te.placeholder(out_shape, case.residual, name="r") if case.residual else None
    ep = epilogue(case.out, case.act, case.residual)
    width = {"kernel_width": case.k} if packed.ndim >= 5 else {}
    out = int8_dw.depthwise_conv2d_compute(x, wt, b, m, r, strides=case.stride, padding=case.pad,
                                           dilation=case.dilation, input_zero_point=case.za, epilogue=ep,
                                           out_layout=out_layout, channels=c, **width)
    func = int8.prim_func([x, wt, b, m] + ([r] if r is not None else []) + [out])
    # the float form subtracts the zero point itself: its bias has none folded in
    folded = int8_ref.fold_zero_point(bias, wv, 0 if pack is int8_dw.pack_weight_float else case.za)
    args = [to_blocked(xv, fill=77), packed, _padded(folded, channels).astype(bias_dtype), _padded(mult, channels)]
    if res is not None:
        args.append(to_blocked(res))
    ref = int8_ref.depthwise_conv2d_ref(xv, wv, bias, mult, res, strides=case.stride, padding=case.pad,
                                        dilation=case.dilation, input_zero_point=case.za, epilogue=ep)
    return func, out, args, ref


def _check_depthwise(case, func, out, args, ref):
    got = run(func, args, out)
    np.testing.assert_array_equal(to_plain(got, case.in_shape()[1]) if len(got.shape) == 5 else got, ref)


@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("case", DW_CASES, ids=str)
def test_depthwise_nchw16c_bit_exact(case, extreme):
    func, out, args, ref = _depthwise(case, extreme, int8_dw.pack_weight)
    func = int8_depthwise.apply(func, HOST_BITS)
    assert func is not None and "T.parallel" in func.script() and "T.vectorized" in func.script()
    _check_depthwise(case, func, out, args, ref)


TAPS_CASES = [case for case in DW_CASES if case.dilation == 1] + [
    Conv(48, 48, (3, 96), 5, pad=2, act="hardswish", residual="uint8"),  # the PP-OCR classifiers' rows
    Conv(16, 16, 9, 4, pad=(1, 2, 2, 1)),  # even kernel, one whole group of taps
    Conv(24, 24, 11, 6, stride=2, pad=(0, 3, 0, 2), out="float32"),  # two groups, the last half empty
]


@pytest.mark.parametrize("step", ["host", "generic", "pairs-host", "pairs-avx2", "pairs-generic"])
@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("case", TAPS_CASES, ids=str)
def test_depthwise_taps_in_fours_bit_exact(case, extreme, step):
    """The VNNI kernel (4 taps of a row per vpdpbusd) on this host's VNNI where it has it, and through the
    step's description (any CPU)."""
    from tvmfuse import targets

    vnni = "avx512vnni" in targets.resolve("x86-host").features()
    if step == "host" and not vnni:
        pytest.skip("needs a CPU with AVX512-VNNI to run the vpdpbusd step")
    if step.startswith("pairs"):
        _check_pair_taps(case, extreme, step)
        return
    func, out, args, ref = _depthwise(case, extreme, int8_dw.pack_weight_vnni)
    width = int(out.shape[3])
    config = int8_depthwise.Config(int8_depthwise.taps_ow_block(width), "vnni" if step == "host" else "generic")
    func = int8_depthwise.apply(func, 512, True, config)
    script = func.script()
    assert "T.parallel" in script and f"depthwise_4x16_{config.dot}" not in script  # tensorized: the step inlined
    assert ("llvm.x86.avx512.vpdpbusd.512" in script) == (step == "host")
    _check_depthwise(case, func, out, args, ref)


def _check_pair_taps(case, extreme, step):
    """The taps in fours as int16 pairs (CPUs without VNNI): the host's vector width, the 256-bit step, or
    the step's description."""
    func, out, args, ref = _depthwise(case, extreme, int8_dw.pack_weight_pairs)
    bits = {"pairs-host": HOST_BITS, "pairs-avx2": 256, "pairs-generic": HOST_BITS}[step]
    config = int8_depthwise.Config(int8_depthwise.taps_ow_block(int(out.shape[3])), "generic") \
        if step == "pairs-generic" else None
    func = int8_depthwise.apply(func, bits, False, config)
    assert ("pmadd" in func.script()) == (step != "pairs-generic")
    _check_depthwise(case, func, out, args, ref)


FLOAT_CASES = DW_CASES + [
    Conv(48, 48, (3, 96), 5, pad=2, act="hardswish", residual="uint8"),  # the PP-OCR classifiers' rows
    Conv(40, 40, (2, 24), 5, pad=2, act="relu6"),  # 3 of 5 kernel rows on padding for every output row
    Conv(24, 24, (2, 20), 5, stride=2, pad=2, out="float32"),
]


@pytest.mark.parametrize("bias", ["int32", "float32"])
@pytest.mark.parametrize("bits", [HOST_BITS, 256], ids=["host", "avx2"])
@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("case", FLOAT_CASES, ids=str)
def test_depthwise_float_sums_bit_exact(case, extreme, bits, bias):
    """The form CPUs without VNNI run wide kernel rows on: (q - za) * w summed in float32, exact, with the
    kernel rows that read only padding skipped where enough do (``padding_taps``, as compile runs it); its
    bias int32 (the sums converted to int32 first) or float32 (added to the float sums)."""
    from tvmfuse.schedules import padding_taps

    func, out, args, ref = _depthwise(case, extreme, int8_dw.pack_weight_float, bias == "float32")
    assert ("float_sums" in func.script()) == (bias == "int32")
    func = int8_depthwise.apply(func, bits, False)
    assert func is not None and "T.parallel" in func.script()
    guarded = padding_taps.skip_padding_taps(func)
    top, h, out_h = (case.pad if isinstance(case.pad, int) else case.pad[0]), case.in_shape()[2], case.out_shape()[2]
    on_padding = [not 0 <= y * case.stride + r * case.dilation - top < h for y in range(out_h) for r in range(case.k)]
    assert (not guarded.same_as(func)) == (sum(on_padding) / len(on_padding) >= padding_taps.MIN_SKIPPED), case
    _check_depthwise(case, guarded, out, args, ref)


def test_depthwise_float_sums_refuse_what_float32_cannot_sum_exactly():
    x = te.placeholder((1, 1, 40, 40, BLOCK), "uint8", name="x")
    w = te.placeholder((1, 23, 23, BLOCK), "float32", name="w")  # 529 taps > FLOAT_TAPS
    b, m = te.placeholder((BLOCK,), "int32", name="b"), te.placeholder((BLOCK,), "float32", name="m")
    with pytest.raises(int8.Int8KernelError, match=r"a float32 weight sums exactly up to 514 taps, got 23x23"):
        int8_dw.depthwise_conv2d_compute(x, w, b, m, padding=11, channels=BLOCK)


def test_depthwise_pair_taps_compile_to_vpmaddwd_without_int32_multiplies():
    """On a Zen 3 (AVX2, no VNNI) the depthwise kernel takes its taps two by two: vpmaddwd on interleaved,
    zero-extended pixels; no vpmulld (the one-tap-per-multiply kernel's step)."""
    func, *_ = _depthwise(Conv(32, 32, 14, 3, pad=1, act="relu6"), False, int8_dw.pack_weight_pairs)
    asm = build(int8_depthwise.apply(func, 256, False), {"kind": "llvm", "mcpu": "znver3"}).mod.inspect_source("asm")
    assert "vpmaddwd" in asm and "vpunpcklbw" in asm and "vpmulld" not in asm and "zmm" not in asm


def test_depthwise_pair_packing_is_the_vnni_groups_as_int16_pairs():
    w = np.random.default_rng(0).integers(-127, 128, (20, 1, 5, 5)).astype(np.int8)
    pairs = int8_dw.pack_weight_pairs(w)
    assert pairs.shape == (2, 5, 2, 2, BLOCK, 2) and pairs.dtype == np.int16
    assert pairs[0, 2, 0, 1, 3, 1] == w[3, 0, 2, 3]  # channel 3, row 2, group 0, taps 2p + k = 3
    np.testing.assert_array_equal(int8_ref.from_pairs(pairs), int8_dw.pack_weight_vnni(w))


def test_depthwise_taps_pad_copy_is_partitioned_at_the_borders():
    """Rows above, inside and below the data, and columns left, inside and right in the inside rows: five
    copies whose select the loop bounds decide."""
    func, *_ = _depthwise(Conv(24, 24, 12, 3, pad=1), False, int8_dw.pack_weight_vnni)
    import re

    script = int8_depthwise.apply(func, 512, True).script()
    copies = [name for name in re.findall(r'T\.sblock\("(data_pad\w*)"\)', script)
              if not name.endswith(("_common", "_partition"))]
    assert len(copies) == 5, copies


def test_depthwise_vnni_packing_round_trips_with_zero_taps():
    w = np.random.default_rng(0).integers(-127, 128, (20, 1, 5, 5)).astype(np.int8)
    packed = int8_dw.pack_weight_vnni(w)
    assert packed.shape == (2, 5, 2, BLOCK, 4) and not packed[:, :, 1, :, 1:].any() and not packed[1, :, :, 4:].any()
    np.testing.assert_array_equal(packed[0, 2, 1, 3, 0], w[3, 0, 2, 4])
    np.testing.assert_array_equal(int8_dw.unpack_weight_vnni(packed, 20, 5), w)


def test_depthwise_taps_in_fours_refuse_row_dilation_and_a_missing_width():
    x = te.placeholder((1, 2, 8, 8, BLOCK), "uint8", name="x")
    wt = te.placeholder((2, 3, 1, BLOCK, 4), "int8", name="w")
    b, m = te.placeholder((32,), "int32", name="b"), te.placeholder((32,), "float32", name="m")
    with pytest.raises(int8.Int8KernelError, match="dilation 2 along the row"):
        int8_dw.depthwise_conv2d_compute(x, wt, b, m, dilation=2, padding=2, kernel_width=3)
    for width in (None, 5):
        with pytest.raises(int8.Int8KernelError, match=f"1 group.s. of 4 taps per row needs kernel_width from 1 to 4, "
                                                       f"got {width}"):
            int8_dw.depthwise_conv2d_compute(x, wt, b, m, padding=1, kernel_width=width)
    with pytest.raises(int8.Int8KernelError, match=r"weight must be int8 \[2, kh, 1, 16, 4\] or its int16 pairs "
                                                   r"\[.., 2, 16, 2\] for kw = 3, got \[2, 3, 1, 8, 4\]"):
        int8_dw.depthwise_conv2d_compute(x, te.placeholder((2, 3, 1, 8, 4), "int8", name="w"), b, m, padding=1,
                                         kernel_width=3)


def test_depthwise_weight_packing_round_trips_with_zero_padding():
    w = np.random.default_rng(0).integers(-127, 128, (20, 1, 3, 3)).astype(np.int8)
    packed = int8_dw.pack_weight(w)
    assert packed.shape == (2, 3, 3, BLOCK) and not packed[1, :, :, 4:].any()
    np.testing.assert_array_equal(int8_dw.unpack_weight(packed, 20), w)


@pytest.mark.parametrize("channels", [24, 32])
def test_uint8_layout_transforms_pad_and_crop(channels):
    from tvmfuse.passes.layout import layout_kernel
    from tvmfuse.schedules.x86 import layout

    x = np.random.default_rng(1).integers(0, 256, (1, channels, 7, 12)).astype(np.uint8)
    t = te.placeholder(x.shape, "uint8", name="data")
    there = blocked.to_blocked(t, BLOCK)
    func = layout.apply(layout_kernel(lambda d: blocked.to_blocked(d, BLOCK), _Info(x.shape, "uint8")), 16)
    got = run(func, [x], there)
    np.testing.assert_array_equal(got, to_blocked(x))
    back_t = te.placeholder(got.shape, "uint8", name="data")
    back = blocked.to_plain(back_t, channels)
    func = layout.apply(layout_kernel(lambda d: blocked.to_plain(d, channels), _Info(got.shape, "uint8")), 16)
    np.testing.assert_array_equal(run(func, [got], back), x)


def test_computes_reject_mismatched_blocked_operands():
    x = te.placeholder((1, 2, 8, 8, BLOCK), "uint8", name="x")
    b, m = te.placeholder((32,), "int32", name="b"), te.placeholder((32,), "float32", name="m")
    with pytest.raises(int8.Int8KernelError, match="blocks of 4 input channels"):
        int8.conv2d_compute(x, te.placeholder((2, 3, 1, 1, 16, 4), "int8", name="w"), b, m, out_channels=32,
                            out_layout=int8.BLOCKED_LAYOUT)
    with pytest.raises(int8.Int8KernelError, match="out_layout"):
        int8.conv2d_compute(x, te.placeholder((2, 8, 1, 1, 16, 4), "int8", name="w"), b, m, out_channels=32,
                            out_layout="NHWC")
    with pytest.raises(int8.Int8KernelError, match="channels do not fit"):
        int8_dw.depthwise_conv2d_compute(x, te.placeholder((2, 3, 3, BLOCK), "int8", name="w"), b, m, channels=12)


class _Info:
    """What ``layout_kernel`` reads of a struct info: shape and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = list(shape), dtype


@pytest.mark.parametrize("k, pad, in_place", [(1, 0, True), (3, 1, False)])
def test_conv2d_reads_unpadded_nchw16c_in_place(k, pad, in_place):
    """Without padding the NCHW16c input is the VNNI step's operand as it lies: no ``data_pack`` copy."""
    x = te.placeholder((1, 4, 14, 14, BLOCK), "uint8", name="x")
    wt = te.placeholder((2, 16, k, k, 16, 4), "int8", name="w")
    b, m = te.placeholder((32,), "int32", name="b"), te.placeholder((32,), "float32", name="m")
    out = int8.conv2d_compute(x, wt, b, m, out_channels=32, padding=pad, input_zero_point=3,
                              out_layout=int8.BLOCKED_LAYOUT)
    func = int8_conv2d.apply(int8.prim_func([x, wt, b, m, out]), 512, True)
    assert ('T.sblock("data_pack")' not in func.script()) == in_place


def test_taps_tiles_stop_at_8_pixels():
    """12-pixel tiles of the taps-in-fours kernel spilled on AVX512-VNNI (a 96-wide row: 3-5x the time of 8):
    the default takes at most 8 pixels, the row's largest divisor up to that."""
    assert int8_depthwise.taps_ow_block(96) == 8 and int8_depthwise.taps_ow_block(48) == 8
    assert int8_depthwise.taps_ow_block(28) == 7 and int8_depthwise.taps_ow_block(14) == 7
    assert int8_depthwise.taps_ow_block(12) == 6 and int8_depthwise.taps_ow_block(5) == 5
