"""INT8 kernels for partitions: what a partition computes, and the INT8 kernel that replaces it.

:func:`.match.analyze` reads a partition function (anchor, bias, residual add, activation) and
says whether the INT8 kernels of :mod:`tvmfuse.schedules.computes.int8` can compute it, and if not, why.
:func:`make_int8_kernel` builds the kernel and its constant arguments from the calibrated quantization parameters, all in numpy at compile
time: weights quantized per output channel (:func:`tvmfuse.quant.params.weight_params`) and packed for
VNNI, the bias quantized to int32 with the input zero point folded in, requantize multipliers in float32.
A partition taken from a quantized model (:mod:`.qdq`) carries the model's own int8 weight, scales and int32
bias (:class:`.match.QuantizedWeight`), which are used as they are instead of being derived from the
float weight.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import relax, te

from tvmfuse.schedules import families
from tvmfuse.schedules.computes import int8, int8_amx, int8_ref, int8_winograd
from tvmfuse.schedules.computes import int8_depthwise as int8_dw
from tvmfuse.schedules.computes.blocked import to_blocked, to_plain

from ...quant.params import QuantParams, bias_params, weight_params
from ..layout import transform_call
from .epilogues import epilogue, model_multiplier
from .match import Int8Partition
from ..utils import OPAQUE


# The largest int32 bias code a derived weight scale may give: half of int32, the other half left for the input
# zero point's fold (``za * sum(w)`` is at most 255 x 127 x 33k inputs per output)
BIAS_CODE_LIMIT = 2 ** 30


def _quantized_weight(part: Int8Partition, limit: int = 127, input_scale: float | None = None
                      ) -> tuple[np.ndarray, QuantParams]:
    """The int8 weight, output channel first (OIHW, ``[C, 1, kh, kw]``, dense ``[N, K]``), and its parameters;
    a float weight is quantized to [-limit, limit], a quantized model's codes are taken as they are.

    With ``input_scale``, a float weight's channel whose bias would not fit an int32 code
    (``|b| / (s_x * s_w) > BIAS_CODE_LIMIT``: a channel of near-zero weights under a real bias, which
    PP-OCRv4's recognizers have after a hardswish) gets the smallest scale that fits it, as onnxruntime's
    quantizer widens such weight scales: its weights lose resolution they hardly had, and the conv stays INT8
    (before, it stayed FP32, 36% of en_ppocrv4_rec's INT8 time on AVX2 code)."""
    if part.quantized is not None:
        scale = np.asarray(part.quantized.scale, np.float32)
        return part.quantized.codes, QuantParams(scale, np.zeros(scale.shape, np.int32), "int8", axis=0)
    axis = 1 if families.FAMILIES[part.family].matmul else 0
    params = weight_params(part.weight, axis=axis, limit=limit)
    if input_scale is not None and part.bias is not None:
        params = _bias_fitted(params, np.asarray(part.bias, np.float64).reshape(-1), input_scale)
    codes = params.quantize(part.weight)
    return (np.ascontiguousarray(codes.T) if axis else codes), params


def _bias_fitted(params: QuantParams, bias: np.ndarray, input_scale: float) -> QuantParams:
    """``params`` with each channel's scale raised to at least ``|bias| / (s_x * BIAS_CODE_LIMIT)``."""
    scale = np.asarray(params.scale, np.float32)
    need = np.abs(bias) / (float(input_scale) * BIAS_CODE_LIMIT)
    if not (need > scale).any():
        return params
    wider = np.maximum(scale, need.astype(np.float32))
    wider = np.where(wider < need, np.nextafter(wider, np.float32(np.inf)), wider).astype(np.float32)
    return dataclasses.replace(params, scale=wider)


WEIGHT_BITS = (7, 8)  # the weight widths quantize takes (``weight_bits``)


def default_weight_bits(weights: str) -> int:
    """7 where a target without VNNI (``weights == "pairs"``) runs the 16x4 blocks, so that its kernels add
    product pairs in int16 (onnxruntime's ``reduce_range``: half the weight's resolution for about twice the
    speed there); 8 elsewhere."""
    return 7 if weights == "pairs" else 8


def check_weight_bits(weight_bits: int | None) -> None:
    if weight_bits not in (None, *WEIGHT_BITS):
        raise int8.Int8KernelError(f"weight_bits must be 7 or 8 (or None: 7 on a target without VNNI), got "
                                   f"{weight_bits!r}")


def weight_limit(family: families.Int8, weights: str, weight_bits: int | None = None) -> int:
    """The largest code a float weight of ``family`` is quantized to: 7-bit (``int8_ref.PAIR_SAFE_CODE``) for a
    family of 16x4 blocks (conv2d, dense) at ``weight_bits`` 7 (None: :func:`default_weight_bits` of the
    target's ``weights``), 127 otherwise (the depthwise taps always: their pair step is exact for any code)."""
    bits = weight_bits or default_weight_bits(weights)
    return int8_ref.PAIR_SAFE_CODE if bits == 7 and family.pairs else 127


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
    kept = pack(np.maximum(weight, -127).astype(np.int8))
    return (kept.astype(np.int16) - pack(low.astype(np.int8))).astype(kept.dtype)  # int8, or exact float32


def packed_weight(family: families.Int8, weight: np.ndarray, pack: str | None, weights: str) -> np.ndarray:
    """``weight`` (int8, unpacked) packed by ``pack`` ("module.function"; None: as it is). A target without
    VNNI (``weights == "pairs"``) takes the family's 16x4 blocks as they are where every pair of codes fits
    its int16 pair sums (``int8_ref.pairs_fit_int16``: :func:`exact_pairs`), else as int16 pairs."""
    packed = _pack(families.resolve(pack), weight) if pack else weight
    if weights == "pairs" and family.pairs and not int8_ref.pairs_fit_int16(packed):
        return int8_ref.to_pairs(packed)
    return packed


def exact_pairs(family: families.Int8, packed: np.ndarray, weights: str) -> bool:
    """Whether the kernel may add its u8 x s8 product pairs in int16 (``int8.EXACT_PAIRS_ATTR``): a target
    without VNNI took the 16x4 int8 blocks :func:`packed_weight` checked."""
    return weights == "pairs" and family.pairs and packed.dtype == np.int8


def mark_exact_pairs(kernel, exact: bool):
    """``kernel`` (a PrimFunc) with ``int8.EXACT_PAIRS_ATTR`` set where ``exact``."""
    return kernel.with_attr(int8.EXACT_PAIRS_ATTR, True) if exact else kernel


@dataclasses.dataclass(frozen=True)
class OutputTable:
    """Elementwise ops after an INT8 kernel as one table: ``codes[q]`` is the output code for the requantized
    code ``q`` (:func:`tvmfuse.schedules.computes.int8_epilogue.table_index`), ``ops`` their names (recorded on the
    kernel)."""

    codes: np.ndarray
    ops: tuple = ()


@dataclasses.dataclass(frozen=True)
class Int8Constants:
    """What an INT8 kernel takes besides its activations, computed in numpy."""

    weight: np.ndarray  # int8, packed for the kernel
    bias: np.ndarray  # int32 per output channel, input zero point folded in (float32: the float depthwise's)
    multiplier: np.ndarray  # float32 per output channel
    epilogue: int8.Epilogue
    input_zero_point: int
    kernel_width: int | None = None  # kw of a weight packed by the family's vnni_pack/pairs_pack (rounded up)
    exact_pairs: bool = False  # int8 blocks a target without VNNI takes (:func:`exact_pairs`)
    winograd: bool = False  # the weight is int8_winograd.pack_weight's: the kernel is the Winograd form


def weight_packing(spec) -> str:
    """How the target's INT8 kernels take their weights (a ``TargetSpec``; None: an unnamed CPU): its
    backend's ``int8_weights``, ``"amx"``, ``"vnni"``, ``"avxvnni"``, ``"pairs"``, ``"signed"`` or ``""``."""
    return spec.backend().int8_weights if spec is not None else ""


def codes_blocked(spec, blocked: bool) -> bool:
    """Whether INT8 kernels pass their uint8 codes NCHW16c: the blocked layout was asked for and the target's
    backend takes it (``int8_blocked``; None, an unnamed CPU, does)."""
    return blocked and (spec is None or spec.backend().int8_blocked)


def signed_data(part: Int8Partition, weights: str) -> bool:
    """Whether the kernel of ``part`` sums its input shifted to int8 (``int8.SIGNED_SHIFT``): a family whose
    compute takes ``signed_data``, for a target whose kernels want it (``weights == "signed"``)."""
    return weights == "signed" and families.FAMILIES[part.family].int8.signed_data


def taps_pack(part: Int8Partition, blocked: bool, weights: str) -> str | None:
    """The family's ``vnni_pack`` (an AVX512-VNNI target) or ``pairs_pack`` (without it, AVX-VNNI too) when the
    kernel of ``part`` takes it: an NCHW16c kernel with dilation 1 along the row (the depthwise taps in fours
    read neighbouring pixels); None otherwise."""
    spec = families.FAMILIES[part.family].int8
    packs = {"vnni": spec.vnni_pack, "amx": spec.vnni_pack, "pairs": spec.pairs_pack, "avxvnni": spec.pairs_pack}
    pack = packs.get(weights)
    return pack if blocked and pack is not None and part.conv.get("dilation", [1, 1])[-1] == 1 else None


# Kernel rows at least this wide sum in float on targets without VNNI: the taps-in-fours pair step would
# waste 3 of 8 taps of a 5-wide row (AVX2 code, kernel alone: 240x28x28 5x5 168 -> 158 us, 672x14x14 122 ->
# 115; 3x3 rows keep the pair step, 203 against 216 us at 144x56x56).
FLOAT_ROW = 5


def float_pack(part: Int8Partition, blocked: bool, weights: str, weight: np.ndarray) -> str | None:
    """The family's ``float_pack`` where a target whose depthwise taps would be int16 pairs (no VNNI, or
    AVX-VNNI's ymm only) runs this NCHW16c kernel summing in float (a kernel row of :data:`FLOAT_ROW` taps or
    more); None otherwise. AVX512-VNNI keeps its ``vpdpbusd`` taps (Zen 4: ppocrv5_cls 1.07x, EfficientNet-Lite0
    1.04x slower in float)."""
    pack = families.FAMILIES[part.family].int8.float_pack
    wide = blocked and pack and int(weight.shape[-1]) >= FLOAT_ROW
    return pack if wide and weights in ("pairs", "avxvnni") else None


def tiles_pack(family: families.Int8, weight: np.ndarray, weights: str) -> str | None:
    """The family's ``amx_pack`` when a target with AMX tiles (``weights == "amx"``) runs this int8 weight
    (OIHW: its input channels, :func:`int8_amx.takes_tiles`) on them; None otherwise."""
    if weights == "amx" and family.amx_pack and int8_amx.takes_tiles(int(weight.shape[1])):
        return family.amx_pack
    return None


# Whether targets without VNNI run 3x3 stride-1 convs as integer Winograd (int8_winograd): a switch for measuring
# one form against the other.
WINOGRAD = True


def winograd_candidate(part: Int8Partition, data_shape, out_layout: str, weights: str) -> bool:
    """Whether the kernel of ``part`` may be :mod:`~tvmfuse.schedules.computes.int8_winograd`'s (its codes are
    checked later, :func:`int8_constants`): a conv2d on a target without VNNI (``weights == "pairs"``) from
    NCHW16c codes to NCHW16c codes, 3x3, stride 1, padding 1, wide enough (``int8_winograd.pays``)."""
    if not (WINOGRAD and weights == "pairs" and families.FAMILIES[part.family] is families.CONV2D
            and len(data_shape) == 5 and out_layout != "NCHW"):
        return False
    weight = part.quantized.codes if part.quantized is not None else part.weight
    conv = part.conv
    return int8_winograd.pays(weight.shape[2:], conv.get("strides", [1, 1]), conv.get("dilation", [1, 1]),
                              conv.get("padding", [0, 0, 0, 0]), int(weight.shape[1]), int(weight.shape[0]))


def int8_constants(part: Int8Partition, x: QuantParams, out: QuantParams | None,
                   residual: QuantParams | None = None, blocked: bool = False, weights: str = "",
                   weight_bits: int | None = None, winograd: bool = False) -> Int8Constants:
    """Quantize and pack the weight, quantize and fold the bias, derive multipliers and the epilogue.

    ``x`` are the uint8 parameters of the data; ``out`` those of the output, uint8 or int8 (None: float32
    output, dequantized in the epilogue); ``residual`` those of the residual operand, uint8 or int8 (None: no
    residual). ``blocked``: the weight packed for the family's NCHW16c kernel (``Int8.blocked_pack``).
    ``weights``: the target's :func:`weight_packing` (``Int8.vnni_pack`` or ``pairs_pack`` where
    :func:`taps_pack`; the rest as :func:`packed_weight`). ``weight_bits``: 7 or 8 bits of a float conv or dense
    weight (None: the target's default, :func:`weight_limit`). ``winograd``: a :func:`winograd_candidate`, packed
    for the Winograd form where the direct kernel would take int16 pairs (codes beyond the ``vpmaddubsw`` step's
    range) and the codes keep every Winograd sum within int32 (``int8_winograd.fits``).

    Raises
    ------
    Int8KernelError
        When the kernel cannot take these parameters (a folded bias overflowing int32, an empty clip range).
    """
    s_x, za = float(x.scale), int(x.zero_point)
    spec = families.FAMILIES[part.family].int8
    wq, wparams = _quantized_weight(part, weight_limit(spec, weights, weight_bits), s_x)
    floats = float_pack(part, blocked, weights, wq)
    # the kernel sums x - shift: the float form subtracts the zero point itself
    shift = za if floats else int8.SIGNED_SHIFT if signed_data(part, weights) else 0
    folded = int8_ref.fold_zero_point(_int32_bias(part, s_x, wparams), wq, za - shift)
    if floats and np.abs(folded).max(initial=0) <= int8_dw.FLOAT_BIAS:
        folded = folded.astype(np.float32)  # exact: added to the float sums in float (no int32 round trip)
    s_y = None if out is None or part.hardswish is not None else float(out.scale)  # a hardswish needs real values
    if part.added is not None:  # the kernel requantizes to the partition's own codes before the add
        s_y = float(part.added.codes.scale)
    if part.quantized is not None:
        multiplier = model_multiplier(s_x, wparams.scale, s_y)
    else:
        multiplier = int8_ref.requant_multiplier(s_x, wparams.scale, s_y)
    width = None
    if floats:
        pack = floats
    elif taps := taps_pack(part, blocked, weights):
        pack, width = taps, int(wq.shape[-1])
    else:
        pack = tiles_pack(spec, wq, weights) or (spec.blocked_pack if blocked else spec.pack)
    packed = packed_weight(spec, wq, pack, weights)
    exact = exact_pairs(spec, packed, weights)
    if winograd and not exact and int8_winograd.fits(wq):
        return Int8Constants(int8_winograd.pack_weight(wq), folded, multiplier, epilogue(part, out, residual), za,
                             winograd=True)
    return Int8Constants(packed, folded, multiplier, epilogue(part, out, residual), za, width, exact)


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
                     residual: QuantParams | None = None, out_layout: str = "NCHW",
                     weights: str = "", table: OutputTable | None = None,
                     weight_bits: int | None = None) -> tuple[tvm.tirx.PrimFunc, list]:
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
    weights : str
        The target's :func:`weight_packing`, as in :func:`int8_constants`.
    table : OutputTable, optional
        The elementwise ops after the partition as a table of output codes: the kernel requantizes to ``out``
        (their input's parameters) and writes the table's entry for each code.
    weight_bits : int, optional
        As in :func:`int8_constants`.

    Returns
    -------
    kernel : tvm.tirx.PrimFunc
        Arguments ``(data, weight, bias, multiplier[, table][, residual])``, output last; attrs
        ``tvmfuse.partition``, ``tvmfuse.family`` (``int8_<family>``), ``tvmfuse.layout``, ``tvmfuse.ops``,
        ``op_pattern``.
    constants : list of relax.Constant
        The packed int8 weight, the int32 bias, the float32 multipliers[, the table].

    Raises
    ------
    Int8KernelError
        As :func:`int8_constants`.
    """
    blocked = len(data_shape) == 5 or out_layout != "NCHW"
    if blocked and not blocked_kernel(part):
        raise int8.Int8KernelError(f"{part.composite}: the {part.family} INT8 kernel has no {int8.BLOCKED_LAYOUT} form")
    c = int8_constants(part, x, out, residual, blocked, weights, weight_bits,
                       winograd_candidate(part, data_shape, out_layout, weights))
    epilogue = dataclasses.replace(c.epilogue, table=True) if table is not None else c.epilogue
    channels = c.bias.shape[0]
    out_shape = kernel_out_shape(part, out_layout)
    bias, multiplier = c.bias, c.multiplier
    if out_layout != "NCHW":
        bias, multiplier = _padded(bias, out_shape[1] * out_shape[4]), _padded(multiplier, out_shape[1] * out_shape[4])
    tensors = [te.placeholder(tuple(int(d) for d in data_shape), "uint8", name="data"),
               te.placeholder(c.weight.shape, str(c.weight.dtype), name="weight"),
               te.placeholder(bias.shape, str(bias.dtype), name="bias"),
               te.placeholder(multiplier.shape, "float32", name="multiplier")]
    kwargs = {"out_layout": out_layout} if blocked else {}
    if signed_data(part, weights):
        kwargs["signed_data"] = True
    if table is not None:
        kwargs["table"] = te.placeholder((int8.TABLE_SIZE,), out.dtype, name="table")
        tensors.append(kwargs["table"])
    if c.kernel_width is not None:
        kwargs["kernel_width"] = c.kernel_width
    if c.winograd:
        kwargs["winograd"] = True
    res = None
    if part.residual is not None:
        res = te.placeholder(out_shape, residual.dtype, name="residual")
        tensors.append(res)
    family = families.FAMILIES[part.family]
    compute = families.resolve(family.int8.compute)
    output = compute(*tensors[:4], res, channels=channels, input_zero_point=c.input_zero_point,
                     epilogue=epilogue, **part.conv, **kwargs)
    ops = part.ops + ["requantize" if out is not None else "dequantize"] + (list(table.ops) if table else [])
    described = family.int8.layout if not blocked else \
        f"{'NCHW16c' if len(data_shape) == 5 else 'NCHW'} -> {out_layout}, weight packed for {int8.BLOCKED_LAYOUT}"
    if c.winograd:
        described = f"{out_layout} -> {out_layout}, weight transformed for Winograd F(2x2, 3x3)"
    kernel = mark_exact_pairs(int8.prim_func(tensors + [output]), c.exact_pairs).with_attrs({
        "tvmfuse.partition": part.composite, "tvmfuse.family": families.int8_kernel_name(family),
        "tvmfuse.layout": described, "tvmfuse.ops": ",".join(ops), "op_pattern": OPAQUE})
    constants = [relax.const(c.weight), relax.const(bias), relax.const(multiplier)]
    return kernel, constants + ([relax.const(table.codes)] if table is not None else [])
