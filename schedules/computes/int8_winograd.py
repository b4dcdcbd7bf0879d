"""INT8 conv2d as Winograd F(2x2, 3x3) in integers: NCHW16c uint8 codes in, the INT8 epilogue out.

For CPUs without VNNI, where codes beyond 7 bits (a quantized model's own weights, ``weight_bits=8``) make the
direct kernel add int16 pairs with ``vpmaddwd``: here the products are the same int16 pair step (the x86
rule's ``madd_pairs``), but 16 of them per 2x2 outputs and input channel instead of 36 (1.4-1.8x faster than
the direct pair step on a Zen 3, ``docs/int8.md``).

Exact, with every matrix scaled to integers (Lavin & Gray's F(2x2, 3x3), points 0, 1, -1 and infinity)::

    4 * conv = A^T [(G' g G'^T) * (B^T d B)] A      G' = 2 G

- ``d``: a 4x4 tile of the codes as they are (the zero point's share is in the folded bias, as in every INT8
  kernel; padding is ``za``): ``V = B^T d B`` sums four codes with signs, within [-510, 510] (int16);
- ``U = G' g G'^T``, at compile time: at most 9 x 128 = 1152 in magnitude (int16), laid out as the pair
  step's ``[2, 16, 2]`` blocks: ``[4, 4, O/16, I'/4, 2, 16, 2]``, ``I'`` the input channels padded to whole
  blocks of 16 (the NCHW16c data's padded channels then meet zero weights);
- ``M = U V`` per position and ``Y = A^T M A`` in int32, then ``Y >> 2``: the direct sum, exactly, wherever
  no partial sum leaves int32 (:func:`fits`, checked on the codes at compile time; a layer whose codes could
  overflow keeps the direct kernel).

Stage names are :mod:`.winograd`'s (the schedules of its transforms apply to both), the padded input
``pad_temp``.
"""

from __future__ import annotations

import numpy as np
from tvm import te, topi

from . import winograd
from .int8 import (BLOCK_I, BLOCK_O, Epilogue, _check, _check_epilogue, _epilogue_stage, _pair, _padding, _shape,
                   out_shape_of)

NAME = "INT8 Winograd conv2d"
TILE, ALPHA = 2, 4
B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.int64)
G_2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]], np.int64)  # 2 G: integers
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.int64)
SHIFT = 2  # Y = 4 conv: (2 G) twice
CODE_SPAN = 255  # the largest difference of two uint8 codes (V sums two such differences)
INT32_MAX = 2**31 - 1
MIN_CHANNELS = 16  # the fewest input and output channels taken (as FP32's Winograd)


def transformed(weight: np.ndarray) -> np.ndarray:
    """OIHW 3x3 int8 -> ``U = G' g G'^T`` per (o, i), int64 ``[4, 4, O, I]``."""
    w = np.asarray(weight).astype(np.int64)
    return np.einsum("ak,oikl,bl->aboi", G_2, w, G_2)


def fits(weight: np.ndarray) -> bool:
    """Whether every partial sum of the kernel stays within int32 for any codes: per output, ``M``'s sums over
    input channels are at most ``2 x 255 x sum |U|`` in magnitude, and each output of ``A^T M A`` sums at most
    four of them per row and column with unit signs (``Y`` needs 4 x 9 x 255 x 127 = 1.2M per input channel,
    so any layer up to ~1800 input channels whose weights are not all extreme)."""
    u = np.abs(transformed(weight)).sum(axis=3)  # [4, 4, O]: bound on |M| / (2 * 255)
    a = np.abs(A_T)
    worst = np.einsum("ia,jb,abo->ijo", a, a, u).max(initial=0)  # bound on |Y| / (2 * 255)
    return bool(2 * CODE_SPAN * int(worst) <= INT32_MAX)


