"""What a partition computes, read for the INT8 kernels: :func:`analyze` takes a partition function (anchor,
bias, residual add, activation) and returns the :class:`Int8Partition` an INT8 kernel of
:mod:`tvmfuse.schedules.computes.int8` computes, or why none does. :mod:`.int8_kernels` builds the kernel from it;
:mod:`.qdq` builds the same description from a quantized model's QDQ chains.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import relax

from tvmfuse.patterns import INT8_AFFINE
from tvmfuse.patterns.builders import AFFINE
from tvmfuse.schedules import families

from ..utils import bindings_of, const_array


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A weight the model quantized itself (a QDQ model): used as is, never re-quantized.

    Attributes
    ----------
    codes : numpy.ndarray
        int8, output channel first (OIHW, depthwise ``[C, 1, kh, kw]``, dense ``[N, K]``), zero point 0; -128
        is allowed (every kernel step is exact with it: VNNI adds u8 x s8 products in int32, the AVX2 step
        widens to int16 before ``vpmaddwd``, depthwise works in int32).
    scale : numpy.ndarray
        float32 ``[O]``, one scale per output channel.
    bias_codes, bias_scale : numpy.ndarray or None
        The model's int32 bias and its float32 scale per channel; used as is when the scale is the
        ``s_x * s_w[o]`` the kernel accumulates in (ONNX Runtime's convention), re-quantized otherwise.
    """

    codes: np.ndarray
    scale: np.ndarray
    bias_codes: np.ndarray | None = None
    bias_scale: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Int8Partition:
    """A partition the INT8 kernels can compute.

    Attributes
    ----------
    composite : str
        The partition's ``Composite`` name, e.g. ``"tvmfuse.conv2d_add_relu"``.
    family : str
        ``"conv2d"`` (groups = 1), ``"depthwise_conv2d"`` (multiplier 1) or ``"dense"``.
    data, residual : int or None
        Index in the call's arguments of the data tensor and of the residual operand (None: no residual).
    weight : numpy.ndarray
        The float weight as in the model: OIHW for convolutions, ``[K, N]`` for dense.
    bias : numpy.ndarray or None
        The float bias per output channel.
    clip : tuple of (float or None, float or None) or None
        The activation as a clip of real values: relu is ``(0, None)``; None for no activation.
    conv : dict
        ``strides``, ``padding`` (top, left, bottom, right) and ``dilation`` of a convolution.
    out_shape : tuple of int
    ops : list of str
        The partition's Relax ops, in order (recorded on the kernel).
    quantized : QuantizedWeight or None
        The model's own quantized weight and bias (QDQ models); None to quantize ``weight`` and ``bias``.
    hardswish : tuple of float or None
        ``(shift, lo, hi, divisor)`` of a hardswish activation ``v * clip(v + shift, lo, hi) / divisor``
        (ONNX HardSwish: 3, 0, 6, 6); None for none.
    affine : tuple of float or None
        ``(scale, shift)`` of ``y * scale + shift`` after the hardswish (a ``*_affine`` entry); None for none.
    added : AddedAfter or None
        A quantized residual add after the partition's own output codes (a QDQ model's ``Q, DQ, Add, Q``);
        the kernel's ``out`` parameters are then the sum's. None for none.
    """

    composite: str
    family: str
    data: int
    residual: int | None
    weight: np.ndarray
    bias: np.ndarray | None
    clip: tuple | None
    conv: dict
    out_shape: tuple
    ops: list
    quantized: QuantizedWeight | None = None
    hardswish: tuple | None = None
    affine: tuple | None = None
    added: "AddedAfter | None" = None


@dataclasses.dataclass(frozen=True)
class AddedAfter:
    """What a QDQ model does after a partition's quantize: dequantize those codes (``codes``: their
    QuantParams), add the dequantized residual, apply ``clip`` (real values, relu ``(0, None)``; None for
    none) and quantize again (:class:`tvmfuse.schedules.computes.int8_epilogue.Requantized`)."""

    codes: object  # QuantParams of the partition's own output codes
    clip: tuple | None = None


def _ints(values) -> list[int]:
    return [int(v) for v in values]



