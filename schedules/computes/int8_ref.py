"""Numpy side of the INT8 kernels: weight packing, zero-point folding, multipliers and reference results.

The conventions are those of :mod:`tvmfuse.schedules.computes.int8`. The references compute the *mathematical*
definition, ``acc[o] = sum((x - za) * w[o]) + bias[o]`` over zero-padded ``x - za``, with the original bias;
the kernels compute ``sum(x * w[o]) + fold_zero_point(bias, w, za)[o]`` over ``za``-padded codes. The two
agree exactly, which the tests check. The epilogue (:func:`requantize`) repeats the kernel's float
arithmetic operation by operation (float32; a residual's add is one fused multiply-add, :func:`fma32`), so
integer outputs are bit-exact.
"""

from __future__ import annotations

import numpy as np

from .. import families
from .int8 import BLOCK_I, BLOCK_O, Epilogue, Int8KernelError, _pair, _padding
from .int8_epilogue import table_index

WEIGHT_RANGE = (-127, 127)


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def _check_weight(weight: np.ndarray, ndim: int, what: str) -> np.ndarray:
    weight = np.asarray(weight)
    if weight.dtype != np.int8 or weight.ndim != ndim:
        raise Int8KernelError(f"{what} weight must be a {ndim}-D int8 array, got {weight.shape} {weight.dtype}")
    if weight.size and weight.min() < WEIGHT_RANGE[0]:
        raise Int8KernelError(f"{what} weight holds -128; symmetric INT8 weights are in [-127, 127]")
    return weight


