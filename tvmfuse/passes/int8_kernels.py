"""INT8 kernels for partitions: what a partition computes, and the INT8 kernel that replaces it.

:func:`analyze` reads a partition function (anchor, bias, residual add, activation) and says whether the
INT8 kernels of :mod:`tvmfuse.schedules.int8` can compute it, and if not, why. :func:`make_int8_kernel` builds
the kernel and its constant arguments from the calibrated quantization parameters, all in numpy at compile
time: weights quantized per output channel (:func:`tvmfuse.quant.params.weight_params`) and packed for
VNNI, the bias quantized to int32 with the input zero point folded in, requantize multipliers in float32.
A partition taken from a quantized model (:mod:`.qdq`) carries the model's own int8 weight, scales and int32
bias (:class:`QuantizedWeight`), which are used as they are instead of being derived from the float weight.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax, te

from tvmfuse.schedules import families, int8, int8_ref
from tvmfuse.schedules.blocked import to_blocked, to_plain

from ..quant.params import QuantParams, bias_params, weight_params
from .layout import transform_call
from .utils import OPAQUE, const_array



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


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _bindings(fn: relax.Function) -> list:
    return [binding for block in fn.body.blocks for binding in block.bindings]


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


def analyze(fn: relax.Function, args) -> tuple[Int8Partition | None, str | None]:
    """Read partition function ``fn`` called with ``args``.

    Returns
    -------
    (Int8Partition, None) when an INT8 kernel computes the partition, (None, reason) when it stays FP32.
    """
    composite = str(fn.attrs["Composite"])
    bindings = _bindings(fn)
    anchor = bindings[0].value if bindings else None
    if anchor is None or not families.is_anchor(anchor):
        return None, "no conv2d or dense anchor"
    family, why = families.int8_family(anchor)
    if family is None:
        return None, why
    activation = composite.rsplit("_", 1)[-1]
    if activation in families.ACTIVATIONS and activation not in family.int8.activations:
        return None, f"epilogue {activation} has no INT8 kernel"
    index = {param: i for i, param in enumerate(fn.params)}
    data, weight_param = anchor.args[0], anchor.args[1]
    weight = const_array(args[index[weight_param]]) if weight_param in index else None
    if weight is None or data not in index:
        return None, "the anchor's weight is not a constant" if weight is None else "the anchor's data is not an input"
    out_shape = tuple(_ints(bindings[-1].var.ty.shape))
    hardswish = None
    if activation == "hardswish":
        hardswish, why = _read_hardswish(bindings[-4:], index, args)
        if hardswish is None:
            return None, why
        bindings = bindings[:-4]
    epilogue, why = _read_epilogue(bindings, index, args, out_shape)
    if epilogue is None:
        return None, why
    conv = {}
    if family.name != "dense":
        a = anchor.attrs
        conv = {"strides": _ints(a.strides), "padding": _ints(a.padding), "dilation": _ints(a.dilation)}
    return Int8Partition(composite, family.name, index[data], epilogue["residual"], weight, epilogue["bias"],
                         epilogue["clip"], conv, out_shape, epilogue["ops"] + (["hardswish"] if hardswish else []),
                         hardswish=hardswish), None


def _quantized_weight(part: Int8Partition) -> tuple[np.ndarray, QuantParams]:
    """The int8 weight, output channel first (OIHW, ``[C, 1, kh, kw]``, dense ``[N, K]``), and its parameters."""
    if part.quantized is not None:
        scale = np.asarray(part.quantized.scale, np.float32)
        return part.quantized.codes, QuantParams(scale, np.zeros(scale.shape, np.int32), "int8", axis=0)
    if part.family == "dense":
        params = weight_params(part.weight, axis=1)
        return np.ascontiguousarray(params.quantize(part.weight).T), params
    params = weight_params(part.weight, axis=0)
    return params.quantize(part.weight), params


def _int32_bias(part: Int8Partition, s_x: float, wparams: QuantParams) -> np.ndarray | None:
    """The bias in the accumulator's units ``s_x * s_w[o]``: the model's codes when they are in those units."""
    if part.bias is None:
        return None
    params = bias_params(s_x, wparams, axis=0)
    q = part.quantized
    if q is not None and q.bias_codes is not None and np.allclose(q.bias_scale, params.scale, rtol=1e-6, atol=0):
        return np.asarray(q.bias_codes, np.int32)
    return params.quantize(part.bias)


def _pack(pack, weight: np.ndarray) -> np.ndarray:
    """``pack(weight)``, also for a model's weight holding -128, which the packers refuse.

    Packing moves values and fills with zeros, so it commutes with subtracting a 0/1 mask of the -128s.
    """
    low = weight == -128
    if not low.any():
        return pack(weight)
    packed = pack(np.maximum(weight, -127).astype(np.int8)).astype(np.int16) - pack(low.astype(np.int8))
    return packed.astype(np.int8)


def model_multiplier(input_scale: float, weight_scales, output_scale: float | None = None) -> np.ndarray:
    """``M[o] = s_x * s_w[o] / s_y`` for a quantized model's own scales, in float32 operations as ONNX
    Runtime's QLinearConv / QLinearMatMul compute it (``s_x * s_w[o]`` for a float32 output).

    It can be one ulp away from :func:`int8_ref.requant_multiplier` (float64, rounded once); that moves an
    output lying within ~1e-7 of a rounding tie by one code, so following the runtime the model was made
    for keeps the results equal to it.
    """
    m = np.float32(input_scale) * np.asarray(weight_scales, np.float32).reshape(-1)
    return (m if output_scale is None else m / np.float32(output_scale)).astype(np.float32)


def _epilogue(part: Int8Partition, out: QuantParams | None, residual: QuantParams | None) -> int8.Epilogue:
    """The kernel's epilogue: requantize to ``out`` (None: float32 output), clip, residual, hardswish.

    With a hardswish the kernel works on real values (multiplier ``s_x * s_w``, residual scale ``s_r``) and
    the output's ``1 / s_y`` joins the hardswish's ``1 / divisor``."""
    real = part.hardswish is not None
    res = None
    if residual is not None:
        scale = float(residual.scale) / (float(out.scale) if out is not None and not real else 1.0)
        res = int8.Residual(int(residual.zero_point), scale)
    hardswish = None
    if real:
        shift, lo, hi, divisor = part.hardswish
        hardswish = int8.HardSwish(shift, lo, hi, 1.0 / (divisor * (float(out.scale) if out is not None else 1.0)))
    lo, hi = part.clip if part.clip is not None else (None, None)
    if out is None:
        return int8.Epilogue("float32", 0, lo, hi, res, hardswish)
    zy, sy = int(out.zero_point), float(out.scale)
    # The clip moves into the code domain; Epilogue.bounds() intersects it with the dtype's range.
    code = (lambda v: None if v is None else float(zy + round(v / sy)))
    return int8.Epilogue(out.dtype, zy, code(lo), code(hi), res, hardswish)


@dataclasses.dataclass(frozen=True)
class Int8Constants:
    """What an INT8 kernel takes besides its activations, computed in numpy."""

    weight: np.ndarray  # int8, packed for the kernel
    bias: np.ndarray  # int32 per output channel, input zero point folded in
    multiplier: np.ndarray  # float32 per output channel
    epilogue: int8.Epilogue
    input_zero_point: int


def int8_constants(part: Int8Partition, x: QuantParams, out: QuantParams | None,
                   residual: QuantParams | None = None, blocked: bool = False) -> Int8Constants:
    """Quantize and pack the weight, quantize and fold the bias, derive multipliers and the epilogue.

    ``x`` are the uint8 parameters of the data; ``out`` those of the output, uint8 or int8 (None: float32
    output, dequantized in the epilogue); ``residual`` those of the residual operand, uint8 or int8 (None: no
    residual). ``blocked``: the weight packed for the family's NCHW16c kernel (``Int8.blocked_pack``).

    Raises
    ------
    Int8KernelError
        When the kernel cannot take these parameters (a folded bias overflowing int32, an empty clip range).
    """
    s_x, za = float(x.scale), int(x.zero_point)
    wq, wparams = _quantized_weight(part)
    folded = int8_ref.fold_zero_point(_int32_bias(part, s_x, wparams), wq, za)
    s_y = None if out is None or part.hardswish is not None else float(out.scale)  # a hardswish needs real values
    if part.quantized is not None:
        multiplier = model_multiplier(s_x, wparams.scale, s_y)
    else:
        multiplier = int8_ref.requant_multiplier(s_x, wparams.scale, s_y)
    spec = families.FAMILIES[part.family].int8
    pack = spec.blocked_pack if blocked else spec.pack
    packed = _pack(families.resolve(pack), wq) if pack else wq
    return Int8Constants(packed, folded, multiplier, _epilogue(part, out, residual), za)


def blocked_kernel(part: Int8Partition) -> bool:
    """Whether ``part``'s family has an NCHW16c INT8 kernel (and the output is an NCHW activation)."""
    return families.FAMILIES[part.family].int8.blocked_pack is not None and len(part.out_shape) == 4


