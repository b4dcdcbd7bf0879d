"""TE computes shared by all targets: a partition's Relax body interpreted op by op into one TE graph.

The anchor's compute comes from its family (conv2d, depthwise conv2d and dense from :mod:`.anchors`,
batched matmul from :mod:`.batch_matmul`); the epilogue ops (bias, residual add, activations) become
elementwise stages that the schedules inline into the anchor's output loop.
"""

from __future__ import annotations

import dataclasses
import functools

import tvm
from tvm import relax, te, topi

from .. import families
from . import blocked, packing, winograd
from .activations import fast_sigmoid, gelu, gelu_tanh
from .anchors import ints as _ints
from .channel_scale import prologue, scaled_weight

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
    layout: packing.KernelLayout  # how parameters and output differ from the partition function's

    @property
    def packed(self) -> dict:
        """Parameter index -> oc_block of a weight read packed by :func:`pack_weight` (NCHW kernels)."""
        return self.layout.packed

    def prim_func(self) -> tvm.tirx.PrimFunc:
        func = te.create_prim_func(self.inputs + [self.output]).without_attr("global_symbol")
        return _inline_widening(func) if any(str(t.dtype) == "float16" for t in self.inputs) else func


# Stage name of an operand widened to the accumulator's type (float16 kernels: see :func:`_widened`)
WIDEN = "widen_fp32"
ACCUMULATOR = "float32"  # of every float16 kernel: its products are summed, and its epilogue applied, in float32


