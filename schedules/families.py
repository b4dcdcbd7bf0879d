"""The op-family registry: every family tvmfuse fuses, as data in one place.

A family is what a partition is anchored on (conv2d, grouped conv2d, depthwise conv2d, dense, batched
matmul), or an op computed a row at a time by a kernel of its own (:class:`RowFamily`: Softmax,
LayerNorm). A partition family's entry says which Relax op anchors it and what the anchor must satisfy, which pattern-table entries match it and
which epilogues they take, its TE computes (FP32 NCHW, FP32 blocked NCHW[b]c, INT8), and the kernels it
lowers to with, per backend, the rule module that schedules each (``schedules/<backend>/<module>.py``; the
backend's templates, e.g. ``schedules/x86/templates.py``, say which of them are also MetaSchedule templates).

Readers: the pattern table (``tvmfuse.patterns``), the TE computes (:mod:`.computes.partition`), the INT8 kernels
(``tvmfuse.passes.int8.kernels``), the backends and the tuner. Computes and rules are named by string
(``"module.function"`` under ``tvmfuse.schedules``) and imported on first use, so this module imports
nothing of tvmfuse and every layer can read it.

Adding a family: one :class:`Family` entry here, its compute(s), its rule(s). See ``docs/extending.md``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Callable, Mapping

PACKAGE = "tvmfuse.schedules"
# Epilogue activations the fusion patterns know (``tvmfuse.patterns.builders`` spells each as a pattern).
# silu before its sigmoid, hardswish before the HardSigmoid of its x * HardSigmoid(x) spelling
ACTIVATIONS = ("relu", "clip", "hardswish", "hardsigmoid", "leakyrelu", "gelu", "silu", "sigmoid")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel a family lowers to; ``name`` is the kernel's ``tvmfuse.family`` attribute.

    ``rules``: backend name -> rule module in ``schedules/<backend>/``; a backend without an entry gives
    the kernel its fallback schedule. ``int8``: the kernel computes on uint8/int8 codes.
    """

    name: str
    rules: Mapping[str, str] = dataclasses.field(default_factory=dict)
    int8: bool = False