def pack_conv2d_weight(weight: np.ndarray) -> np.ndarray:
    """OIHW int8 -> ``[ceil(O/16), ceil(I/4), kh, kw, 16, 4]``, padding O and I with zero weights."""
    weight = _check_weight(weight, 4, families.CONV2D.name)
    o, i, kh, kw = weight.shape
    full = np.zeros((_ceil_to(o, BLOCK_O), _ceil_to(i, BLOCK_I), kh, kw), np.int8)
    full[:o, :i] = weight
    blocks = full.reshape(full.shape[0] // BLOCK_O, BLOCK_O, full.shape[1] // BLOCK_I, BLOCK_I, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 2, 4, 5, 1, 3))


def unpack_conv2d_weight(packed: np.ndarray, out_channels: int, in_channels: int) -> np.ndarray:
    """Inverse of :func:`pack_conv2d_weight` (drops the padding)."""
    ob, ib, kh, kw, bo, bi = packed.shape
    full = packed.transpose(0, 4, 1, 5, 2, 3).reshape(ob * bo, ib * bi, kh, kw)
    return np.ascontiguousarray(full[:out_channels, :in_channels])


def pack_dense_weight(weight: np.ndarray) -> np.ndarray:
    """``[N, K]`` int8 (output features first) -> ``[ceil(N/16), ceil(K/4), 16, 4]``, zero padded.

    ONNX MatMul's ``[K, N]`` weight is ``weight.T`` here.
    """
    weight = _check_weight(weight, 2, families.DENSE.name)
    n, k = weight.shape
    full = np.zeros((_ceil_to(n, BLOCK_O), _ceil_to(k, BLOCK_I)), np.int8)
    full[:n, :k] = weight
    blocks = full.reshape(full.shape[0] // BLOCK_O, BLOCK_O, full.shape[1] // BLOCK_I, BLOCK_I)
    return np.ascontiguousarray(blocks.transpose(0, 2, 1, 3))


def unpack_dense_weight(packed: np.ndarray, out_features: int, in_features: int) -> np.ndarray:
    """Inverse of :func:`pack_dense_weight`."""
    nb, kb, bo, bi = packed.shape
    return np.ascontiguousarray(packed.transpose(0, 2, 1, 3).reshape(nb * bo, kb * bi)[:out_features, :in_features])


def to_pairs(packed: np.ndarray) -> np.ndarray:
    """A conv2d or dense weight packed in 16x4 int8 blocks -> the same blocks as int16 pairs ``[2, 16, 2]``
    (input channels 2p and 2p+1 of the 16 outputs side by side), the layout of the pair step of CPUs without
    VNNI (one 16-bit multiply-add instruction per pair of input channels)."""
    packed = np.asarray(packed)
    if packed.dtype != np.int8 or packed.ndim < 3 or packed.shape[-2:] != (BLOCK_O, BLOCK_I):
        raise Int8KernelError(f"to_pairs takes int8 weights packed in [..., {BLOCK_O}, {BLOCK_I}] blocks, "
                              f"got {packed.shape} {packed.dtype}")
    lead = packed.shape[:-2]
    pairs = packed.reshape(*lead, BLOCK_O, 2, 2).swapaxes(-3, -2)
    return np.ascontiguousarray(pairs.astype(np.int16))


# The largest positive (or negative) sum of a pair of weight codes whose products with any two uint8 codes
# stay within int16: 255 * 128 = 32640 <= 32767.
PAIR_SUM_LIMIT = 128
# The largest weight code that keeps every pair within PAIR_SUM_LIMIT (7-bit weights, onnxruntime's
# ``reduce_range``).
PAIR_SAFE_CODE = PAIR_SUM_LIMIT // 2


def pairs_fit_int16(packed: np.ndarray) -> bool:
    """Whether a weight in 16x4 int8 blocks (last axis the 4 inputs of a step) has, in every pair (0, 1) and
    (2, 3), positive codes summing to at most :data:`PAIR_SUM_LIMIT` and negative ones to at least minus it:
    then a step may add two u8 x s8 products in int16 without saturating (x86 ``vpmaddubsw``)."""
    w = np.asarray(packed).astype(np.int32).reshape(-1, 2, 2)
    return bool((np.maximum(w, 0).sum(-1) <= PAIR_SUM_LIMIT).all()
                and (np.minimum(w, 0).sum(-1) >= -PAIR_SUM_LIMIT).all())


def from_pairs(pairs: np.ndarray) -> np.ndarray:
    """Inverse of :func:`to_pairs`."""
    pairs = np.asarray(pairs)
    return np.ascontiguousarray(pairs.swapaxes(-3, -2).reshape(*pairs.shape[:-3], BLOCK_O, BLOCK_I).astype(np.int8))


def fold_zero_point(bias: np.ndarray | None, weight: np.ndarray, input_zero_point: int) -> np.ndarray:
    """The int32 bias the kernels take: ``bias[o] - za * sum(weight[o])``.

    ``weight`` is unpacked, output channel first (OIHW, depthwise ``[C, 1, kh, kw]`` or dense ``[N, K]``);
    ``bias`` is the int32 bias of the quantized model (``round(b / (s_x * s_w[o]))``), None for none.
    """
    weight = np.asarray(weight)
    sums = weight.reshape(weight.shape[0], -1).astype(np.int64).sum(axis=1)
    base = np.zeros(weight.shape[0], np.int64) if bias is None else np.asarray(bias, np.int64)
    if base.shape != sums.shape:
        raise Int8KernelError(f"bias has shape {base.shape}, the weight {weight.shape} has {sums.size} outputs")
    folded = base - int(input_zero_point) * sums
    if folded.min(initial=0) < np.iinfo(np.int32).min or folded.max(initial=0) > np.iinfo(np.int32).max:
        raise Int8KernelError("folded bias overflows int32")
    return folded.astype(np.int32)


def requant_multiplier(input_scale: float, weight_scales, output_scale: float | None = None) -> np.ndarray:
    """``M[o] = s_x * s_w[o] / s_y`` as float32 (``s_x * s_w[o]`` for a float32 output: ``output_scale=None``)."""
    m = float(input_scale) * np.asarray(weight_scales, np.float64).reshape(-1)
    return (m if output_scale is None else m / float(output_scale)).astype(np.float32)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``a * b + c`` on float32 arrays rounded once, as ``llvm.fma`` (numpy has no fused multiply-add).

    ``a * b`` is exact in float64 (24 + 24 bits); the float64 sum's rounding error comes from TwoSum, and
    where it is not zero the sum is rounded to odd (its last bit set, towards the error): rounding that to
    float32 is then the correctly rounded result (53 >= 2 * 24 + 2 bits).
    """
    a, b, c = (np.asarray(x, np.float32).astype(np.float64) for x in (a, b, c))
    p = a * b
    s = p + c
    v = s - p
    err = (p - (s - v)) + (c - v)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def requantize(acc: np.ndarray, multiplier: np.ndarray, epilogue: Epilogue, residual: np.ndarray | None = None,
               table: np.ndarray | None = None):
    """The kernels' epilogue on an int accumulator (bias included, channels on axis 1), in numpy; ``table``:
    the output codes of ``epilogue.table``."""
    shape = [1] * acc.ndim
    shape[1] = -1
    acc = np.asarray(acc).astype(np.int32)  # the kernel accumulates in int32
    if epilogue.out_dtype == "int32":
        return acc
    m = np.asarray(multiplier, np.float32).reshape(shape)
    rq = epilogue.requantized
    if rq is not None:
        lo, hi = rq.bounds()
        code = np.clip(np.rint(acc.astype(np.float32) * m) + np.float32(rq.zero_point), lo, hi)
        mine = (code - np.float32(rq.zero_point)).astype(np.float32) * np.float32(rq.scale)
        shift = np.asarray(residual).astype(np.int32) - epilogue.residual.zero_point
        other = shift.astype(np.float32) * np.float32(epilogue.residual.scale)
        value = (mine + other) / np.float32(rq.out_scale)
    elif epilogue.residual is None:
        value = acc.astype(np.float32) * m
    else:
        shift = np.asarray(residual).astype(np.int32) - epilogue.residual.zero_point
        value = fma32(acc.astype(np.float32), m, shift.astype(np.float32) * np.float32(epilogue.residual.scale))
    if epilogue.hardswish is not None:
        t = value.dtype.type
        lo, hi, shift, factor = epilogue.hardswish.constants(value.dtype.name)
        value = value * (np.minimum(np.maximum(value, t(lo)), t(hi)) + t(shift))
        offset = epilogue.hardswish.offset
        value = fma32(value, t(factor), t(offset)) if offset else value * t(factor)
    if epilogue.quantized:
        value = np.rint(value) + value.dtype.type(epilogue.zero_point)
    else:
        value = value.astype(np.float32)
    lo, hi = epilogue.bounds()
    if lo is not None:
        value = np.maximum(value, value.dtype.type(lo))
    if hi is not None:
        value = np.minimum(value, value.dtype.type(hi))
    if epilogue.table:
        return np.asarray(table)[table_index(value, epilogue.out_dtype)].astype(epilogue.out_dtype)
    return value.astype(epilogue.out_dtype)


def _windows(x: np.ndarray, kh: int, kw: int, strides, padding, dilation, input_zero_point: int) -> np.ndarray:
    """``x - za`` zero-padded, as windows ``[N, C, OH, OW, kh, kw]`` (int64)."""
    top, left, bottom, right = _padding(padding)
    (sh, sw), (dh, dw) = _pair(strides), _pair(dilation)
    shifted = np.asarray(x).astype(np.int64) - int(input_zero_point)
    xp = np.pad(shifted, ((0, 0), (0, 0), (top, bottom), (left, right)))
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (span_h, span_w), axis=(2, 3))
    return win[:, :, ::sh, ::sw, ::dh, ::dw]


def conv2d_ref(x, weight, bias, multiplier, residual=None, *, strides=1, padding=0, dilation=1,
               input_zero_point: int = 0, epilogue: Epilogue = Epilogue(), table=None) -> np.ndarray:
    """Reference INT8 conv2d: ``x`` NCHW uint8, ``weight`` OIHW int8 (unpacked), ``bias`` the original int32
    bias (None for none, zero point *not* folded)."""
    weight = np.asarray(weight)
    win = _windows(x, weight.shape[2], weight.shape[3], strides, padding, dilation, input_zero_point)
    acc = np.tensordot(win, weight.astype(np.int64), axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64).reshape(1, -1, 1, 1)
    return requantize(acc, multiplier, epilogue, residual, table)


def depthwise_conv2d_ref(x, weight, bias, multiplier, residual=None, *, strides=1, padding=0, dilation=1,
                         input_zero_point: int = 0, epilogue: Epilogue = Epilogue(), table=None) -> np.ndarray:
    """Reference INT8 depthwise conv2d: ``weight`` ``[C, 1, kh, kw]`` int8; otherwise as :func:`conv2d_ref`."""
    weight = np.asarray(weight)
    win = _windows(x, weight.shape[2], weight.shape[3], strides, padding, dilation, input_zero_point)
    acc = (win * weight[:, 0].astype(np.int64)[None, :, None, None]).sum(axis=(4, 5))
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64).reshape(1, -1, 1, 1)
    return requantize(acc, multiplier, epilogue, residual, table)


def dense_ref(x, weight, bias, multiplier, residual=None, *, input_zero_point: int = 0,
              epilogue: Epilogue = Epilogue(), table=None) -> np.ndarray:
    """Reference INT8 dense: ``x`` ``[M, K]`` uint8, ``weight`` ``[N, K]`` int8 (unpacked), original bias."""
    acc = (np.asarray(x).astype(np.int64) - int(input_zero_point)) @ np.asarray(weight).astype(np.int64).T
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64).reshape(1, -1)
    return requantize(acc, multiplier, epilogue, residual, table)