def _inline_widening(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with its operand-widening stages inlined into their readers: one kernel reads float16 and
    computes in float32, with no float32 copy of an operand in memory."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    widening = [n for n in names if n.startswith(WIDEN)]
    for name in widening:
        sch.compute_inline(sch.get_sblock(name))
    return sch.mod["main"] if widening else func


def _widen(t: te.Tensor) -> te.Tensor:
    if str(t.dtype) != "float16":
        return t
    return te.compute(t.shape, lambda *i: t(*i).astype(ACCUMULATOR), name=WIDEN, tag=topi.tag.ELEMWISE)


def _widened(ops: dict) -> dict:
    """TE_OPS of a float16 kernel: the epilogue applied in float32 to the accumulator, its float16 operands
    (bias, residual) read widened."""
    return {name: (lambda op: lambda call, *args: op(call, *[_widen(a) for a in args]))(op)
            for name, op in ops.items()}


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
    multiplier-1 depthwise conv2d) and a parameter weight, whose output channels have a block (a padded one,
    :func:`blocked.padded_block`, for conv2d and depthwise)."""
    anchor = anchor_call(fn)
    if anchor is None or not isinstance(anchor.args[1], relax.Var):
        return False
    family = families.family_of(anchor)
    if family.blocked() is None or (family.blocked_check and family.blocked_check(anchor)):
        return False
    out_channels = int(anchor.ty.shape[1])
    block = out_block(anchor, lanes)
    if family.grouped and block is not None and (out_channels // int(anchor.attrs.groups)) % block \
            and narrow_groups(anchor, lanes) is None:
        return False  # an output block would span two groups
    return block is not None and isinstance(anchor.args[0], relax.Var)


def out_block(call, lanes: int) -> int | None:
    """The output block of a blocked kernel: :func:`blocked.block_for`; for conv2d and depthwise a padded block
    too (:func:`blocked.padded_block`), but not on a 1x1 map: a squeeze-and-excitation conv is a matrix-vector
    product, which the NCHW kernel runs with no padded work (PP-OCR's classifiers with their 88 -> 22 and
    200 -> 50 convs padded read 1.013-1.015x the model's time, Zen 4, interleaved: within this VM's noise)."""
    _, channels, h, w = _ints(call.ty.shape)
    if families.family_of(call).padded_block and h * w > 1:
        return blocked.channel_block(channels, lanes)
    return blocked.block_for(channels, lanes)


def plain_output_block(call, lanes: int | None) -> int | None:
    """The channel block a groups-1 conv2d ``call`` whose output channels have no block
    (:func:`blocked.block_for`) computes in when its input is already NCHW[b]c: output channels padded to whole
    blocks (zero weights), the padding dropped on the store (:func:`blocked.plain_crop`). The block that pads
    least (the wider on a tie). None where the NCHW kernel after a ``to_plain`` of its input stays:

    - the padding costs ``pad x kh x kw`` multiply-adds per input channel and pixel, the ``to_plain`` it saves
      about 8 of them (one element moved costs ~80 ps, 8 x 2 FLOPs at ~200 GFLOP/s), so at most 8;
    - a conv that widens its channels (fewer inputs than outputs) has short reductions between the
      transposing stores of its tiles, and the NCHW kernel's pixel vectors run at full speed on it.

    Measured on Zen 4 (x86-avx512, 2 threads, kernel alone against ``to_plain`` + NCHW kernel): layout_cdla's
    128 -> 42 1x1 at 100x76 0.47-0.50x, PP-OCRv5 det's 48 -> 12 / 192 -> 42 1x1 0.73-0.81x / 0.78-0.91x,
    16 -> 4 at 320x320 0.73-0.79x, 256 -> 21 at 20x20 0.61x, 96 -> 18 at 80x80 0.98-1.03x; not taken: 24 -> 12
    2x2 (pad x 4 taps = 16) 0.96-1.02x, 480 -> 60 1x3 on 1x40 (12) 0.94-1.36x, ShuffleNet's 24 -> 58 1x1 at 56x56
    1.13x."""
    if lanes is None or not families.family_of(call).plain_output or out_block(call, lanes) is not None:
        return None
    out_channels, in_channels, kh, kw = _ints(call.args[1].ty.shape)
    block, padded = blocked.least_padding_block(out_channels, lanes)
    if (padded - out_channels) * kh * kw > 8 or in_channels < out_channels:
        return None
    return block


def narrow_groups(call, lanes: int | None) -> int | None:
    """The channels per group ``g`` of a grouped conv ``call`` that the blocked kernel runs on its true groups
    (:func:`blocked.conv2d`'s narrow groups, a shuffle step per input channel): ``g`` input and ``g`` output
    channels per group, ``g`` one of :data:`blocked.NARROW_GROUPS`, fewer than and dividing the channel block.
    None for every other conv, and without ``lanes`` (NCHW kernels)."""
    if lanes is None or not families.family_of(call).grouped:
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
    if block is None or not families.family_of(anchor).grouped:
        return block is not None
    return (int(anchor.args[0].ty.shape[1]) // int(anchor.attrs.groups)) % block == 0


def winograd_pays(call) -> bool:
    a = call.attrs
    weight = _ints(call.args[1].ty.shape)
    floats = all(str(t.dtype) == "float32" for t in (call.ty, call.args[0].ty, call.args[1].ty))
    return floats and str(a.data_layout) == "NCHW" and str(a.kernel_layout) == "OIHW" and winograd.pays(
        weight[1], weight[0], weight[2:], _ints(a.strides), _ints(a.dilation), _ints(a.padding), int(a.groups))


def _blocked_layout(fn, anchor, blocks: dict, lanes: int) -> packing.KernelLayout:
    block = out_block(anchor, lanes)
    data, weight = data_param(fn, anchor), param_index(fn, anchor.args[1])
    if block is None:  # a conv written NCHW from its blocked input (see plain_output_block)
        block = plain_output_block(anchor, lanes)
        if block is None or data not in blocks:
            raise ValueError("only a conv2d that plain_output_block takes, reading its input blocked, writes NCHW")
        return packing.KernelLayout({weight: ("conv", blocks[data], block)}, blocks, block, plain_out=True)
    padded = int(anchor.ty.shape[1]) % block or (data in blocks and int(anchor.args[0].ty.shape[1]) % blocks[data])
    group = narrow_groups(anchor, lanes)
    if group is not None:
        if blocks.get(data) != block:
            raise ValueError("a narrow-group conv needs its input blocked like its output")
        pack = ("conv", group, block)
    elif families.family_of(anchor).blocked_weight == "conv":
        pack = ("conv", blocks.get(data, 1), block)
        if data in blocks and not padded and winograd_pays(anchor):
            n, out_channels, h, w = _ints(anchor.ty.shape)
            in_channels = int(anchor.args[0].ty.shape[1])
            pack = ("winograd", blocks[data], block, winograd.tile_for(n, h, w, in_channels, out_channels))
    else:
        if blocks.get(data) != block:
            raise ValueError("a blocked depthwise kernel needs its input blocked like its output")
        pack = ("depthwise", block)
    return packing.KernelLayout({weight: pack}, blocks, block)


def _blocked_epilogue(out_block: int) -> dict:
    """TE_OPS for a blocked kernel: epilogue operands seen blocked."""

    def epilogue(op):
        return lambda call, *args: op(call, *[blocked.blocked_view(a, out_block) for a in args])

    return {name: epilogue(op) for name, op in TE_OPS.items()}


def _cropped(anchor_compute, channels: int):
    """``anchor_compute`` (a blocked conv) written NCHW with ``channels`` channels (:func:`blocked.plain_crop`)."""
    return lambda call, *args: blocked.plain_crop(anchor_compute(call, *args), channels)


def _kernel_name(family: families.Family, layout: packing.KernelLayout) -> str:
    """The kernel's ``tvmfuse.family``: the family's name, ``_nchwc`` when blocked, or ``conv2d_winograd``."""
    if any(kind == "winograd" for kind, *_ in layout.weights.values()):
        return families.WINOGRAD.name
    return family.name + ("_nchwc" if layout.blocked else "")


def partition_compute(fn: relax.Function, oc_block: int | None = None, lanes: int | None = None,
                      blocks: dict | None = None) -> PartitionCompute:
    """Interpret a composite function's body with TE (parameters become placeholders).

    The anchor is computed by its family's compute (:mod:`.families`), the epilogue by :data:`TE_OPS`.
    NCHW (``blocks`` None): with ``oc_block``, a conv2d of family conv2d reads its weight parameter packed by
    :func:`pack_weight`, a dense its weight in panels of ``oc_block`` columns (:func:`packing.pack_dense_weight`);
    with ``lanes``, depthwise rows are computed in whole vectors of that many elements.
    Blocked (``blocks``: parameter index -> block of each activation passed NCHW[b]c, see :func:`blockable`):
    the kernel writes NCHW[b]c with ``b = blocked.block_for(out channels, lanes)``; a conv whose output channels
    have none computes in :func:`plain_output_block`'s block and writes NCHW.
    """
    anchor = anchor_call(fn)
    family = families.family_of(anchor) if anchor is not None else None
    if blocks is not None:
        layout = _blocked_layout(fn, anchor, blocks, lanes)
        te_ops, anchor_compute = _blocked_epilogue(layout.out_block), family.blocked()
        if layout.plain_out:  # cropped to NCHW right after the anchor: the epilogue runs on NCHW operands
            te_ops, anchor_compute = TE_OPS, _cropped(anchor_compute, int(anchor.ty.shape[1]))
    else:
        layout = packing.KernelLayout()
        weight = param_index(fn, anchor.args[1]) if anchor is not None else None
        if oc_block and weight is not None and family.panels is not None and \
                int(anchor.args[1].ty.shape[family.panels[1]]) % oc_block == 0:
            layout.weights[weight] = (family.panels[0], oc_block)
        te_ops = TE_OPS
        anchor_compute = functools.partial(family.fp32_compute(), lanes=lanes) if family is not None else None
        if anchor is not None and str(anchor.ty.dtype) == "float16":  # float16 operands, float32 accumulation
            te_ops = _widened(TE_OPS)
            anchor_compute = functools.partial(family.fp32_compute(), lanes=lanes, out_dtype=ACCUMULATOR)
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
    out = env[fn.body.body]
    if str(out.dtype) != str(fn.ret_ty.dtype):  # a float16 kernel rounds once, at its store
        out = topi.cast(out, str(fn.ret_ty.dtype))
    if layout.blocked and not layout.plain_out and int(anchor.ty.shape[1]) % layout.out_block:
        out = blocked.zero_padding(out, int(anchor.ty.shape[1]))  # a padded block: zeros in its padded lanes
    return PartitionCompute(inputs, out, kernel, ops, layout)