@dataclasses.dataclass(frozen=True)
class Int8:
    """A family's INT8 kernel: its compute, how its weight is packed, the epilogue activations it applies."""

    compute: str  # "module.function": (data, weight, bias, multiplier, residual, *, channels, input_zero_point,
    # epilogue, **conv) -> te.Tensor
    pack: str | None  # "module.function" packing the OIHW / [N, K] int8 weight; None: used as is
    layout: str  # as recorded on the kernel (``tvmfuse.layout``)
    activations: tuple = ("relu", "clip", "hardswish")
    check: Callable | None = None  # anchor call -> why this anchor has no INT8 kernel, or None
    # "module.function" packing the weight for the NCHW16c kernel (uint8 activations blocked by 16 channels,
    # ``compute`` with ``out_layout="NCHW16c"``); None: the family's INT8 kernel reads and writes NCHW only.
    blocked_pack: str | None = None
    # "module.function" packing the weight for the NCHW16c kernel on AVX512-VNNI targets where the layout
    # allows (``passes.int8.kernels.taps_pack``); the compute takes ``kernel_width`` with it. None:
    # ``blocked_pack`` there too.
    vnni_pack: str | None = None
    # The packed weight is made of 16x4 int8 blocks (conv2d, dense), which targets without VNNI take as int16
    # pairs (``computes.int8_ref.to_pairs``; backend ``int8_weights == "pairs"``).
    pairs: bool = False
    # "module.function" packing the weight for the NCHW16c kernel on targets without VNNI (backend
    # ``int8_weights == "pairs"``) where ``vnni_pack``'s layout would apply, as int16 pairs; None: none.
    pairs_pack: str | None = None
    # "module.function" packing the weight as exact float32 codes for the NCHW16c kernel that sums in float on
    # targets without VNNI where a kernel row is wide (``passes.int8.kernels.float_pack``); None: none.
    float_pack: str | None = None
    # "module.function" packing the weight into AMX tiles for targets with ``amx-int8`` (backend
    # ``int8_weights == "amx"``); the family's compute then builds the tile kernel's form. None: the family
    # takes VNNI's packing there.
    amx_pack: str | None = None
    # The kernel repacks its input in a stage of its own whatever the layout (conv2d's NCHW4c ``data_pack``):
    # NCHW data costs it nothing, so no transform is inserted to hand it NCHW16c.
    repacks_input: bool = False
    # Names of the compute's stages that the rules look up: the int32 accumulation and the padded (or packed)
    # input it reads.
    anchor_block: str = ""
    pad_block: str = ""
    # "module.function": the numpy reference the kernel is bit-exact against (tests, the fuzzer)
    reference: str = ""
    # The compute takes ``signed_data`` (its input summed as int8 ``x - 128``, the bias folded to match), which
    # targets whose kernels multiply s8 x s8 ask for (backend ``int8_weights == "signed"``: CUDA's tensor cores).
    signed_data: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
    """One op family.

    Attributes
    ----------
    name : str
    anchor_op : str
        The Relax op the family's partitions are anchored on.
    pattern : str
        The pattern-table family whose entries match this family's anchors (grouped conv2d is matched by
        conv2d's entries; the checks tell the convolutions apart with :func:`family_of`).
    residual : bool
        Whether the pattern entries take a residual add (add-to-output).
    compute : str
        FP32 NCHW compute: ``(call, data, weight, lanes) -> te.Tensor``.
    blocked_compute : str or None
        FP32 NCHW[b]c compute ``(call, data, weight) -> te.Tensor``; None: the family stays NCHW.
    int8 : Int8 or None
        The INT8 kernel; None when the family has none.
    kernels : tuple of Kernel
    anchor_check : callable or None
        anchor call -> why the family's kernels cannot compute it (None: they can).
    activations : tuple of str
        The epilogue activations its pattern entries take (each of :data:`ACTIVATIONS`, or none).
    flops : callable
        anchor call -> 2 x its multiply-adds (reports, rooflines).
    anchor_block : str
        The name of the FP32 NCHW compute's anchor stage (the rules look it up by name).
    layout : str
        The activations' layout as the kernel records it (``tvmfuse.layout``).
    constant_weight : bool
        The pattern entries want a constant second operand (a batched matmul takes any).
    panels : (kind, axis) or None
        How the NCHW kernel may read its weight pre-packed: :mod:`.packing`'s weight kind, and the weight axis
        the panel width must divide (None: as is).
    blocked_weight : str or None
        :mod:`.packing`'s weight kind of the blocked kernel (``conv`` may become ``winograd``).
    blocked_check : callable or None
        anchor call -> why the blocked kernel cannot compute it (None: it can).
    padded_block : bool
        The blocked kernel pads output channels to a whole block (:func:`.computes.partition.out_block`).
    input_like_output : bool
        The blocked kernel reads its input blocked like its output (a depthwise conv).
    grouped : bool
        A grouped conv: narrow groups, regrouping (``RegroupConv``) and group-aligned input blocks apply.
    scales_weight : bool
        A per-input-channel scale before the anchor may be folded into its weight (``schedules/channel_scale``).
    plain_output : bool
        An output without a channel block may be computed blocked from a blocked input and written NCHW
        (:func:`.compute.plain_output_block`).
    """

    name: str
    anchor_op: str
    pattern: str
    residual: bool
    compute: str
    blocked_compute: str | None = None
    int8: Int8 | None = None
    kernels: tuple = ()
    anchor_check: Callable | None = None
    flops: Callable | None = None  # anchor call -> 2 x its multiply-adds
    activations: tuple = ACTIVATIONS
    anchor_block: str = ""
    layout: str = "NCHW"
    constant_weight: bool = True
    panels: tuple | None = None
    blocked_weight: str | None = None
    blocked_check: Callable | None = None
    padded_block: bool = False
    input_like_output: bool = False
    grouped: bool = False
    scales_weight: bool = False
    plain_output: bool = False

    @property
    def matmul(self) -> bool:
        """A matmul family: its weight is ``[K, N]`` (output channels last) and it has no conv attributes."""
        return self.anchor_op == "relax.matmul"

    def fp32_compute(self) -> Callable:
        return resolve(self.compute)

    def blocked(self) -> Callable | None:
        return resolve(self.blocked_compute) if self.blocked_compute else None


def _ints(values) -> tuple[int, ...] | None:
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):  # a symbolic dim
        return None