def data_layout(part: Int8Partition, blocked: bool) -> str | None:
    """The layout the kernel of ``part`` reads its data in: NCHW; NCHW16c with ``blocked`` where the family has
    that form; None (whichever its producer wrote) where the kernel also repacks its input anyway."""
    if not (blocked and blocked_kernel(part)):
        return "NCHW"
    return None if families.FAMILIES[part.family].int8.repacks_input else int8.BLOCKED_LAYOUT


def kernel_out_shape(part: Int8Partition, out_layout: str) -> list[int]:
    """The kernel's output shape: the partition's, or its NCHW16c form."""
    return list(part.out_shape) if out_layout == "NCHW" else int8.out_shape_of(*part.out_shape, out_layout)


def relayout(builder, codes, plain_shape, layout: str) -> relax.Call:
    """The call converting ``codes`` (NCHW or NCHW16c; ``plain_shape`` is their NCHW shape) to ``layout``."""
    plain = [int(d) for d in plain_shape]
    if layout == "NCHW":
        return transform_call(builder, lambda t: to_plain(t, plain[1]), codes, plain)
    return transform_call(builder, lambda t: to_blocked(t, int8.BLOCK_O), codes, int8.out_shape_of(*plain, layout))


def _padded(values: np.ndarray, length: int) -> np.ndarray:
    """``values`` padded with zeros to ``length`` (the NCHW16c output's padded channels)."""
    return np.concatenate([values, np.zeros(length - values.shape[0], values.dtype)])


