"""TE computes shared by all targets: a partition's Relax body interpreted op by op into one TE graph.

The anchor's compute comes from its family (conv2d, depthwise conv2d and dense from ``topi.nn`` or here,
batched matmul from :mod:`.batch_matmul`); the epilogue ops (bias, residual add, activations) become
elementwise stages that the schedules inline into the anchor's output loop.
"""

from __future__ import annotations

import dataclasses
import functools

import tvm
from tvm import relax, te, topi

from . import blocked, families, winograd
from .activations import fast_sigmoid, gelu, gelu_tanh
from .channel_scale import prologue, scaled_weight
from .blocked import out_size
from .common import row_vector

# Block names of the anchor stage, per family (the schedules look them up by name).
ANCHOR_BLOCK = {"conv2d": "conv2d_nchw", "group_conv2d": "group_conv2d_nchw",
                "depthwise_conv2d": "DepthwiseConv2d", "dense": "T_matmul_NN", "batch_matmul": "T_batch_matmul"}
# The even/odd column split of a stride-2 depthwise kernel's padded input.
PHASE_SPLIT = "PhaseSplit"


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _conv2d_packed(data, packed, strides, padding, dilation, out_dtype, wide: int | None = None):
    """NCHW conv2d reading a weight packed by :func:`pack_weight`; same block names as topi's. With ``wide``,
    rows are computed ``wide`` pixels wide from an input padded on the right, then cropped (``Conv2dCrop``,
    inlined into the epilogue by the schedule): see :func:`whole_vector_rows`."""
    n, c, h, w = (int(d) for d in data.shape)
    blocks, _, kh, kw, oc_block = (int(d) for d in packed.shape)
    top, left, bottom, right = padding
    out_h = out_size(h, top, bottom, kh, strides[0], dilation[0])
    out_w = out_size(w, left, right, kw, strides[1], dilation[1])
    extra = (wide - out_w) * strides[1] if wide else 0
    if any(padding) or extra:
        data = topi.nn.pad(data, [0, 0, top, left], [0, 0, bottom, right + extra], name="pad_temp")
    rc, ry, rx = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    conv = te.compute(
        (n, blocks * oc_block, out_h, wide or out_w),
        lambda b, o, y, x: te.sum(
            data[b, rc, y * strides[0] + ry * dilation[0], x * strides[1] + rx * dilation[1]].astype(out_dtype)
            * packed[o // oc_block, rc, ry, rx, o % oc_block].astype(out_dtype), axis=[rc, ry, rx]),
        name="conv2d_nchw")
    if not wide:
        return conv
    return te.compute((n, blocks * oc_block, out_h, out_w), lambda b, o, y, x: conv[b, o, y, x], name="Conv2dCrop")


def whole_vector_rows(out_width: int, lanes: int, short: int) -> int | None:
    """The row width an NCHW conv with pixel vectors computes at: ``out_width`` rounded up to whole vectors
    when its own pixel vectors would be ``short`` (the widest divisor of the row up to a vector, under half a
    vector) and the rounding adds at most a quarter; None keeps the row. 24 -> 12 2x2 on a 321-wide map
    (321 = 3 x 107: 3-pixel vectors) took 5.1-6.7 ms against 1.3-1.4 at 320 wide (Zen 4)."""
    wide = -(-out_width // lanes) * lanes
    if short * 2 >= lanes or wide == out_width or (wide - out_width) * 4 > out_width:
        return None
    return wide


def _depthwise_whole_vectors(data, weight, strides, padding, dilation, lanes: int):
    """Depthwise conv2d whose rows are computed ``lanes`` wide, then cropped.

    A 7- or 14-wide row makes every tap's load an assembly of 4 instructions (measured: 25 FMAs, ~100
    shuffles per 5x5 row); padding the input on the right by the missing columns lets each tap be one full
    vector load. The crop stage is inlined into the epilogue by the schedule.
    """
    n, c, h, w = (int(d) for d in data.shape)
    out_channels, _, kh, kw = (int(d) for d in weight.shape)
    multiplier = out_channels // c
    top, left, bottom, right = padding
    out_h = out_size(h, top, bottom, kh, strides[0], dilation[0])
    out_w = out_size(w, left, right, kw, strides[1], dilation[1])
    wide = -(-out_w // lanes) * lanes
    padded = topi.nn.pad(data, [0, 0, top, left], [0, 0, bottom, right + (wide - out_w) * strides[1]],
                         name="PaddedInput")
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    conv = te.compute(
        (n, out_channels, out_h, wide),
        lambda b, o, y, x: te.sum(
            padded[b, o // multiplier, y * strides[0] + ry * dilation[0], x * strides[1] + rx * dilation[1]]
            * weight[o, 0, ry, rx], axis=[ry, rx]),
        name="DepthwiseConv2d")
    return te.compute((n, out_channels, out_h, out_w), lambda b, o, y, x: conv[b, o, y, x], name="DepthwiseCrop")


def phase_split_pays(stride: int, dilation: int, out_width: int, kernel: int) -> bool:
    """Whether a depthwise kernel reads its input phase-split (:func:`_depthwise_phase_split`).

    Stride 2, dilation 1 only. Measured on MobileNetV2 / EfficientNet-Lite0 (AVX2, 1 thread): 1.3-2.4x
    faster from 28-wide outputs up and for 5x5 windows; with a 3x3 window over 14-wide outputs it was
    0.9-1.4x, over 7-wide ones 0.7x (the split's fixed cost per channel plane outweighs its 9 taps).
    """
    return stride == 2 and dilation == 1 and (out_width >= 28 or kernel >= 5)


def _depthwise_phase_split(data, weight, strides, padding, dilation, lanes: int | None):
    """Depthwise conv2d with horizontal stride 2 that reads the padded input split into even/odd columns.

    Vectorized along output width, a stride-2 tap reads columns ``2x + rx``: two vector loads and a
    de-interleave per tap (measured 4-7 GFLOPS on MobileNetV2's stride-2 layers, against ~70 for stride
    1). ``PhaseSplit[b, c, y, p, x] = PaddedInput[b, c, y, 2x + p]`` pays the de-interleave once per input
    element; tap ``rx`` then reads phase ``rx % 2`` at offset ``x + rx // 2``, one contiguous vector load
    once the window is unrolled. Rows are computed in whole vectors of ``lanes`` (see
    :func:`_depthwise_whole_vectors`) when given.
    """
    n, c, h, w = (int(d) for d in data.shape)
    out_channels, _, kh, kw = (int(d) for d in weight.shape)
    multiplier = out_channels // c
    top, left, bottom, right = padding
    out_h = out_size(h, top, bottom, kh, strides[0], dilation[0])
    out_w = out_size(w, left, right, kw, 2, 1)
    wide = -(-out_w // lanes) * lanes if lanes else out_w
    # Half-width columns: tap kw - 1 of output wide - 1 reads phase x index wide - 1 + (kw - 1) // 2.
    half = wide + kw // 2
    padded = topi.nn.pad(data, [0, 0, top, left], [0, 0, bottom, 2 * half - w - left], name="PaddedInput")
    split = te.compute((n, c, h + top + bottom, 2, half), lambda b, ch, y, p, x: padded[b, ch, y, 2 * x + p],
                       name=PHASE_SPLIT)
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    conv = te.compute(
        (n, out_channels, out_h, wide),
        lambda b, o, y, x: te.sum(
            split[b, o // multiplier, y * strides[0] + ry * dilation[0], rx % 2, x + rx // 2] * weight[o, 0, ry, rx],
            axis=[ry, rx]),
        name="DepthwiseConv2d")
    if wide == out_w:
        return conv
    return te.compute((n, out_channels, out_h, out_w), lambda b, o, y, x: conv[b, o, y, x], name="DepthwiseCrop")


def _conv_args(call) -> tuple[list[int], list[int], list[int]]:
    a = call.attrs
    return _ints(a.strides), _ints(a.padding), _ints(a.dilation)


def conv2d(call, data, weight, lanes: int | None = None):
    """groups = 1 conv2d; a 5-D weight is packed by :func:`blocked.pack_weight` (see ``partition_compute``).
    With ``lanes`` and a channel count no vector divides (so the kernel's vectors run along rows), rows
    whose pixel vectors (:func:`common.row_vector`) would be short are computed in whole vectors, then
    cropped (:func:`whole_vector_rows`)."""
    if len(weight.shape) == 5:
        out_channels, out_width = int(call.ty.shape[1]), int(call.ty.shape[3])
        wide = whole_vector_rows(out_width, lanes, row_vector(out_width, lanes)) \
            if lanes and out_channels % lanes else None
        return _conv2d_packed(data, weight, *_conv_args(call), call.ty.dtype, wide)
    return topi.nn.conv2d_nchw(data, weight, *_conv_args(call))


def depthwise_conv2d(call, data, weight, lanes: int | None = None):
    """Depthwise conv2d; rows computed in whole vectors of ``lanes`` where that pays (see the helpers). Without
    ``lanes`` (a backend with no vectors: CUDA, where a thread computes a strip of outputs from a tile in shared
    memory) topi's plain form: padding, then the window."""
    strides, padding, dilation = _conv_args(call)
    if lanes and phase_split_pays(strides[1], dilation[1], int(call.ty.shape[3]), int(weight.shape[3])):
        return _depthwise_phase_split(data, weight, strides, padding, dilation, lanes)
    if lanes and int(call.ty.shape[3]) % lanes:
        return _depthwise_whole_vectors(data, weight, strides, padding, dilation, lanes)
    # Relax weight (C*M, 1, kh, kw) -> topi's depthwise filter (C, M, kh, kw).
    in_channels = int(data.shape[1])
    multiplier = int(weight.shape[0]) // in_channels
    filt = topi.reshape(weight, (in_channels, multiplier, int(weight.shape[2]), int(weight.shape[3])))
    return topi.nn.depthwise_conv2d_nchw(data, filt, strides, padding, dilation)


def group_conv2d(call, data, weight, lanes: int | None = None):
    del lanes
    return topi.nn.group_conv2d_nchw(data, weight, *_conv_args(call), int(call.attrs.groups))


def dense(call, data, weight, lanes: int | None = None):
    """``data[M, K] x weight[K, N]``; a 3-D weight is packed ``[N/n_block, K, n_block]``
    (:func:`blocked.pack_dense_weight`). Both name the product ``T_matmul_NN``, as topi does."""
    del lanes
    if len(weight.shape) == 2:
        return topi.nn.matmul(data, weight)
    (m, k), (panels, _, n_block) = ([int(d) for d in data.shape], [int(d) for d in weight.shape])
    r = te.reduce_axis((0, k), name="k")
    return te.compute((m, panels * n_block), lambda i, j: te.sum(data[i, r] * weight[j // n_block, r, j % n_block],
                                                                  axis=r), name="T_matmul_NN", tag="matmul")


def conv2d_blocked(call, data, weight):
    """NCHW[b]c conv2d; a 5-D weight packed by ``winograd.pack_weight`` selects Winograd (``_blocked_layout``)."""
    if len(weight.shape) == 5:
        return winograd.conv2d(data, weight, call.ty.dtype)
    return blocked.conv2d(data, weight, *_conv_args(call), call.ty.dtype)


def group_conv2d_blocked(call, data, weight):
    """NCHW[b]c grouped conv2d whose blocks divide a group's channels (see :func:`blockable`)."""
    return blocked.conv2d(data, weight, *_conv_args(call), call.ty.dtype, groups=int(call.attrs.groups))


def depthwise_conv2d_blocked(call, data, weight):
    return blocked.depthwise_conv2d(data, weight, *_conv_args(call))


def _clip(call, x):
    lo, hi = (float(v.value) for v in call.args[1:3])
    return topi.clip(x, lo, hi)


def _leakyrelu(call, x):
    return topi.nn.leaky_relu(x, float(call.attrs.alpha))


# The ops a partition may hold beside its anchor (whose compute comes from its family): its epilogue, and the
# permute_dims a batched matmul reads its second operand through.
TE_OPS = {
    "relax.add": lambda call, a, b: topi.add(a, b),
    "relax.subtract": lambda call, a, b: topi.subtract(a, b),
    "relax.multiply": lambda call, a, b: topi.multiply(a, b),
    "relax.divide": lambda call, a, b: topi.divide(a, b),
    "relax.nn.relu": lambda call, x: topi.nn.relu(x),
    "relax.clip": _clip,
    "relax.nn.leakyrelu": _leakyrelu,
    "relax.sigmoid": lambda call, x: fast_sigmoid(x),
    # TVM's erf is a scalar libm call per element; fast_erf is a vectorizable rational polynomial (float32:
    # at most 4.2e-7 absolute error over [-6, 6], measured against scipy's erf in float64; exact beyond).
    "relax.erf": lambda call, x: topi.fast_erf(x),
    "relax.tanh": lambda call, x: topi.fast_tanh(x),
    "relax.nn.gelu": lambda call, x: gelu(x),
    "relax.nn.gelu_tanh": lambda call, x: gelu_tanh(x),
    # a batched matmul's operand read transposed (its stage is named batch_matmul.TRANSPOSE)
    "relax.permute_dims": lambda call, x: topi.transpose(x, None if call.attrs.axes is None else _ints(call.attrs.axes)),
}


@dataclasses.dataclass
class PartitionCompute:
    """The TE graph of one partition."""

    inputs: list  # te placeholders, one per composite parameter, in parameter order
    output: te.Tensor
    family: str  # conv2d | group_conv2d | depthwise_conv2d | dense, or conv2d_nchwc | conv2d_winograd |
    # depthwise_conv2d_nchwc (blocked)
    ops: list[str]  # Relax ops covered, in order
    layout: blocked.KernelLayout  # how parameters and output differ from the partition function's

    @property
    def packed(self) -> dict:
        """Parameter index -> oc_block of a weight read packed by :func:`pack_weight` (NCHW kernels)."""
        return self.layout.packed

    def prim_func(self) -> tvm.tirx.PrimFunc:
        return te.create_prim_func(self.inputs + [self.output]).without_attr("global_symbol")


def anchor_call(fn: relax.Function):
    """The anchor call (conv2d or matmul, see :mod:`.families`) of a partition function."""
    for block in fn.body.blocks:
        for binding in block.bindings:
            if families.is_anchor(binding.value):
                return binding.value
    return None


def param_index(fn: relax.Function, var) -> int | None:
    """The position of ``var`` among ``fn``'s parameters (None when it is not one)."""
    found = [i for i, p in enumerate(fn.params) if p.same_as(var)]
    return found[0] if found else None


def data_param(fn: relax.Function, anchor) -> int | None:
    """The parameter index of the anchor's data: its own parameter, or ``x`` of a channel-scale prologue."""
    index = param_index(fn, anchor.args[0])
    found = prologue(fn, anchor) if index is None else None
    return found[1] if found else index


def blockable(fn: relax.Function, lanes: int) -> bool:
    """Whether the partition can run in NCHW[b]c (:mod:`blocked`): a family with a blocked compute (conv2d,
    multiplier-1 depthwise conv2d) and a parameter weight, whose output channels have a block."""
    anchor = anchor_call(fn)
    if anchor is None or not isinstance(anchor.args[1], relax.Var):
        return False
    family = families.family_of(anchor)
    if family.blocked() is None or (family.name == "depthwise_conv2d" and families.depthwise_multiplier(anchor) != 1):
        return False
    out_channels = int(anchor.ty.shape[1])
    block = blocked.block_for(out_channels, lanes)
    if family.name == "group_conv2d" and block is not None and (out_channels // int(anchor.attrs.groups)) % block \
            and narrow_groups(anchor, lanes) is None:
        return False  # an output block would span two groups
    return block is not None and isinstance(anchor.args[0], relax.Var)


def narrow_groups(call, lanes: int | None) -> int | None:
    """The channels per group ``g`` of a grouped conv ``call`` that the blocked kernel runs on its true groups
    (:func:`blocked.conv2d`'s narrow groups, a shuffle step per input channel): ``g`` input and ``g`` output
    channels per group, ``g`` one of :data:`blocked.NARROW_GROUPS`, fewer than and dividing the channel block.
    None for every other conv, and without ``lanes`` (NCHW kernels)."""
    if lanes is None or families.family_of(call).name != "group_conv2d":
        return None
    groups, in_channels, out_channels = int(call.attrs.groups), int(call.args[0].ty.shape[1]), int(call.ty.shape[1])
    group = out_channels // groups
    block = blocked.block_for(out_channels, lanes)
    if block is None or group not in blocked.NARROW_GROUPS or in_channels != out_channels or block % group \
            or group >= block:
        return None
    return group


def group_input_block(anchor, block: int | None) -> bool:
    """Whether a conv ``anchor`` can read its data in NCHW[block]c: always for groups 1, and for a grouped
    conv when the block divides a group's input channels."""
    if block is None or families.family_of(anchor).name != "group_conv2d":
        return block is not None
    return (int(anchor.args[0].ty.shape[1]) // int(anchor.attrs.groups)) % block == 0


def winograd_pays(call, lanes: int | None) -> bool:
    a = call.attrs
    weight = _ints(call.args[1].ty.shape)
    floats = all(str(t.dtype) == "float32" for t in (call.ty, call.args[0].ty, call.args[1].ty))
    return floats and str(a.data_layout) == "NCHW" and str(a.kernel_layout) == "OIHW" and winograd.pays(
        weight[1], weight[0], weight[2:], _ints(a.strides), _ints(a.dilation), _ints(a.padding), int(a.groups),
        lanes)


def _blocked_layout(fn, anchor, blocks: dict, lanes: int) -> blocked.KernelLayout:
    out_block = blocked.block_for(int(anchor.ty.shape[1]), lanes)
    data, weight = data_param(fn, anchor), param_index(fn, anchor.args[1])
    group = narrow_groups(anchor, lanes)
    if group is not None:
        if blocks.get(data) != out_block:
            raise ValueError("a narrow-group conv needs its input blocked like its output")
        packing = ("conv", group, out_block)
    elif families.family_of(anchor).name in ("conv2d", "group_conv2d"):
        kind = "winograd" if data in blocks and winograd_pays(anchor, lanes) else "conv"
        packing = (kind, blocks.get(data, 1), out_block)
    else:
        if blocks.get(data) != out_block:
            raise ValueError("a blocked depthwise kernel needs its input blocked like its output")
        packing = ("depthwise", out_block)
    return blocked.KernelLayout({weight: packing}, blocks, out_block)


def _blocked_epilogue(out_block: int) -> dict:
    """TE_OPS for a blocked kernel: epilogue operands seen blocked."""

    def epilogue(op):
        return lambda call, *args: op(call, *[blocked.blocked_view(a, out_block) for a in args])

    return {name: epilogue(op) for name, op in TE_OPS.items()}


def _kernel_name(family: families.Family, layout: blocked.KernelLayout) -> str:
    """The kernel's ``tvmfuse.family``: the family's name, ``_nchwc`` when blocked, or ``conv2d_winograd``."""
    if any(kind == "winograd" for kind, *_ in layout.weights.values()):
        return "conv2d_winograd"
    return family.name + ("_nchwc" if layout.blocked else "")


def partition_compute(fn: relax.Function, oc_block: int | None = None, lanes: int | None = None,
                      blocks: dict | None = None) -> PartitionCompute:
    """Interpret a composite function's body with TE (parameters become placeholders).

    The anchor is computed by its family's compute (:mod:`.families`), the epilogue by :data:`TE_OPS`.
    NCHW (``blocks`` None): with ``oc_block``, a conv2d of family conv2d reads its weight parameter packed by
    :func:`pack_weight`, a dense its weight in panels of ``oc_block`` columns (:func:`blocked.pack_dense_weight`);
    with ``lanes``, depthwise rows are computed in whole vectors of that many elements.
    Blocked (``blocks``: parameter index -> block of each activation passed NCHW[b]c, see :func:`blockable`):
    the kernel writes NCHW[b]c with ``b = blocked.block_for(out channels, lanes)``.
    """
    anchor = anchor_call(fn)
    family = families.family_of(anchor) if anchor is not None else None
    if blocks is not None:
        layout = _blocked_layout(fn, anchor, blocks, lanes)
        te_ops, anchor_compute = _blocked_epilogue(layout.out_block), family.blocked()
    else:
        layout = blocked.KernelLayout()
        weight = param_index(fn, anchor.args[1]) if anchor is not None else None
        if oc_block and weight is not None and family.name == "conv2d" and \
                int(anchor.args[1].ty.shape[0]) % oc_block == 0:
            layout.weights[weight] = ("oc", oc_block)
        if oc_block and weight is not None and family.name == "dense" and \
                int(anchor.args[1].ty.shape[1]) % oc_block == 0:
            layout.weights[weight] = ("dense", oc_block)
        te_ops = TE_OPS
        anchor_compute = functools.partial(family.fp32_compute(), lanes=lanes) if family is not None else None
    env, inputs = {}, []
    for i, p in enumerate(fn.params):
        t = te.placeholder(layout.shape(i, _ints(p.ty.shape)), p.ty.dtype, name=f"p{i}")
        env[p] = t
        inputs.append(t)
    ops = []
    scaled = prologue(fn, anchor) if blocks is not None and anchor is not None else None
    for block in fn.body.blocks:
        for binding in block.bindings:
            call = binding.value
            name = call.op.name
            compute = anchor_compute if call.same_as(anchor) else te_ops.get(name)
            if compute is None:
                raise NotImplementedError(f"no TE compute for {name} in partition")
            args = [env[a] for a in call.args if isinstance(a, relax.Var)]
            if scaled is not None and binding.var.same_as(scaled[0]):
                env[binding.var] = env[fn.params[scaled[1]]]  # the conv reads x; its weight takes the scale
            elif scaled is not None and call.same_as(anchor):
                env[binding.var] = compute(call, args[0], scaled_weight(args[1], env[fn.params[scaled[2]]]))
            else:
                env[binding.var] = compute(call, *args)
            ops.append(name.replace("relax.nn.", "").replace("relax.", ""))
    kernel = _kernel_name(family, layout) if family is not None else "unknown"
    return PartitionCompute(inputs, env[fn.body.body], kernel, ops, layout)