def static_shape(expr) -> tuple[int, ...] | None:
    """A Relax expression's shape as ints; None when it has no shape or a symbolic dim."""
    shape = getattr(expr.ty, "shape", None)
    return None if shape is None else _ints(shape)


def _conv_layout(call) -> str | None:
    a = call.attrs
    if a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or a.out_layout != "NCHW":
        return f"conv2d layout {a.data_layout}/{a.kernel_layout} not supported"
    return None


def _dense_operands(call) -> str | None:
    if len(static_shape(call.args[0]) or ()) != 2 or len(static_shape(call.args[1]) or ()) != 2:
        return "matmul: only 2-D data x 2-D constant weight is a dense"
    return None


def _batch_operands(call) -> str | None:
    shapes = [static_shape(arg) for arg in call.args[:2]]
    if any(shape is None or len(shape) < 2 for shape in shapes):
        return f"matmul of shapes {shapes[0]} x {shapes[1]}: a batched matmul needs static operands of rank >= 2"
    return None


def is_dense(call) -> bool:
    """A matmul of the dense family: 2-D times 2-D (its pattern also wants the weight constant; a 2-D product
    of two activations stays on TVM's path). Either operand of higher rank: ``batch_matmul``. Decided by rank
    alone, so a partition's anchor, whose weight is a parameter, gets the family its match had."""
    return len(static_shape(call.args[0]) or ()) == 2 and len(static_shape(call.args[1]) or ()) == 2


def depthwise_multiplier(call) -> int:
    """Output channels per input channel of a depthwise conv2d call (1: one filter per channel)."""
    return int(call.args[1].ty.shape[0]) // int(call.args[0].ty.shape[1])


def _depthwise_multiplier_one(call) -> str | None:
    multiplier = depthwise_multiplier(call)
    if multiplier != 1:
        return f"depthwise conv2d with channel multiplier {multiplier} has no INT8 kernel"
    return None


def _conv_flops(call) -> int:
    """OIHW weight: every output element takes (in channels / groups) x kh x kw multiply-adds."""
    out, weight = static_shape(call) or (), static_shape(call.args[1]) or ()
    return 2 * math.prod(out) * math.prod(weight[1:])


def _matmul_flops(call) -> int:
    return 2 * math.prod(static_shape(call) or ()) * (static_shape(call.args[0]) or (0,))[-1]


def _grouped(call) -> str:
    return f"grouped conv2d (groups={int(call.attrs.groups)}) has no INT8 kernel"


def _one_filter_per_channel(call) -> str | None:
    multiplier = depthwise_multiplier(call)
    if multiplier != 1:
        return f"depthwise conv2d with channel multiplier {multiplier} has no blocked kernel"
    return None


WINOGRAD = Kernel("conv2d_winograd", {"x86": "conv2d_winograd"})
DEPTHWISE_CONV2D = Family(
    "depthwise_conv2d", "relax.nn.conv2d", "depthwise_conv2d", residual=True,
    compute="computes.anchors.depthwise_conv2d", blocked_compute="computes.anchors.depthwise_conv2d_blocked",
    int8=Int8("computes.int8_depthwise.depthwise_conv2d_kernel", None, "NCHW, weight OIHW",
              check=_depthwise_multiplier_one, blocked_pack="computes.int8_depthwise.pack_weight",
              vnni_pack="computes.int8_depthwise.pack_weight_vnni",
              pairs_pack="computes.int8_depthwise.pack_weight_pairs",
              float_pack="computes.int8_depthwise.pack_weight_float",
              anchor_block="depthwise_int8", pad_block="data_pad",
              reference="computes.int8_ref.depthwise_conv2d_ref"),
    kernels=(Kernel("depthwise_conv2d", {"x86": "depthwise_conv2d", "cuda": "depthwise_conv2d"}),
             Kernel("depthwise_conv2d_nchwc", {"x86": "depthwise_nchwc"}),
             Kernel("int8_depthwise_conv2d", {"x86": "int8_depthwise", "cuda": "int8"}, int8=True)),
    anchor_check=_conv_layout, flops=_conv_flops, anchor_block="DepthwiseConv2d", blocked_weight="depthwise",
    blocked_check=_one_filter_per_channel, padded_block=True, input_like_output=True)