def per_channel(bias: np.ndarray, out_shape) -> np.ndarray | None:
    """``bias`` as one float32 value per channel (axis 1 of ``out_shape``), None when it is not per channel."""
    channels = int(out_shape[1])
    if bias.ndim > len(out_shape):
        return None
    shape = (1,) * (len(out_shape) - bias.ndim) + tuple(bias.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(bias.reshape(-1), (channels,)).astype(np.float32)


def clip_bounds(call) -> tuple:
    """A ``relax.clip`` call's bounds as real values; None for an infinite one."""
    lo, hi = (float(v.value) for v in call.args[1:3])
    return (lo if np.isfinite(lo) else None), (hi if np.isfinite(hi) else None)


def short_op_name(op_name: str) -> str:
    return op_name.replace("relax.nn.", "").replace("relax.", "")


def _read_epilogue(bindings: list, index: dict, args, out_shape) -> tuple[dict | None, str | None]:
    """The ops after the anchor as ``{"bias", "residual", "clip", "ops"}``, or (None, why no INT8 kernel)."""
    found = {"bias": None, "residual": None, "clip": None, "ops": [short_op_name(bindings[0].value.op.name)]}
    prev = bindings[0].var
    for binding in bindings[1:]:
        call, name = binding.value, binding.value.op.name
        found["ops"].append(short_op_name(name))
        if name == "relax.add" and found["clip"] is None:
            other = call.args[1] if call.args[0].same_as(prev) else call.args[0]
            value = args[index[other]] if other in index else None
            constant = const_array(value) if value is not None else None
            if constant is not None and found["bias"] is None and found["residual"] is None:
                found["bias"] = per_channel(constant, out_shape)
                if found["bias"] is None:
                    return None, f"bias of shape {constant.shape} is not one value per output channel"
            elif isinstance(value, relax.Var) and found["residual"] is None:
                found["residual"] = index[other]
            else:
                return None, "an add that is neither a per-channel bias nor a residual operand"
        elif name == "relax.nn.relu" and found["clip"] is None:
            found["clip"] = (0.0, None)
        elif name == "relax.clip" and found["clip"] is None:
            found["clip"] = clip_bounds(call)
        else:
            return None, f"epilogue op {short_op_name(name)} has no INT8 kernel"
        prev = binding.var
    return found, None


def _scalar(expr, index: dict, args) -> float | None:
    """The value of a one-element constant: inline or passed as a partition argument."""
    value = const_array(args[index[expr]]) if expr in index else const_array(expr)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _read_hardswish(bindings: list, index: dict, args) -> tuple[tuple | None, str | None]:
    """``(shift, lo, hi, divisor)`` of the four ops ``t = clip(v + shift, lo, hi)``, ``v * (t / divisor)``
    or ``(v * t) / divisor`` (the spellings ``patterns.builders.with_activation`` matches)."""
    add, clip, third, last = (b.value for b in bindings)
    if add.op.name != "relax.add":
        return None, "a hardswish spelt x * HardSigmoid(x) has no INT8 epilogue"
    v = add.args[0]
    shift = _scalar(add.args[1], index, args)
    lo, hi = clip_bounds(clip)
    divide = third if third.op.name == "relax.divide" else last
    divisor = _scalar(divide.args[1], index, args)
    if shift is None or divisor is None or lo is None or hi is None or divisor <= 0:
        return None, "a hardswish whose shift, clip bounds or divisor is not a finite scalar constant"
    product = last if last.op.name == "relax.multiply" else third
    if not any(a.same_as(v) for a in product.args):
        return None, "a hardswish that does not multiply its own input"
    return (shift, lo, hi, divisor), None


def _read_affine(bindings: list, index: dict, args) -> tuple[tuple | None, str | None]:
    """``(scale, shift)`` of the two ops ``y * scale``, ``+ shift`` (either operand order) after the activation."""
    multiply, add = (b.value for b in bindings)
    scale = next((s for s in (_scalar(a, index, args) for a in multiply.args) if s is not None), None)
    shift = next((s for s in (_scalar(a, index, args) for a in add.args) if s is not None), None)
    if scale is None or shift is None or not (np.isfinite(scale) and np.isfinite(shift)):
        return None, "a scale and shift after the activation that are not finite scalar constants"
    return (scale, shift), None


def analyze(fn: relax.Function, args) -> tuple[Int8Partition | None, str | None]:
    """Read partition function ``fn`` called with ``args``.

    Returns
    -------
    (Int8Partition, None) when an INT8 kernel computes the partition, (None, reason) when it stays FP32.
    """
    composite = str(fn.attrs["Composite"])
    bindings = bindings_of(fn)
    anchor = bindings[0].value if bindings else None
    if anchor is None or not families.is_anchor(anchor):
        return None, "no conv2d or dense anchor"
    family, why = families.int8_family(anchor)
    if family is None:
        return None, why
    affine = composite.endswith("_" + AFFINE)
    activation = composite.removesuffix("_" + AFFINE).rsplit("_", 1)[-1]
    if affine and activation not in INT8_AFFINE:  # the INT8 table has these after INT8_AFFINE only
        return None, "a scale and shift after the activation has no INT8 epilogue"
    if activation in families.ACTIVATIONS and activation not in family.int8.activations:
        return None, f"epilogue {activation} has no INT8 kernel"
    index = {param: i for i, param in enumerate(fn.params)}
    data, weight_param = anchor.args[0], anchor.args[1]
    weight = const_array(args[index[weight_param]]) if weight_param in index else None
    if weight is None or data not in index:
        return None, "the anchor's weight is not a constant" if weight is None else "the anchor's data is not an input"
    out_shape = tuple(_ints(bindings[-1].var.ty.shape))
    hardswish = scale_shift = None
    if affine:
        scale_shift, why = _read_affine(bindings[-2:], index, args)
        if scale_shift is None:
            return None, why
        bindings = bindings[:-2]
    if activation == "hardswish":
        hardswish, why = _read_hardswish(bindings[-4:], index, args)
        if hardswish is None:
            return None, why
        bindings = bindings[:-4]
    epilogue, why = _read_epilogue(bindings, index, args, out_shape)
    if epilogue is None:
        return None, why
    conv = {}
    if not family.matmul:
        a = anchor.attrs
        conv = {"strides": _ints(a.strides), "padding": _ints(a.padding), "dilation": _ints(a.dilation)}
    ops = epilogue["ops"] + (["hardswish"] if hardswish else []) + (["multiply", "add"] if affine else [])
    return Int8Partition(composite, family.name, index[data], epilogue["residual"], weight, epilogue["bias"],
                         epilogue["clip"], conv, out_shape, ops, hardswish=hardswish, affine=scale_shift), None
