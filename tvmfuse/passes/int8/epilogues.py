"""What an INT8 kernel does after its sums, from the partition and the tensors' quantization parameters: the
multipliers of a quantized model's own scales and the epilogue (requantize, clip, residual, hardswish, a
residual add after the codes)."""

from __future__ import annotations

import numpy as np

from tvmfuse.schedules.computes import int8

from ...quant.params import QuantParams
from .match import Int8Partition


def model_multiplier(input_scale: float, weight_scales, output_scale: float | None = None) -> np.ndarray:
    """``M[o] = s_x * s_w[o] / s_y`` for a quantized model's own scales, in float32 operations as ONNX
    Runtime's QLinearConv / QLinearMatMul compute it (``s_x * s_w[o]`` for a float32 output).

    It can be one ulp away from :func:`int8_ref.requant_multiplier` (float64, rounded once); that moves an
    output lying within ~1e-7 of a rounding tie by one code, so following the runtime the model was made
    for keeps the results equal to it.
    """
    m = np.float32(input_scale) * np.asarray(weight_scales, np.float32).reshape(-1)
    return (m if output_scale is None else m / np.float32(output_scale)).astype(np.float32)


def epilogue(part: Int8Partition, out: QuantParams | None, residual: QuantParams | None) -> int8.Epilogue:
    """The kernel's epilogue: requantize to ``out`` (None: float32 output), clip, residual, hardswish.

    With a hardswish the kernel works on real values (multiplier ``s_x * s_w``, residual scale ``s_r``) and
    the output's ``1 / s_y`` joins the hardswish's ``1 / divisor``; a scale ``a`` and shift ``b`` after it
    (``part.affine``) make the factor ``a / (divisor * s_y)`` and the offset ``b / s_y``."""
    s_y = float(out.scale) if out is not None else 1.0
    hardswish = None
    if part.hardswish is not None:
        shift, lo, hi, divisor = part.hardswish
        a, b = part.affine or (1.0, 0.0)
        hardswish = int8.HardSwish(shift, lo, hi, a / (divisor * s_y), b / s_y)
    res = None
    if residual is not None:  # R = s_r / s_y; with a hardswish or requantized codes, s_r (real units)
        res = int8.Residual(int(residual.zero_point),
                            float(residual.scale) / (1.0 if hardswish or part.added else s_y))
    lo, hi = part.clip if part.clip is not None else (None, None)
    if out is None:
        return int8.Epilogue("float32", 0, lo, hi, res, hardswish)
    if part.added is not None:
        codes = part.added.codes
        requantized = int8.Requantized(codes.dtype, int(codes.zero_point), float(codes.scale), s_y,
                                       *_clip_codes(part.clip, codes))
        return int8.Epilogue(out.dtype, int(out.zero_point), *_clip_codes(part.added.clip, out), res,
                             requantized=requantized)
    return int8.Epilogue(out.dtype, int(out.zero_point), *_clip_codes(part.clip, out), res, hardswish)


def _clip_codes(clip: tuple | None, params) -> tuple:
    """A clip of real values in the codes of ``params`` (None: no bound); Epilogue.bounds() intersects it with
    the dtype's range."""
    zero_point, scale = int(params.zero_point), float(params.scale)
    return tuple(None if v is None else float(zero_point + round(v / scale)) for v in (clip or (None, None)))