CONV2D = Family(
    "conv2d", "relax.nn.conv2d", "conv2d", residual=True,
    compute="computes.anchors.conv2d", blocked_compute="computes.anchors.conv2d_blocked",
    int8=Int8("computes.int8_amx.conv2d_kernel", "computes.int8_ref.pack_conv2d_weight", "NCHW, weight OIHW16o4i",
              blocked_pack="computes.int8_ref.pack_conv2d_weight", amx_pack="computes.int8_amx.pack_weight",
              repacks_input=True, anchor_block="conv2d_int8",
              pairs=True, signed_data=True,
              pad_block="data_pack", reference="computes.int8_ref.conv2d_ref"),
    kernels=(Kernel("conv2d", {"x86": "conv2d", "cuda": "conv2d"}), Kernel("conv2d_nchwc", {"x86": "conv2d_nchwc"}),
             WINOGRAD, Kernel("int8_conv2d", {"x86": "int8_conv2d", "cuda": "int8"}, int8=True)),
    anchor_check=_conv_layout, flops=_conv_flops, anchor_block="conv2d_nchw", panels=("oc", 0),
    blocked_weight="conv", padded_block=True, scales_weight=True,
    plain_output=True)
# Matched by conv2d's pattern entries. NCHW: the backend's fallback; blocked (when the blocks divide a
# group's channels, or groups of 4 or 8 share a block: partition.narrow_groups; RegroupConv merges the
# other narrow groups): conv2d's blocked kernel and rule, per group.
GROUP_CONV2D = Family(
    "group_conv2d", "relax.nn.conv2d", "conv2d", residual=True, compute="computes.anchors.group_conv2d",
    blocked_compute="computes.anchors.group_conv2d_blocked", int8=None,
    kernels=(Kernel("group_conv2d", {"cuda": "group_conv2d"}), Kernel("group_conv2d_nchwc", {"x86": "conv2d_nchwc"})),
    anchor_check=_conv_layout, flops=_conv_flops, anchor_block="group_conv2d_nchw", blocked_weight="conv",
    grouped=True)
DENSE = Family(
    "dense", "relax.matmul", "dense", residual=False, compute="computes.anchors.dense",
    int8=Int8("computes.int8.dense_kernel", "computes.int8_ref.pack_dense_weight", "NC, weight NK16n4k",
              anchor_block="dense_int8", pad_block="data_pad", reference="computes.int8_ref.dense_ref", pairs=True,
              signed_data=True),
    kernels=(Kernel("dense", {"x86": "dense", "cuda": "dense"}),
             Kernel("int8_dense", {"x86": "int8_dense", "cuda": "int8"}, int8=True)),
    anchor_check=_dense_operands, flops=_matmul_flops, anchor_block="T_matmul_NN", layout="NC", panels=("panels", 1))
# An operand of rank > 2: attention's products of two activations, or a 3-D constant; FP32, no INT8.
BATCH_MATMUL = Family(
    "batch_matmul", "relax.matmul", "batch_matmul", residual=False, compute="computes.batch_matmul.batch_matmul",
    kernels=(Kernel("batch_matmul", {"x86": "batch_matmul", "cuda": "batch_matmul"}),),
    anchor_check=_batch_operands, flops=_matmul_flops, activations=(), anchor_block="T_batch_matmul",
    constant_weight=False)
# Priority order: the pattern table lists the families whose ``pattern`` is their own name in this order.
FAMILIES: dict[str, Family] = {f.name: f for f in (DEPTHWISE_CONV2D, CONV2D, GROUP_CONV2D, DENSE, BATCH_MATMUL)}

# Kernels that are not a family's: layout transforms and pools of blocked activations at partition borders,
# the ops of squeeze-and-excitation on INT8 codes, and the whole-sequence LSTM/GRU kernels (:mod:`.recurrence`, written scheduled). Their one fixed schedule is
# all there is to them (never tuning tasks).
LAYOUT_TRANSFORM = Kernel("layout_transform", {"x86": "layout"})
POOL_NCHWC = Kernel("pool2d_nchwc", {"x86": "pool"})
RECURRENCE = Kernel("recurrence")
# squeeze-and-excitation's gate and mean on uint8 codes in an INT8 network (:mod:`.int8_se`)
CODES_GATE, CODES_MEAN = Kernel("codes_gate", {"x86": "codes"}), Kernel("codes_mean", {"x86": "codes"})
CODES_CONCAT = Kernel("codes_concat", {"x86": "codes"})  # a channel concat of codes (:mod:`.int8_concat`)
FIXED_KERNELS = {k.name: k for k in (LAYOUT_TRANSFORM, POOL_NCHWC, RECURRENCE, CODES_GATE, CODES_MEAN, CODES_CONCAT)}


