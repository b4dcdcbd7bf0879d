"""Squeeze-and-excitation on uint8 codes: the spatial mean and the channel gate of an INT8 network, each one
TE kernel that reads and writes codes (NCHW or NCHW16c: the layout is kept).

- :func:`mean_codes`: ``round(clip((sum(q) - z_x H W) * (s_x / s_m / (H W)) + z_m, 0, 255))`` per channel,
  the sum exact in int32. The float path is ``quantize(mean(dequantize(q)))``: the same up to float rounding
  (and halves, which round up here: :func:`_to_code`).
- :func:`gate_codes`: ``round(clip((q - z_x) * (g[c] * (s_x / s_p)) + z_p, 0, 255))``, the codes of
  ``x * gate`` in the product's parameters from the codes of ``x`` and the float32 ``[N, C, 1, 1]`` gate.

Written as kernels of their own because TVM's fusion leaves a cast (or a dequantize) before a mean a kernel of
its own, and so that the codes keep their blocked layout: the INT8 kernels around them read NCHW16c codes in
place. Their numpy twins (``*_ref``) compute the same float32 operations in the same order.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx

from .. import families

MEAN_STAGES = ("codes_sum", families.CODES_MEAN.name)
GATE_STAGE, GATE_LANES = families.CODES_GATE.name, "gate_lanes"


def _to_code(value, zero_point: int):
    """The uint8 code of ``value + zero_point``: clipped to [0, 255], rounded half up (``+ 0.5``, then the
    conversion's truncation), through int32 (a float -> u8 vector conversion is scalarized). Clipped before
    the zero point is added, so no multiply feeds an add an FMA could fuse (the numpy twin rounds twice).
    Not ``nearbyint``: with it TVM loaded each uint8 vector a byte at a time (6.6 us for a 6 x 5 x 80 x 16
    gate); the two differ only on exact halves."""
    value = tirx.Min(tirx.Max(value, tirx.const(float(-zero_point), "float32")),
                     tirx.const(float(255 - zero_point), "float32"))
    return (value + tirx.const(zero_point + 0.5, "float32")).astype("int32").astype("uint8")


def mean_codes(data, zero_point: int, scale: float, out_zero_point: int) -> te.Tensor:
    """The mean over axes 2 and 3 of ``data`` (uint8 ``[N, C, H, W]`` or ``[N, C/16, H, W, 16]``), kept as
    size-1 axes, requantized: ``scale`` is the input's scale over the mean's."""
    shape = [int(d) for d in data.shape]
    h, w = shape[2], shape[3]
    ry, rx = te.reduce_axis((0, h), "ry"), te.reduce_axis((0, w), "rx")
    out_shape = shape[:2] + [1, 1] + shape[4:]
    total = te.compute(out_shape, lambda b, c, y, x, *lane: te.sum(
        data[(b, c, y + ry, x + rx) + tuple(lane)].astype("int32"), axis=[ry, rx]), name=MEAN_STAGES[0])
    factor = tirx.const(float(np.float32(scale / (h * w))), "float32")  # one multiply: nothing to contract
    shift = tirx.const(zero_point * h * w, "int32")
    return te.compute(out_shape, lambda *i: _to_code((total[i] - shift).astype("float32") * factor, out_zero_point),
                      name=MEAN_STAGES[1])


def gate_codes(data, gate, zero_point: int, scale: float, out_zero_point: int) -> te.Tensor:
    """The codes of ``x * gate`` from the codes of ``x`` (``data``, uint8 NCHW or NCHW16c) and ``gate``
    (float32 ``[N, C, 1, 1]``, C the real channels: an NCHW16c block's padding channels read the last
    channel's gate, and are never read themselves); ``scale`` is ``x``'s scale over the product's."""
    channels = int(gate.shape[1])
    factor = tirx.const(float(np.float32(scale)), "float32")
    zx = tirx.const(float(zero_point), "float32")
    if len(data.shape) == 5:  # the gates per block and lane first, so a pixel's 16 gates are one vector
        n, blocks, _, _, block = (int(d) for d in data.shape)
        lanes = te.compute((n, blocks, block), lambda b, c, lane: gate[
            b, tirx.min(c * block + lane, channels - 1), 0, 0] * factor, name=GATE_LANES)
        return te.compute(data.shape, lambda b, c, y, x, lane: _to_code(
            (data[b, c, y, x, lane].astype("float32") - zx) * lanes[b, c, lane], out_zero_point), name=GATE_STAGE)
    return te.compute(data.shape, lambda b, c, y, x: _to_code(
        (data[b, c, y, x].astype("float32") - zx) * (gate[b, c, 0, 0] * factor), out_zero_point), name=GATE_STAGE)


def mean_codes_ref(codes: np.ndarray, zero_point: int, scale: float, out_zero_point: int) -> np.ndarray:
    """:func:`mean_codes` in numpy."""
    codes = np.asarray(codes)
    pixels = codes.shape[2] * codes.shape[3]
    total = codes.astype(np.int32).sum(axis=(2, 3), keepdims=True) - np.int32(zero_point * pixels)
    return _to_code_ref(total.astype(np.float32) * np.float32(scale / pixels), out_zero_point)


def gate_codes_ref(codes: np.ndarray, gate: np.ndarray, zero_point: int, scale: float,
                   out_zero_point: int) -> np.ndarray:
    """:func:`gate_codes` on NCHW codes in numpy."""
    factor = np.asarray(gate, np.float32) * np.float32(scale)
    return _to_code_ref((np.asarray(codes).astype(np.float32) - np.float32(zero_point)) * factor, out_zero_point)


def _to_code_ref(value: np.ndarray, zero_point: int) -> np.ndarray:
    clipped = np.clip(value.astype(np.float32), np.float32(-zero_point), np.float32(255 - zero_point))
    return (clipped + np.float32(zero_point + 0.5)).astype(np.int32).astype(np.uint8)


def _kernel(tensors: list, kernel: str) -> tvm.tirx.PrimFunc:
    """The PrimFunc over ``tensors`` (output last), marked as the registry's fixed kernel ``kernel``
    (``families.CODES_GATE`` / ``CODES_MEAN``: the backend's rule schedules it) and opaque to fusion."""
    func = te.create_prim_func(tensors).without_attr("global_symbol")
    return func.with_attrs({"tvmfuse.family": kernel, "op_pattern": 8})  # 8: kOpaque


def mean_kernel(shape, zero_point: int, scale: float, out_zero_point: int) -> tvm.tirx.PrimFunc:
    """:func:`mean_codes` over uint8 ``shape``: ``(data, out)``."""
    data = te.placeholder(tuple(shape), "uint8", name="data")
    return _kernel([data, mean_codes(data, zero_point, scale, out_zero_point)], families.CODES_MEAN.name)


def gate_kernel(shape, channels: int, zero_point: int, scale: float, out_zero_point: int) -> tvm.tirx.PrimFunc:
    """:func:`gate_codes` over uint8 ``shape`` and a ``[N, channels, 1, 1]`` gate: ``(data, gate, out)``."""
    data = te.placeholder(tuple(shape), "uint8", name="data")
    gate = te.placeholder((int(shape[0]), channels, 1, 1), "float32", name="gate")
    return _kernel([data, gate, gate_codes(data, gate, zero_point, scale, out_zero_point)], GATE_STAGE)
