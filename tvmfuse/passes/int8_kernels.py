"""INT8 kernels for partitions: what a partition computes, and the INT8 kernel that replaces it.

:func:`analyze` reads a partition function (anchor, bias, residual add, activation) and says whether the
INT8 kernels of :mod:`tvmfuse.schedules.int8` can compute it, and if not, why. :func:`make_int8_kernel` builds
the kernel and its constant arguments from the calibrated quantization parameters, all in numpy at compile
time: weights quantized per output channel (:func:`tvmfuse.quant.params.weight_params`) and packed for
VNNI, the bias quantized to int32 with the input zero point folded in, requantize multipliers in float32.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax, te

from tvmfuse.schedules import int8, int8_ref

from ..patterns.builders import ACTIVATIONS
from ..quant.params import QuantParams, bias_params, weight_params
from .utils import const_array

# AnnotateTIROpPattern leaves a func with op_pattern set alone; kOpaque keeps FuseOps from merging
# neighbours into the kernel (as for the FP32 kernels of LowerPartitions).
OPAQUE = 8
ANCHORS = ("relax.nn.conv2d", "relax.matmul")
INT8_ACTIVATIONS = ("relu", "clip")  # epilogue activations the INT8 kernels apply (as clips)


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


def _family(call) -> tuple[str | None, str | None]:
    """(INT8 family, None) for a supported anchor, (None, why not) otherwise."""
    if call.op.name == "relax.matmul":
        return "dense", None
    groups = int(call.attrs.groups)
    if groups == 1:
        return "conv2d", None
    in_channels = int(call.args[0].ty.shape[1])
    out_channels, weight_in = int(call.args[1].ty.shape[0]), int(call.args[1].ty.shape[1])
    if groups == in_channels and weight_in == 1:
        if out_channels == in_channels:
            return "depthwise_conv2d", None
        return None, f"depthwise conv2d with channel multiplier {out_channels // in_channels} has no INT8 kernel"
    return None, f"grouped conv2d (groups={groups}) has no INT8 kernel"


def _clip_bounds(call) -> tuple:
    lo, hi = (float(v.value) for v in call.args[1:3])
    return (lo if np.isfinite(lo) else None), (hi if np.isfinite(hi) else None)


def _short(op_name: str) -> str:
    return op_name.replace("relax.nn.", "").replace("relax.", "")


def _read_epilogue(bindings: list, index: dict, args, out_shape) -> tuple[dict | None, str | None]:
    """The ops after the anchor as ``{"bias", "residual", "clip", "ops"}``, or (None, why no INT8 kernel)."""
    found = {"bias": None, "residual": None, "clip": None, "ops": [_short(bindings[0].value.op.name)]}
    prev = bindings[0].var
    for binding in bindings[1:]:
        call, name = binding.value, binding.value.op.name
        found["ops"].append(_short(name))
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
            found["clip"] = _clip_bounds(call)
        else:
            return None, f"epilogue op {_short(name)} has no INT8 kernel"
        prev = binding.var
    return found, None


def analyze(fn: relax.Function, args) -> tuple[Int8Partition | None, str | None]:
    """Read partition function ``fn`` called with ``args``.

    Returns
    -------
    (Int8Partition, None) when an INT8 kernel computes the partition, (None, reason) when it stays FP32.
    """
    composite = str(fn.attrs["Composite"])
    activation = composite.rsplit("_", 1)[-1]
    if activation in ACTIVATIONS and activation not in INT8_ACTIVATIONS:
        return None, f"epilogue {activation} has no INT8 kernel"
    bindings = _bindings(fn)
    anchor = bindings[0].value if bindings else None
    if anchor is None or getattr(anchor.op, "name", "") not in ANCHORS:
        return None, "no conv2d or dense anchor"
    family, why = _family(anchor)
    if family is None:
        return None, why
    index = {param: i for i, param in enumerate(fn.params)}
    data, weight_param = anchor.args[0], anchor.args[1]
    weight = const_array(args[index[weight_param]]) if weight_param in index else None
    if weight is None or data not in index:
        return None, "the anchor's weight is not a constant" if weight is None else "the anchor's data is not an input"
    out_shape = tuple(_ints(bindings[-1].var.ty.shape))
    epilogue, why = _read_epilogue(bindings, index, args, out_shape)
    if epilogue is None:
        return None, why
    conv = {}
    if family != "dense":
        a = anchor.attrs
        conv = {"strides": _ints(a.strides), "padding": _ints(a.padding), "dilation": _ints(a.dilation)}
    return Int8Partition(composite, family, index[data], epilogue["residual"], weight, epilogue["bias"],
                         epilogue["clip"], conv, out_shape, epilogue["ops"]), None


def _quantized_weight(part: Int8Partition) -> tuple[np.ndarray, QuantParams]:
    """The int8 weight, output channel first (OIHW, ``[C, 1, kh, kw]``, dense ``[N, K]``), and its parameters."""
    if part.family == "dense":
        params = weight_params(part.weight, axis=1)
        return np.ascontiguousarray(params.quantize(part.weight).T), params
    params = weight_params(part.weight, axis=0)
    return params.quantize(part.weight), params


def _epilogue(part: Int8Partition, out: QuantParams | None, residual: QuantParams | None) -> int8.Epilogue:
    """The kernel's epilogue: requantize to ``out`` (None: float32 output), clip, residual."""
    res = None
    if residual is not None:
        scale = float(residual.scale) / (float(out.scale) if out is not None else 1.0)
        res = int8.Residual(int(residual.zero_point), scale)
    lo, hi = part.clip if part.clip is not None else (None, None)
    if out is None:
        return int8.Epilogue("float32", 0, lo, hi, res)
    zy, sy = int(out.zero_point), float(out.scale)
    # The clip moves into the code domain; Epilogue.bounds() intersects it with [0, 255].
    code = (lambda v: None if v is None else float(zy + round(v / sy)))
    return int8.Epilogue("uint8", zy, code(lo), code(hi), res)


