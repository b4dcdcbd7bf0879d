"""Quantization parameters: scales and zero points, and the numpy reference of quantize/dequantize.

The conventions are the ones the INT8 kernels are built around (VNNI multiplies u8 activations by s8
weights and sums pairs into s32):

- activations: asymmetric ``uint8``, one scale and zero point per tensor, the range always holding 0 so
  that zero padding and ReLU's zero are exact (:func:`activation_params`);
- weights: symmetric ``int8`` per output channel, zero point 0, narrowed to [-127, 127] (TensorRT's
  convention) so the grid is symmetric: ``w`` and ``-w`` quantize to opposite values and no weight needs the
  lone -128 (:func:`weight_params`). VNNI's ``vpdpbusd`` adds its four u8 x s8 products straight into s32,
  so nothing saturates there. The narrow range does *not* protect the step of CPUs without VNNI,
  ``vpmaddubsw``, whose s16 pair sums reach 2 * 255 * 127 = 64770 > 32767: for those targets the weights are
  quantized to [-64, 64] (``weight_params(limit=64)``, onnxruntime's ``reduce_range``), where every pair fits;
  a quantized model's own full-range codes take a step that widens to int16 before multiplying;
- biases: ``int32`` with scale ``s_x * s_w`` per channel, so they add straight into the s32 accumulator
  (:func:`bias_params`).

``quantize`` rounds half to even like ONNX ``QuantizeLinear`` (and ``relax.op.quantize``) and divides in
float32 like they do, so the numpy reference and compiled kernels agree bit for bit. Only numpy is used.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import TvmfuseError

# (qmin, qmax) of each integer type.
_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "int32": (-(2**31), 2**31 - 1)}
# Scale for a tensor or channel that is zero everywhere: any positive value represents it exactly.
_ZERO_RANGE_SCALE = 1.0


class QuantParamsError(TvmfuseError, ValueError):
    """Quantization parameters or a range that cannot be used (non-finite, lo > hi, wrong dtype or axis)."""


@dataclasses.dataclass(frozen=True)
class QuantParams:
    """Scale and zero point of a quantized tensor: ``real = (q - zero_point) * scale``.

    Attributes
    ----------
    scale : float or numpy.ndarray
        Positive and finite; a float32-representable float per tensor, or a 1-D float32 array per channel.
    zero_point : int or numpy.ndarray
        An integer in the dtype's range; per channel when ``scale`` is.
    dtype : str
        ``"uint8"``, ``"int8"`` or ``"int32"``.
    axis : int or None
        The channel axis for per-channel parameters, ``None`` per tensor.
    narrow_range : bool
        Restrict ``int8`` to [-127, 127] (symmetric weights) instead of [-128, 127].
    """

    scale: float | np.ndarray
    zero_point: int | np.ndarray
    dtype: str
    axis: int | None = None
    narrow_range: bool = False

    def __post_init__(self):
        if self.dtype not in _RANGES:
            raise QuantParamsError(f"quantized dtype must be one of {sorted(_RANGES)}, got {self.dtype!r}")
        scale = np.asarray(self.scale, dtype=np.float32)
        zp = np.asarray(self.zero_point)
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise QuantParamsError(f"scale must be positive and finite, got {self.scale}")
        if zp.dtype.kind not in "iu" and not np.array_equal(zp, np.round(zp)):
            raise QuantParamsError(f"zero point must be an integer, got {self.zero_point}")
        qmin, qmax = self.qrange
        if np.any(zp < qmin) or np.any(zp > qmax):
            raise QuantParamsError(f"zero point {self.zero_point} is outside the {self.dtype} range [{qmin}, {qmax}]")
        if self.axis is None and (scale.ndim or zp.ndim):
            raise QuantParamsError("per-channel scale or zero point given without an axis")
        if self.axis is not None and scale.ndim != 1:
            raise QuantParamsError(f"per-channel parameters (axis={self.axis}) need a 1-D scale, got shape "
                                   f"{scale.shape}")

    @property
    def qrange(self) -> tuple[int, int]:
        """``(qmin, qmax)`` of the quantized values."""
        qmin, qmax = _RANGES[self.dtype]
        return (-127 if self.narrow_range and self.dtype == "int8" else qmin), qmax

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    def _broadcast(self, value, ndim: int, dtype) -> np.ndarray:
        """``value`` (scale or zero point) shaped to broadcast against an ``ndim``-D tensor."""
        value = np.asarray(value, dtype=dtype)
        if self.axis is None:
            return value
        axis = self.axis % ndim if ndim else 0
        if ndim == 0 or value.ndim == 0:
            return value
        shape = [1] * ndim
        shape[axis] = value.shape[0]
        return value.reshape(shape)

    def _check_channels(self, x: np.ndarray) -> None:
        if self.axis is None:
            return
        if x.ndim == 0 or not -x.ndim <= self.axis < x.ndim:
            raise QuantParamsError(f"axis {self.axis} is out of range for a tensor of shape {x.shape}")
        n = np.asarray(self.scale).shape[0]
        if x.shape[self.axis] != n:
            raise QuantParamsError(f"tensor of shape {x.shape} has {x.shape[self.axis]} channels on axis "
                                   f"{self.axis}, the parameters have {n}")

    def quantize(self, x) -> np.ndarray:
        """``clip(round_half_even(x / scale) + zero_point)`` as ``dtype``, like ONNX QuantizeLinear.

        The division is done in float32 (as QuantizeLinear and ``relax.op.quantize`` do) for 8-bit types,
        and in float64 for ``int32`` biases, which are quantized offline and would lose digits in float32.
        """
        x = np.asarray(x)
        self._check_channels(x)
        ftype = np.float64 if self.dtype == "int32" else np.float32
        scale = self._broadcast(self.scale, x.ndim, ftype)
        zp = self._broadcast(self.zero_point, x.ndim, ftype)
        q = np.rint(x.astype(ftype) / scale) + zp
        qmin, qmax = self.qrange
        return np.clip(q, qmin, qmax).astype(self.dtype)

    def dequantize(self, q) -> np.ndarray:
        """``(q - zero_point) * scale`` in float32, like ONNX DequantizeLinear."""
        q = np.asarray(q)
        self._check_channels(q)
        scale = self._broadcast(self.scale, q.ndim, np.float32)
        zp = self._broadcast(self.zero_point, q.ndim, np.int64)
        return ((q.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)


def _check_range(lo: float, hi: float) -> tuple[float, float]:
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise QuantParamsError(f"range [{lo}, {hi}] is not finite")
    if lo > hi:
        raise QuantParamsError(f"range [{lo}, {hi}] has lo > hi")
    return lo, hi


def activation_params(lo: float, hi: float, dtype: str = "uint8") -> QuantParams:
    """Asymmetric per-tensor parameters covering ``[lo, hi]`` (widened to hold 0).

    The zero point is ``qmin - round(lo / scale)``, an exact integer, so real 0 is represented exactly. A
    range that is 0 everywhere (``lo == hi == 0``) gets scale 1 and the zero point of real 0; ``lo == hi``
    elsewhere is widened to hold 0 like any other range.

    Parameters
    ----------
    lo, hi : float
        The calibrated range, finite, ``lo <= hi``.
    dtype : str
        ``"uint8"`` (what VNNI wants for activations) or ``"int8"``.

    Returns
    -------
    QuantParams
    """
    if dtype not in ("uint8", "int8"):
        raise QuantParamsError(f"activations are quantized to uint8 or int8, got {dtype!r}")
    lo, hi = _check_range(lo, hi)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    qmin, qmax = _RANGES[dtype]
    scale = float(np.float32((hi - lo) / (qmax - qmin)))
    if not scale > 0:  # lo == hi == 0, or a range so small its scale underflows float32
        scale = _ZERO_RANGE_SCALE
    zero_point = int(np.clip(qmin - np.rint(lo / scale), qmin, qmax))
    return QuantParams(scale, zero_point, dtype)


def weight_params(w, axis: int = 0, limit: int = 127) -> QuantParams:
    """Symmetric ``int8`` parameters per output channel of the weight ``w``, zero point 0.

    ``scale[c] = max |w[c]| / limit`` (float32), so quantized weights stay in [-limit, limit]: 127, or 64 for
    7-bit weights (onnxruntime's ``reduce_range``), whose u8 x s8 product pairs fit int16, what INT8 kernels
    without VNNI add them in. A channel that is zero everywhere (or whose scale would underflow float32) gets
    scale 1: all its values quantize to 0.

    Parameters
    ----------
    w : array_like
        The float weight, e.g. OIHW for convolutions (``axis=0``) or (in, out) for ``matmul`` (``axis=1``).
    axis : int
        The output-channel axis.
    limit : int
        The largest code, 1 to 127.

    Returns
    -------
    QuantParams
    """
    if not 1 <= limit <= 127:
        raise QuantParamsError(f"weight code limit must be 1 to 127, got {limit}")
    w = np.asarray(w, dtype=np.float32)
    if w.ndim == 0 or not -w.ndim <= axis < w.ndim:
        raise QuantParamsError(f"axis {axis} is out of range for a weight of shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise QuantParamsError(f"weight of shape {w.shape} holds non-finite values")
    axis %= w.ndim
    others = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=others) if others else np.abs(w)
    scale = (amax / np.float32(limit)).astype(np.float32)
    scale[~(scale > 0)] = _ZERO_RANGE_SCALE
    return QuantParams(scale, np.zeros(scale.shape, dtype=np.int32), "int8", axis=axis, narrow_range=True)


def bias_params(input_scale: float, weight: QuantParams, axis: int = 0) -> QuantParams:
    """``int32`` parameters of a bias added to the s32 accumulator of ``x (input_scale) * w (weight)``.

    ``scale[c] = input_scale * weight.scale[c]`` computed in float32, zero point 0.

    Parameters
    ----------
    input_scale : float
        The activation's (per-tensor) scale.
    weight : QuantParams
        The weight's parameters (per channel or per tensor).
    axis : int
        The channel axis of the bias tensor, e.g. 0 for a (C,) bias or 1 for a (1, C, 1, 1) one.
    """
    if not (np.isfinite(input_scale) and input_scale > 0):
        raise QuantParamsError(f"input scale must be positive and finite, got {input_scale}")
    scale = np.float32(input_scale) * np.asarray(weight.scale, dtype=np.float32)
    if not np.all(scale > 0):
        raise QuantParamsError(f"bias scale underflows float32 (input scale {input_scale}, weight scale "
                               f"min {np.min(weight.scale)})")
    if scale.ndim == 0:
        return QuantParams(float(scale), 0, "int32")
    return QuantParams(scale.astype(np.float32), np.zeros(scale.shape, dtype=np.int32), "int32", axis=axis)