@dataclasses.dataclass(frozen=True)
class RowFamily:
    """An op computed a row at a time (each row: all axes but the last; the rows in parallel) by a kernel of
    its own, outside every partition: Softmax, LayerNorm.

    The backend legalizes ``op`` with ``legalize`` (``"module.function"``: ``(bb, call, annotations) -> Relax
    call``, ``annotations`` kernel name -> a template's ``schedule_rule``), which computes it by one of
    ``kernels``, its output stage carrying :data:`ROW_MARK` (the kernel's name) and that kernel's
    annotations. TVM's fusion then folds elementwise neighbours into the kernel and drops the function's
    attributes; the mark on the block is how the kernel is known after that (``schedules.backend.kernel_of``).
    """

    name: str
    op: str
    legalize: str
    kernels: tuple


ROW_MARK = "tvmfuse.row_kernel"
SOFTMAX_KERNEL = Kernel("softmax", {"x86": "softmax"})
LAYER_NORM_KERNEL = Kernel("layer_norm", {"x86": "layer_norm"})
CHANNEL_NORM_KERNEL = Kernel("layer_norm_channels", {"x86": "layer_norm_channels"})
ROW_FAMILIES: dict[str, RowFamily] = {f.name: f for f in (
    RowFamily("softmax", "relax.nn.softmax", "computes.softmax.legalize", (SOFTMAX_KERNEL,)),
    # over the last axis; over the channels of NCHW (ConvNeXt's channels-first LayerNorm)
    RowFamily("layer_norm", "relax.nn.layer_norm", "computes.layer_norm.legalize",
              (LAYER_NORM_KERNEL, CHANNEL_NORM_KERNEL)),
)}
ROW_KERNELS: dict[str, Kernel] = {k.name: k for f in ROW_FAMILIES.values() for k in f.kernels}

ANCHOR_OPS = tuple(dict.fromkeys(f.anchor_op for f in FAMILIES.values()))
PATTERN_FAMILIES = tuple(f.name for f in FAMILIES.values() if f.pattern == f.name)
KERNELS: dict[str, Kernel] = ({k.name: k for f in FAMILIES.values() for k in f.kernels} | FIXED_KERNELS
                              | ROW_KERNELS)


def is_anchor(call) -> bool:
    """Whether ``call`` is a call to an anchor op (of some family)."""
    return getattr(getattr(call, "op", None), "name", None) in ANCHOR_OPS


def family_of(call) -> Family:
    """The family of an anchor call: the one place that decides it.

    conv2d with groups = 1 is ``conv2d``; groups = input channels with one input channel per group is
    ``depthwise_conv2d`` (any channel multiplier); other groupings are ``group_conv2d``; matmul is ``dense``
    when both operands are 2-D, else ``batch_matmul`` (:func:`is_dense`).
    """
    if call.op.name == DENSE.anchor_op:
        return DENSE if is_dense(call) else BATCH_MATMUL
    groups = int(call.attrs.groups)
    if groups == 1:
        return CONV2D
    data, weight = static_shape(call.args[0]), static_shape(call.args[1])
    if data is not None and weight is not None and groups == data[1] and weight[1] == 1:
        return DEPTHWISE_CONV2D
    return GROUP_CONV2D


def int8_family(call) -> tuple[Family | None, str | None]:
    """(family, None) when an INT8 kernel computes anchor ``call``; (None, why not) otherwise."""
    family = family_of(call)
    if family.int8 is None:
        return None, _grouped(call) if family.grouped else f"{family.name} has no INT8 kernel"
    why = family.int8.check(call) if family.int8.check else None
    return (None, why) if why else (family, None)


def kernel(name: str) -> Kernel | None:
    """The registered kernel whose ``tvmfuse.family`` attribute is ``name``."""
    return KERNELS.get(name)


def int8_kernel_name(family: Family) -> str:
    return f"int8_{family.name}"


def resolve(dotted: str):
    """``"module.function"`` under ``tvmfuse.schedules`` -> the function (imported on first use)."""
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(f"{PACKAGE}.{module}"), name)