def _layout(family: str) -> str:
    return {"conv2d": "NCHW, weight OIHW16o4i", "depthwise_conv2d": "NCHW, weight OIHW",
            "dense": "NC, weight NK16n4k"}[family]


@dataclasses.dataclass(frozen=True)
class Int8Constants:
    """What an INT8 kernel takes besides its activations, computed in numpy."""

    weight: np.ndarray  # int8, packed for the kernel
    bias: np.ndarray  # int32 per output channel, input zero point folded in
    multiplier: np.ndarray  # float32 per output channel
    epilogue: int8.Epilogue
    input_zero_point: int


def int8_constants(part: Int8Partition, x: QuantParams, out: QuantParams | None,
                   residual: QuantParams | None = None) -> Int8Constants:
    """Quantize and pack the weight, quantize and fold the bias, derive multipliers and the epilogue.

    ``x``, ``out`` and ``residual`` are the uint8 parameters of the data, the output (None: float32 output,
    dequantized in the epilogue) and the residual operand (None: no residual).

    Raises
    ------
    Int8KernelError
        When the kernel cannot take these parameters (a folded bias overflowing int32, an empty clip range).
    """
    s_x, za = float(x.scale), int(x.zero_point)
    wq, wparams = _quantized_weight(part)
    bias = None if part.bias is None else bias_params(s_x, wparams, axis=0).quantize(part.bias)
    folded = int8_ref.fold_zero_point(bias, wq, za)
    multiplier = int8_ref.requant_multiplier(s_x, wparams.scale, None if out is None else float(out.scale))
    if part.family == "conv2d":
        packed = int8_ref.pack_conv2d_weight(wq)
    elif part.family == "dense":
        packed = int8_ref.pack_dense_weight(wq)
    else:
        packed = wq
    return Int8Constants(packed, folded, multiplier, _epilogue(part, out, residual), za)


def make_int8_kernel(part: Int8Partition, data_shape, x: QuantParams, out: QuantParams | None,
                     residual: QuantParams | None = None) -> tuple[tvm.tirx.PrimFunc, list]:
    """The INT8 kernel of ``part`` and its constant arguments.

    Parameters
    ----------
    part : Int8Partition
    data_shape : sequence of int
        Shape of the data tensor.
    x, out, residual : QuantParams or None
        As in :func:`int8_constants`: the kernel takes the uint8 codes of the data (and of the residual).

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
    c = int8_constants(part, x, out, residual)
    channels = c.bias.shape[0]
    tensors = [te.placeholder(tuple(int(d) for d in data_shape), "uint8", name="data"),
               te.placeholder(c.weight.shape, "int8", name="weight"),
               te.placeholder((channels,), "int32", name="bias"),
               te.placeholder((channels,), "float32", name="multiplier")]
    res = None
    if part.residual is not None:
        res = te.placeholder(part.out_shape, "uint8", name="residual")
        tensors.append(res)
    common = {"input_zero_point": c.input_zero_point, "epilogue": c.epilogue}
    if part.family == "conv2d":
        output = int8.conv2d_compute(*tensors[:4], res, out_channels=channels, **common, **part.conv)
    elif part.family == "depthwise_conv2d":
        output = int8.depthwise_conv2d_compute(*tensors[:4], res, **common, **part.conv)
    else:
        output = int8.dense_compute(*tensors[:4], res, out_features=channels, epilogue=c.epilogue)
    ops = part.ops + ["requantize" if out is not None else "dequantize"]
    kernel = int8.prim_func(tensors + [output]).with_attrs({
        "tvmfuse.partition": part.composite, "tvmfuse.family": f"int8_{part.family}",
        "tvmfuse.layout": _layout(part.family), "tvmfuse.ops": ",".join(ops), "op_pattern": OPAQUE})
    return kernel, [relax.const(c.weight), relax.const(c.bias), relax.const(c.multiplier)]