def make_int8_kernel(part: Int8Partition, data_shape, x: QuantParams, out: QuantParams | None,
                     residual: QuantParams | None = None, out_layout: str = "NCHW") -> tuple[tvm.tirx.PrimFunc, list]:
    """The INT8 kernel of ``part`` and its constant arguments.

    Parameters
    ----------
    part : Int8Partition
    data_shape : sequence of int
        Shape of the data tensor: NCHW, or NCHW16c (``[N, ceil(C/16), H, W, 16]``) for a family with an
        NCHW16c kernel (:func:`blocked_kernel`), which then computes in that layout.
    x, out, residual : QuantParams or None
        As in :func:`int8_constants`: the kernel takes the uint8 codes of the data (and the codes of the
        residual, in ``residual.dtype`` and the output's layout).
    out_layout : str
        ``"NCHW"``, or ``"NCHW16c"`` for a uint8/int8 output of a family with an NCHW16c kernel.

    Returns
    -------
    kernel : tvm.tirx.PrimFunc
        Arguments ``(data, weight, bias, multiplier[, residual])``, output last; attrs ``tvmfuse.partition``,
        ``tvmfuse.family`` (``int8_<family>``), ``tvmfuse.layout``, ``tvmfuse.ops``, ``op_pattern``.
    constants : list of relax.Constant
        The packed int8 weight, the int32 bias, the float32 multipliers.

    Raises
    ------
    Int8KernelError
        As :func:`int8_constants`.
    """
    blocked = len(data_shape) == 5 or out_layout != "NCHW"
    if blocked and not blocked_kernel(part):
        raise int8.Int8KernelError(f"{part.composite}: the {part.family} INT8 kernel has no {int8.BLOCKED_LAYOUT} form")
    c = int8_constants(part, x, out, residual, blocked)
    channels = c.bias.shape[0]
    out_shape = kernel_out_shape(part, out_layout)
    bias, multiplier = c.bias, c.multiplier
    if out_layout != "NCHW":
        bias, multiplier = _padded(bias, out_shape[1] * out_shape[4]), _padded(multiplier, out_shape[1] * out_shape[4])
    tensors = [te.placeholder(tuple(int(d) for d in data_shape), "uint8", name="data"),
               te.placeholder(c.weight.shape, "int8", name="weight"),
               te.placeholder(bias.shape, "int32", name="bias"),
               te.placeholder(multiplier.shape, "float32", name="multiplier")]
    res = None
    if part.residual is not None:
        res = te.placeholder(out_shape, residual.dtype, name="residual")
        tensors.append(res)
    family = families.FAMILIES[part.family]
    compute = families.resolve(family.int8.compute)
    layout = {"out_layout": out_layout} if blocked else {}
    output = compute(*tensors[:4], res, channels=channels, input_zero_point=c.input_zero_point,
                     epilogue=c.epilogue, **part.conv, **layout)
    ops = part.ops + ["requantize" if out is not None else "dequantize"]
    described = family.int8.layout if not blocked else \
        f"{'NCHW16c' if len(data_shape) == 5 else 'NCHW'} -> {out_layout}, weight packed for {int8.BLOCKED_LAYOUT}"
    kernel = int8.prim_func(tensors + [output]).with_attrs({
        "tvmfuse.partition": part.composite, "tvmfuse.family": families.int8_kernel_name(family),
        "tvmfuse.layout": described, "tvmfuse.ops": ",".join(ops), "op_pattern": OPAQUE})
    return kernel, [relax.const(c.weight), relax.const(bias), relax.const(multiplier)]
