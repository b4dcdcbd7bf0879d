"""TE compute of the INT8 conv2d for AMX tiles (``tdpbusd``), with the requantize epilogue.

The conventions are :mod:`tvmfuse.schedules.computes.int8`'s (uint8 codes in, int8 weights, the input zero
point folded into the int32 bias, spatial padding filled with it); only the layouts differ, so that every
operand of a tile instruction is a strided run of 64-byte rows:

- the input is repacked ``[N, ceil(C/64), H', W', 16, 4]`` (``data_pack``, padded with the zero point; the
  channels past C too): a tile row is one pixel's 64 channels, and the pixels of an output row are rows
  ``stride`` pixels apart;
- the weight is ``[ceil(O/16), ceil(C/64), kh, kw, 16, 16, 4]`` (:func:`pack_weight`): per output block,
  channel chunk and tap one 1 KB tile, row ``k`` holding input channels ``4k..4k+3`` of the 16 outputs
  (``tdpbusd``'s second operand, the VNNI dword layout), the padded channels' weights zero.

The reduction runs over (chunk, ry, rx, 16, 4); the x86 rule (``x86/int8_amx.py``) hands all of it to one
tile kernel per output tile.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx

from .. import families
from .int8 import (BLOCK_O, Epilogue, _check, _check_data, _check_epilogue, _epilogue_stage, _geometry, _padded,
                   _shape, conv2d_kernel as _vector_kernel, out_shape_of, read_channel)

NAME = "INT8 conv2d (AMX)"
CHUNK = 64  # input channels per tile row: 64 bytes
ANCHOR, PAD = families.CONV2D.int8.anchor_block, families.CONV2D.int8.pad_block


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """``[O, C, kh, kw]`` int8 -> ``[ceil(O/16), ceil(C/64), kh, kw, 16, 16, 4]``: input channel
    ``64 c + 4 k + q`` of output ``16 b + i`` at ``[b, c, y, x, k, i, q]``, padding zero."""
    weight = np.asarray(weight)
    if weight.dtype != np.int8 or weight.ndim != 4:
        raise ValueError(f"conv2d weight must be int8 [O, C, kh, kw], got {weight.shape} {weight.dtype}")
    o, c, kh, kw = weight.shape
    ob, cb = -(-o // BLOCK_O), -(-c // CHUNK)
    full = np.zeros((ob * BLOCK_O, cb * CHUNK, kh, kw), np.int8)
    full[:o, :c] = weight
    # [ob, i, cb, k, q, y, x] -> [ob, cb, y, x, k, i, q]
    blocks = full.reshape(ob, BLOCK_O, cb, CHUNK // 4, 4, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 5, 6, 3, 1, 4))


def unpack_weight(packed: np.ndarray, out_channels: int, in_channels: int) -> np.ndarray:
    """Inverse of :func:`pack_weight`."""
    ob, cb, kh, kw, k, i, q = packed.shape
    full = packed.transpose(0, 5, 1, 4, 6, 2, 3).reshape(ob * i, cb * k * q, kh, kw)
    return np.ascontiguousarray(full[:out_channels, :in_channels])


# The least share of a tile row's 64 channels a conv must fill to run on tiles on an AMX target; below it the conv
# keeps VNNI's 16x4 step. A tile row always sums 64 channels (padding included), and the epilogue and the tile
# loads do not shrink with the channels. Measured on a Sapphire Rapids (one thread, kernels timed in alternation):
# 24 -> 144 channels at 56 x 56 (a 0.375 share) ran 1.4x VNNI's time, 32 -> 192 at 28 x 28 (0.5) 1.2x, while 64 and
# 96 channels (1 and 0.75) ran 0.88x and 0.87x.
MIN_SHARE = 0.6


def takes_tiles(in_channels: int) -> bool:
    """Whether a conv reading ``in_channels`` runs on tiles on an AMX target (:data:`MIN_SHARE`)."""
    return in_channels >= MIN_SHARE * CHUNK * -(-in_channels // CHUNK)


def is_amx_weight(weight) -> bool:
    """Whether a weight tensor has :func:`pack_weight`'s layout (rank 7, int8)."""
    return len(weight.shape) == 7 and str(weight.dtype) == "int8"


