"""A channel concat on uint8 codes: the inputs' codes, each requantized to the output's parameters, one kernel
that reads every input once and writes the output's codes (NCHW, or NCHW16c when every input's channels fill
whole blocks: then a block of the output is a block of one input).

    out = round_half_up(clip((q_i - z_i) * (s_i / s_o), -z_o, 255 - z_o)) + z_o     for the channels of input i

the rounding and clip of :func:`.int8_se._to_code`; an input already in the output's parameters is copied.
The float path is ``quantize(concat(dequantize(q_i)))``: the same up to float rounding and exact halves.
Detection models concatenate conv outputs and pools (PP-HGNet's stem, CSP blocks); on codes the producers write
uint8 instead of float32 and no dequantize, float concat and quantize run.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, tirx

from .. import families
from .int8_se import _kernel, _to_code, _to_code_ref

CONCAT_STAGE = families.CODES_CONCAT.name
STARTS = "tvmfuse.concat_starts"  # the stage's annotation: each input's first channel (block), and the total


def _same(zero_point: int, ratio: float, out_zero_point: int) -> bool:
    return zero_point == out_zero_point and np.float32(ratio) == np.float32(1.0)


def concat_codes(inputs: list, params: list, out_zero_point: int) -> te.Tensor:
    """The channel concat of ``inputs`` (uint8 ``[N, C_i, H, W]``, or ``[N, C_i/16, H, W, 16]``), input ``i``
    requantized by ``params[i] = (z_i, s_i / s_o)``."""
    shapes = [[int(d) for d in t.shape] for t in inputs]
    starts = np.cumsum([0] + [s[1] for s in shapes]).tolist()
    out_shape = [shapes[0][0], starts[-1]] + shapes[0][2:]

    def code(i, index):
        zero_point, ratio = params[i]
        q = inputs[i][index]
        if _same(zero_point, ratio, out_zero_point):
            return q
        value = (q.astype("float32") - tirx.const(float(zero_point), "float32")) * tirx.const(float(np.float32(ratio)),
                                                                                          "float32")
        return _to_code(value, out_zero_point)

    def body(b, c, *rest):
        value = code(len(inputs) - 1, (b, tirx.max(c - starts[-2], 0)) + rest)
        for i in range(len(inputs) - 2, -1, -1):  # the input whose channels hold c (the schedule splits by them)
            value = tirx.Select(c < starts[i + 1], code(i, (b, tirx.min(c - starts[i], shapes[i][1] - 1)) + rest),
                                value)
        return value

    return te.compute(out_shape, body, name=CONCAT_STAGE, attrs={STARTS: starts})


def concat_codes_ref(inputs: list, params: list, out_zero_point: int) -> np.ndarray:
    """:func:`concat_codes` in numpy."""
    parts = []
    for q, (zero_point, ratio) in zip(inputs, params):
        q = np.asarray(q)
        if _same(zero_point, ratio, out_zero_point):
            parts.append(q)
        else:
            parts.append(_to_code_ref((q.astype(np.float32) - np.float32(zero_point)) * np.float32(ratio),
                                      out_zero_point))
    return np.concatenate(parts, axis=1)


def concat_kernel(shapes: list, params: list, out_zero_point: int) -> tvm.tirx.PrimFunc:
    """:func:`concat_codes` over uint8 ``shapes``: ``(input 0, ..., out)``, the registry's fixed kernel."""
    inputs = [te.placeholder(tuple(s), "uint8", name=f"codes{i}") for i, s in enumerate(shapes)]
    return _kernel(inputs + [concat_codes(inputs, params, out_zero_point)], CONCAT_STAGE)
