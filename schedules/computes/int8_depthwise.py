"""TE compute of the INT8 depthwise conv2d (multiplier 1), NCHW or NCHW16c, with the requantize epilogue.

The conventions are :mod:`tvmfuse.schedules.computes.int8`'s: uint8 codes in, int8 weights, the input zero point
folded into the int32 bias and spatial padding filled with it. A depthwise conv has no channel reduction
for VNNI's 4-wide dot product: the plain forms sum int32 products, the taps-in-fours form gives it 4 taps of
a kernel row instead.

- NCHW (``weight`` ``[C, 1, kh, kw]``): vectors run along output rows, which a stride makes gathers.
- NCHW16c (``weight`` ``[ceil(C/16), kh, kw, 16]``, :func:`pack_weight`): the 16 channels of a pixel are one
  16-byte load widened to 16 int32 lanes, whatever the stride, dilation or row width. The output is written
  NCHW16c, or NCHW (a float32 output for FP32 consumers).
- NCHW16c with taps in fours (``weight`` ``[ceil(C/16), kh, ceil(kw/4), 16, 4]``, :func:`pack_weight_vnni`;
  dilation 1 along the row): each kernel row's taps are summed 4 at a time, 4 neighbouring pixels against
  channel i's 4 weights in one 32-bit word, the step AVX512-VNNI does in one instruction
  (the x86 backend's ``intrin/depthwise_vnni.py``). Taps past ``kw`` have zero weights; the padded
  input has the columns they read. The same weight as int16 pairs (``[ceil(C/16), kh, ceil(kw/4), 2, 16, 2]``,
  :func:`pack_weight_pairs`: taps 2p and 2p+1 of each channel side by side) is the layout of the 16-bit
  multiply-add step of CPUs without VNNI (``intrin/depthwise_pairs.py``); the dtype tells them apart.
- NCHW16c in float (``weight`` float32 ``[ceil(C/16), kh, kw, 16]``, :func:`pack_weight_float`): the codes
  less the zero point are converted to float32 once, in the padding stage (the padding 0), and every tap is
  one float multiply-add, exact: each product is an integer of at most 255 x 128 in magnitude and every
  partial sum of up to :data:`FLOAT_TAPS` of them stays below 2^24, where float32 holds every integer. The
  sum is ``sum((q - za) * w)``: the bias takes no folded zero point (``input_zero_point`` is subtracted
  here), and a kernel row that reads only padding adds 0, which a backend may skip. The bias may be float32
  too (every value within 2^24 in magnitude, :data:`FLOAT_BIAS`): the sum plus the bias is then one float add,
  rounded as the int32 sum's conversion would round it (both operands exact), and the float -> int32 -> float
  round trip of the sums goes. A CPU without VNNI has no
  integer step that beats its two FMAs a cycle on a sum over taps (the taps-in-fours pair step takes 4 uops
  per 32 products, and wastes 3 of 8 taps of a 5-wide row).
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from .. import families
from . import int8_ref
from .int8 import (BLOCK_O, Epilogue, _check, _check_data, _check_epilogue, _epilogue_stage, _geometry,
                   _padded, _shape, out_shape_of)

NAME = "INT8 depthwise conv2d"
TAPS = 4  # taps of a row summed per 32-bit word (pack_weight_vnni)
FLOAT_TAPS = 2**24 // (255 * 128)  # kernel taps whose float32 sum of u8 x s8 products is exact (514)
ANCHOR, PAD = families.DEPTHWISE_CONV2D.int8.anchor_block, families.DEPTHWISE_CONV2D.int8.pad_block
FLOAT_SUMS = "float_sums"  # the float form's conversion of its sums to int32 (with an int32 bias)
FLOAT_BIAS = 2**24  # the float form takes a float32 bias whose every value is at most this in magnitude
PADDING_ROWS = "tvmfuse.padding_rows"  # the float form's anchor: the share of its row steps on padding rows
BORDER = "tvmfuse.border"  # the padding stage's annotation: [top, left, height, width] of the data inside it


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """``[C, 1, kh, kw]`` int8 -> ``[ceil(C/16), kh, kw, 16]``, the padded channels' weights zero."""
    weight = np.asarray(weight)
    if weight.dtype != np.int8 or weight.ndim != 4 or weight.shape[1] != 1:
        raise ValueError(f"depthwise weight must be int8 [C, 1, kh, kw], got {weight.shape} {weight.dtype}")
    c, _, kh, kw = weight.shape
    blocks = -(-c // BLOCK_O)
    full = np.zeros((blocks * BLOCK_O, kh, kw), np.int8)
    full[:c] = weight[:, 0]
    return np.ascontiguousarray(full.reshape(blocks, BLOCK_O, kh, kw).transpose(0, 2, 3, 1))


def unpack_weight(packed: np.ndarray, channels: int) -> np.ndarray:
    """Inverse of :func:`pack_weight`."""
    blocks, kh, kw, block = packed.shape
    return np.ascontiguousarray(packed.transpose(0, 3, 1, 2).reshape(blocks * block, 1, kh, kw)[:channels])


def pack_weight_vnni(weight: np.ndarray) -> np.ndarray:
    """``[C, 1, kh, kw]`` int8 -> ``[ceil(C/16), kh, ceil(kw/4), 16, 4]``: tap ``4g + k`` of a row at
    ``[.., g, channel, k]``; the padded channels' and taps' weights zero."""
    plain = pack_weight(weight)  # [blocks, kh, kw, 16]
    blocks, kh, kw, _ = plain.shape
    groups = -(-kw // TAPS)
    taps = np.zeros((blocks, kh, groups * TAPS, BLOCK_O), np.int8)
    taps[:, :, :kw] = plain
    return np.ascontiguousarray(taps.reshape(blocks, kh, groups, TAPS, BLOCK_O).transpose(0, 1, 2, 4, 3))


def pack_weight_pairs(weight: np.ndarray) -> np.ndarray:
    """``[C, 1, kh, kw]`` int8 -> ``[ceil(C/16), kh, ceil(kw/4), 2, 16, 2]`` int16: :func:`pack_weight_vnni`'s
    groups of 4 taps with taps 2p and 2p+1 of each channel side by side (``int8_ref.to_pairs``)."""
    return int8_ref.to_pairs(pack_weight_vnni(weight))


def pack_weight_float(weight: np.ndarray) -> np.ndarray:
    """``[C, 1, kh, kw]`` int8 -> ``[ceil(C/16), kh, kw, 16]`` float32: :func:`pack_weight`'s layout, each
    code an exact float."""
    return pack_weight(weight).astype(np.float32)


def unpack_weight_vnni(packed: np.ndarray, channels: int, kw: int) -> np.ndarray:
    """Inverse of :func:`pack_weight_vnni` (``kw``: the kernel's width, which the packing rounds up)."""
    blocks, kh, groups, block, taps = packed.shape
    plain = packed.transpose(0, 1, 2, 4, 3).reshape(blocks, kh, groups * taps, block)[:, :, :kw]
    return unpack_weight(np.ascontiguousarray(plain), channels)


def depthwise_conv2d_compute(data, weight, bias, multiplier, residual=None, *, strides=1, padding=0, dilation=1,
                             input_zero_point: int = 0, epilogue: Epilogue = Epilogue(),
                             out_layout: str | None = None, channels: int | None = None,
                             kernel_width: int | None = None, table=None) -> te.Tensor:
    """INT8 depthwise conv2d with the requantize epilogue.

    ``data`` uint8 NCHW (the NCHW kernel, ``weight`` int8 ``[C, 1, kh, kw]``) or NCHW16c (the NCHW16c
    kernel, ``weight`` ``[ceil(C/16), kh, kw, 16]``, :func:`pack_weight`); ``bias`` int32 (zero point
    folded in) and ``multiplier`` float32, one per output channel of ``out_layout`` (NCHW16c: padded to
    whole blocks; float32, within :data:`FLOAT_BIAS`, with a float32 weight); ``out_layout`` ``"NCHW"`` or
    ``"NCHW16c"`` (None: the data's); ``channels``: C, which
    NCHW16c data does not tell (None: the data's channels, padded ones included). NCHW16c data with a
    weight packed by :func:`pack_weight_vnni` (``[ceil(C/16), kh, ceil(kw/4), 16, 4]``, dilation 1 along
    the row) sums the taps in fours; ``kernel_width`` is then kw, which the packing rounds up. The rest as
    in :func:`tvmfuse.schedules.computes.int8.conv2d_compute`.
    """
    _check_data(NAME, data)
    wshape = _shape(weight)
    blocked = len(data.shape) == 5
    floats = str(weight.dtype) == "float32"  # pack_weight_float
    pairs = str(weight.dtype) == "int16"  # pack_weight_pairs: [blocks, kh, groups, 2, 16, 2]
    # pack_weight_vnni: taps in fours, [blocks, kh, groups, 16, 4]
    taps = blocked and len(wshape) == (6 if pairs else 5)
    kh, kw = wshape[1:3] if blocked else wshape[2:]
    if taps:
        _check(kernel_width is not None and 0 < kernel_width <= kw * TAPS, NAME,
               f"a weight packed in {kw} group(s) of {TAPS} taps per row needs kernel_width from 1 to {kw * TAPS}, "
               f"got {kernel_width}")
        kw = kernel_width
    (n, c, h, w), (sh, sw), (dh, dw), pad, (out_h, out_w) = _geometry(NAME, data, kh, kw, strides, padding, dilation)
    if taps:
        block = [2, BLOCK_O, 2] if pairs else [BLOCK_O, TAPS]
        _check(str(weight.dtype) in ("int8", "int16") and wshape[0] == c // BLOCK_O and wshape[3:] == block
               and wshape[2] == -(-kw // TAPS), NAME,
               f"weight must be int8 [{c // BLOCK_O}, kh, {-(-kw // TAPS)}, {BLOCK_O}, {TAPS}] or its int16 pairs "
               f"[.., 2, {BLOCK_O}, 2] for kw = {kw}, got {wshape} {weight.dtype}")
        _check(dw == 1, NAME, f"taps in fours read neighbouring pixels: dilation {dw} along the row needs "
               "pack_weight's layout")
    elif blocked:
        _check(str(weight.dtype) in ("int8", "float32") and len(wshape) == 4 and wshape[0] == c // BLOCK_O
               and wshape[3] == BLOCK_O, NAME,
               f"weight must be int8 or float32 [{c // BLOCK_O}, kh, kw, {BLOCK_O}] for NCHW16c data, got {wshape} "
               f"{weight.dtype}")
        _check(not floats or kh * kw <= FLOAT_TAPS, NAME,
               f"a float32 weight sums exactly up to {FLOAT_TAPS} taps, got {kh}x{kw}")
    else:
        _check(str(weight.dtype) == "int8" and len(wshape) == 4 and wshape[1] == 1 and wshape[0] == c, NAME,
               f"weight must be int8 [C, 1, kh, kw] with C = {c} for NCHW data, got {wshape} {weight.dtype}")
    layout = out_layout or ("NCHW16c" if blocked else "NCHW")
    channels = channels or c
    _check(c - BLOCK_O < channels <= c if blocked else channels == c, NAME,
           f"{channels} channels do not fit data of shape {_shape(data)}")
    out_shape = out_shape_of(n, channels, out_h, out_w, layout)
    _check(blocked or layout == "NCHW", NAME, "an NCHW16c output needs the NCHW16c weight")
    float_bias = floats and str(bias.dtype) == "float32"
    _check(not float_bias or epilogue.out_dtype != "int32", NAME, "an int32 output needs an int32 bias")
    _check_epilogue(NAME, bias, multiplier, residual, epilogue, out_shape, table,
                    "float32" if float_bias else "int32")
    top, left = pad[0], pad[1]
    rows, cols = h + pad[0] + pad[2], w + pad[1] + pad[3]
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    if not blocked:
        padded = _padded(data, [n, c, rows, cols],
                         lambda b, ch, y, x: (tirx.all(y >= top, y < h + top, x >= left, x < w + left),
                                              (b, ch, y - top, x - left)), input_zero_point, PAD)
        acc = te.compute(
            (n, c, out_h, out_w),
            lambda b, ch, y, x: te.sum(padded[b, ch, y * sh + ry * dh, x * sw + rx * dw].astype("int32")
                                       * weight[ch, 0, ry, rx].astype("int32"), axis=[ry, rx]),
            name=ANCHOR)
        return _epilogue_stage(lambda *i: acc[i], bias, multiplier, residual, epilogue, out_shape, table)

    def pad_index(b, cb, y, x, ci):
        valid = tirx.all(y >= top, y < h + top, x >= left, x < w + left)
        return valid, (b, cb, y - top, x - left, ci)

    blocks, attrs = int(wshape[0]), None
    if taps:  # every group reads 4 columns: the last group's may lie past the padded row
        cols = max(cols, (out_w - 1) * sw + int(wshape[2]) * TAPS)
        attrs = {BORDER: [top, left, h, w]}
        rg, rk = te.reduce_axis((0, int(wshape[2])), "rg"), te.reduce_axis((0, TAPS), "rk")
        axes, column = [ry, rg, rk], rg * TAPS + rk
        if pairs:
            tap_weight = lambda cb, ci: weight[cb, ry, rg, rk // 2, ci, rk % 2]  # noqa: E731
        else:
            tap_weight = lambda cb, ci: weight[cb, ry, rg, ci, rk]  # noqa: E731
    else:
        axes, column, tap_weight = [ry, rx], rx * dw, lambda cb, ci: weight[cb, ry, rx, ci]
    sum_type, anchor_attrs = "int32", None
    if floats:  # the codes less the zero point, the padding 0: a kernel row on padding rows only adds nothing
        sum_type, attrs = "float32", {BORDER: [top, left, h, w]}
        outside = sum(not top <= y * sh + r * dh < top + h for y in range(out_h) for r in range(kh))
        anchor_attrs = {PADDING_ROWS: outside / (out_h * kh)}  # the share of row steps a backend may skip
    padded = _padded(data, [n, blocks, rows, cols, BLOCK_O], pad_index, input_zero_point, PAD, attrs,
                     dtype=sum_type if floats else None, centred=floats)
    acc = te.compute(
        (n, blocks, out_h, out_w, BLOCK_O),
        lambda b, cb, y, x, ci: te.sum(padded[b, cb, y * sh + ry * dh, x * sw + column, ci].astype(sum_type)
                                       * tap_weight(cb, ci).astype(sum_type), axis=axes),
        name=ANCHOR, attrs=anchor_attrs)
    if floats and not float_bias:
        acc = te.compute(acc.shape, lambda *i: acc[i].astype("int32"), name=FLOAT_SUMS)
    if layout == "NCHW":
        return _epilogue_stage(lambda b, ch, y, x: acc[b, ch // BLOCK_O, y, x, ch % BLOCK_O], bias, multiplier,
                               residual, epilogue, out_shape, table)
    return _epilogue_stage(lambda *i: acc[i], bias, multiplier, residual, epilogue, out_shape, table)


def depthwise_conv2d_kernel(data, weight, bias, multiplier, residual=None, *, channels: int,
                            input_zero_point: int = 0, epilogue: Epilogue = Epilogue(), **conv) -> te.Tensor:
    """``families.Int8.compute``'s signature over :func:`depthwise_conv2d_compute`."""
    return depthwise_conv2d_compute(data, weight, bias, multiplier, residual, input_zero_point=input_zero_point,
                                    epilogue=epilogue, channels=channels, **conv)