def conv2d_compute(data, weight, bias, multiplier, residual=None, *, out_channels: int, strides=1, padding=0,
                   dilation=1, input_zero_point=0, epilogue: Epilogue = Epilogue(), out_layout: str = "NCHW",
                   table=None) -> te.Tensor:
    """INT8 conv2d on :func:`pack_weight`'s weight; the arguments as in
    :func:`tvmfuse.schedules.computes.int8.conv2d_compute` (uint8 data, NCHW or NCHW16c)."""
    _check_data(NAME, data)
    wshape = _shape(weight)
    _check(is_amx_weight(weight) and wshape[4:] == [CHUNK // 4, BLOCK_O, 4], NAME,
           f"weight must be int8 [O/16, C/64, kh, kw, 16, 16, 4], got {wshape} {weight.dtype}")
    o_blocks, chunks, kh, kw = wshape[:4]
    (n, c, h, w), (sh, sw), (dh, dw), pad, (out_h, out_w) = _geometry(NAME, data, kh, kw, strides, padding, dilation)
    _check(chunks == -(-c // CHUNK), NAME, f"weight has {chunks} chunks of 64 input channels for {c} channels")
    _check(o_blocks == -(-out_channels // BLOCK_O), NAME,
           f"weight has {o_blocks} blocks of 16 output channels for out_channels={out_channels}")
    out_shape = out_shape_of(n, out_channels, out_h, out_w, out_layout)
    _check_epilogue(NAME, bias, multiplier, residual, epilogue, out_shape, table)
    top, left = pad[0], pad[1]

    def pack_index(b, cb, y, x, k, q):
        ch = cb * CHUNK + k * 4 + q
        valid = tirx.all(ch < c, y >= top, y < h + top, x >= left, x < w + left)
        return valid, read_channel(data, b, ch, y - top, x - left)

    packed = _padded(data, [n, chunks, h + pad[0] + pad[2], w + pad[1] + pad[3], CHUNK // 4, 4], pack_index,
                     input_zero_point, PAD)
    rc, ry, rx = te.reduce_axis((0, chunks), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    rk, rq = te.reduce_axis((0, CHUNK // 4), "rk"), te.reduce_axis((0, 4), "rq")
    acc = te.compute(
        (n, o_blocks, out_h, out_w, BLOCK_O),
        lambda b, ob, y, x, oi: te.sum(
            packed[b, rc, y * sh + ry * dh, x * sw + rx * dw, rk, rq].astype("int32")
            * weight[ob, rc, ry, rx, rk, oi, rq].astype("int32"), axis=[rc, ry, rx, rk, rq]),
        name=ANCHOR)
    if out_layout != "NCHW":
        return _epilogue_stage(lambda *i: acc[i], bias, multiplier, residual, epilogue, out_shape, table)
    return _epilogue_stage(lambda b, o, y, x: acc[b, o // BLOCK_O, y, x, o % BLOCK_O], bias, multiplier,
                           residual, epilogue, out_shape, table)


def conv2d_kernel(data, weight, bias, multiplier, residual=None, *, channels: int, input_zero_point=0,
                  epilogue: Epilogue = Epilogue(), **conv) -> te.Tensor:
    """The conv2d family's INT8 compute (``families.Int8.compute``'s signature): the tile form for a weight
    packed by :func:`pack_weight`, the Winograd form with ``winograd=True`` (:mod:`.int8_winograd`),
    :func:`.int8.conv2d_compute` for any other."""
    if conv.pop("winograd", False):
        from . import int8_winograd

        return int8_winograd.conv2d_kernel(data, weight, bias, multiplier, residual, channels=channels,
                                           input_zero_point=input_zero_point, epilogue=epilogue, **conv)
    if not is_amx_weight(weight):
        return _vector_kernel(data, weight, bias, multiplier, residual, channels=channels,
                              input_zero_point=input_zero_point, epilogue=epilogue, **conv)
    return conv2d_compute(data, weight, bias, multiplier, residual, out_channels=channels,
                          input_zero_point=input_zero_point, epilogue=epilogue, **conv)