def pays(kernel, strides, dilation, padding, in_channels: int, out_channels: int) -> bool:
    """Whether the conv is one this kernel computes and worth it: 3x3, stride 1, no dilation, padding 1,
    at least :data:`MIN_CHANNELS` input and output channels."""
    return (list(kernel) == [3, 3] and list(strides) == [1, 1] and list(dilation) == [1, 1]
            and list(padding) == [1, 1, 1, 1] and min(in_channels, out_channels) >= MIN_CHANNELS)


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """OIHW 3x3 int8 (-128 included) -> int16 ``[4, 4, ceil(O/16), ceil(I/16) * 4, 2, 16, 2]``: ``U`` in the pair
    step's blocks, input channels ``2p`` and ``2p + 1`` of 16 outputs side by side."""
    weight = np.asarray(weight)
    if weight.dtype != np.int8 or weight.ndim != 4 or weight.shape[2:] != (3, 3):
        raise ValueError(f"{NAME}: weight must be int8 [O, I, 3, 3], got {weight.shape} {weight.dtype}")
    o, i = weight.shape[:2]
    ob, cb = -(-o // BLOCK_O), -(-i // BLOCK_O) * BLOCK_O // BLOCK_I
    u = np.zeros((ALPHA, ALPHA, ob * BLOCK_O, cb * BLOCK_I), np.int16)
    u[:, :, :o, :i] = transformed(weight)
    blocks = u.reshape(ALPHA, ALPHA, ob, BLOCK_O, cb, 2, 2)  # [e, u, ob, oi, cb, pair, k]
    return np.ascontiguousarray(blocks.transpose(0, 1, 2, 4, 5, 3, 6))


def _transform(matrix: np.ndarray, e, value):
    """``sum_r matrix^T[r, e] value(r)`` written out as sums and differences (:func:`.winograd.transform`)."""
    return winograd.transform(matrix.T.astype(np.float64), e, value)


def conv2d_compute(data, weight, bias, multiplier, residual=None, *, out_channels: int, input_zero_point: int = 0,
                   epilogue: Epilogue = Epilogue(), out_layout: str = "NCHW16c", table=None) -> te.Tensor:
    """The Winograd form of :func:`.int8.conv2d_compute` (3x3, stride 1, padding 1): ``data`` NCHW16c uint8,
    ``weight`` from :func:`pack_weight`, the output NCHW16c (bias and multiplier padded to whole blocks) in
    ``epilogue.out_dtype``; the rest as there."""
    dshape, wshape = _shape(data), _shape(weight)
    _check(str(data.dtype) == "uint8" and len(dshape) == 5 and dshape[4] == BLOCK_O, NAME,
           f"data must be uint8 NCHW16c, got {dshape} {data.dtype}")
    n, in_blocks, h, w, _ = dshape
    o_blocks = -(-out_channels // BLOCK_O)
    _check(str(weight.dtype) == "int16" and wshape == [ALPHA, ALPHA, o_blocks, in_blocks * 4, 2, BLOCK_O, 2], NAME,
           f"weight must be int16 [4, 4, {o_blocks}, {in_blocks * 4}, 2, 16, 2] (pack_weight), got {wshape} "
           f"{weight.dtype}")
    _check(out_layout == "NCHW16c" and isinstance(input_zero_point, int), NAME,
           f"takes an NCHW16c output and a zero point known at compile time, got {out_layout}, {input_zero_point!r}")
    out_shape = out_shape_of(n, out_channels, h, w, out_layout)
    _check_epilogue(NAME, bias, multiplier, residual, epilogue, out_shape, table)
    tiles_h, tiles_w = -(-h // TILE), -(-w // TILE)
    per_image = tiles_h * tiles_w
    padded = topi.nn.pad(data, [0, 0, 1, 1, 0], [0, 0, tiles_h * TILE + 1 - h, tiles_w * TILE + 1 - w, 0],
                         pad_value=input_zero_point, name="pad_temp")

    def tile_code(p, ry, rx, cb, c):
        image, t = p // per_image, p % per_image
        return padded[image, cb, (t // tiles_w) * TILE + ry, (t % tiles_w) * TILE + rx, c].astype("int16")

    shape = (ALPHA, ALPHA, in_blocks, n * per_image, BLOCK_O)
    rows = te.compute(shape, lambda e, rb, cb, p, c: _transform(B_T, e, lambda ra: tile_code(p, ra, rb, cb, c)),
                      name=winograd.INPUT_ROWS)
    v = te.compute(shape, lambda e, u, cb, p, c: _transform(B_T, u, lambda rb: rows[e, rb, cb, p, c]),
                   name=winograd.INPUT)
    rcb = te.reduce_axis((0, in_blocks * 4), "rcb")
    rk = te.reduce_axis((0, BLOCK_I), "rk")
    m = te.compute((ALPHA, ALPHA, o_blocks, n * per_image, BLOCK_O), lambda e, u, ob, p, oi: te.sum(
        v[e, u, rcb // 4, p, rcb % 4 * BLOCK_I + rk].astype("int32")
        * weight[e, u, ob, rcb, rk // 2, oi, rk % 2].astype("int32"), axis=[rcb, rk]), name=winograd.PRODUCT)
    cols = te.compute((n, o_blocks, tiles_h * TILE, tiles_w, ALPHA, BLOCK_O), lambda i, ob, y, tx, sb, o: _transform(
        A_T, y % TILE, lambda sa: m[sa, sb, ob, i * per_image + (y // TILE) * tiles_w + tx, o]),
        name=winograd.OUTPUT_ROWS)
    acc = te.compute((n, o_blocks, h, w, BLOCK_O), lambda i, ob, y, x, o: _transform(
        A_T, x % TILE, lambda sb: cols[i, ob, y, x // TILE, sb, o]) >> SHIFT, name=winograd.ANCHOR)
    return _epilogue_stage(lambda *i: acc[i], bias, multiplier, residual, epilogue, out_shape, table)


def conv2d_kernel(data, weight, bias, multiplier, residual=None, *, channels: int, input_zero_point: int = 0,
                  epilogue: Epilogue = Epilogue(), strides=1, padding=0, dilation=1, out_layout: str = "NCHW16c",
                  table=None) -> te.Tensor:
    """:func:`conv2d_compute` with the conv family's INT8 signature; the geometry must be the one it computes."""
    _check(_pair(strides) == (1, 1) and _pair(dilation) == (1, 1) and _padding(padding) == (1, 1, 1, 1), NAME,
           f"computes 3x3 convs of stride 1, dilation 1, padding 1, got strides {strides}, dilation {dilation}, "
           f"padding {padding}")
    return conv2d_compute(data, weight, bias, multiplier, residual, out_channels=channels,
                          input_zero_point=input_zero_point, epilogue=epilogue, out_layout=out_layout, table=table)
