"""TE computes for the blocked channel layout NCHW[b]c (activations ``[N, C/b, H, W, b]``).

With ``b`` the target's float32 vector width, the ``b`` channels of one pixel are one vector: a conv2d
output tile is stored with whole-vector stores straight from its accumulators, a depthwise tap is one
vector load whatever the stride or row width, and a 1x1 conv's input channels are read in cache-line
runs. MKL-DNN and TVM's old x86 conv2d used the same layout.

- Weights are packed once at compile time: conv2d ``OIHW -> [O/bo, I/bi, kh, kw, bi, bo]`` (``bi = 1``
  when the kernel reads NCHW input, e.g. the stem), depthwise ``[C, 1, kh, kw] -> [C/b, kh, kw, b]``.
- Epilogue operands in NCHW (bias ``(1, C, 1, 1)``, a residual left NCHW) are read through inlined
  views, so the epilogue ops of the partition body apply unchanged.
- :func:`to_blocked` / :func:`to_plain` are the layout transforms the lowering inserts at partition
  boundaries where a plain NCHW tensor is needed.
- :func:`pool2d`: max/average pooling of a blocked activation stays blocked (no transform before it, and
  the conv after it reads it blocked); :func:`spatial_mean` (global average pooling) reads it blocked and
  writes the small NCHW result, so the last feature map is never transformed.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx, topi

from . import winograd

CONV_ANCHOR = "conv2d_NCHWc"
DEPTHWISE_ANCHOR = "DepthwiseConv2d_NCHWc"
TO_BLOCKED = "to_blocked"
TO_PLAIN = "to_plain"
SUBSAMPLE = "subsample"  # the gathered input of a strided 1x1 conv
CHANNEL_SHUFFLE = "channel_shuffle_nchwc"
PLAIN_CROP = "plain_crop"  # a conv computed in NCHW[b]c with padded channels, written NCHW (see plain_crop)
POOL_ANCHORS = {"max": "pool_max", "avg": "pool_sum"}  # topi.nn.pool2d's reduction block, per pool type
SPATIAL_SUM = "spatial_sum"
NARROW_GROUP = "tvmfuse.narrow_group"  # the anchor annotation of a narrow-group conv: channels per group
# Channels per group of the narrow-group convs the blocked kernel runs. Groups of 2 do not tensorize: TVM's
# comparison of the step's description with the kernel's block fails for ``i // 2 * 2 + k`` (TVM 0.27).
NARROW_GROUPS = (4, 8)


def block_for(channels: int, lanes: int) -> int | None:
    """The channel block of a ``channels``-channel activation: a whole vector, or 8 (half a 512-bit
    vector) when ``channels`` is not a multiple of the vector width; None keeps the tensor NCHW."""
    for block in (lanes, 8):
        if block <= lanes and channels % block == 0:
            return block
    return None


def blocked_shape(shape, block: int) -> list[int]:
    n, c, h, w = (int(d) for d in shape)
    return [n, c // block, h, w, block]


def pack_weight(weight: np.ndarray, oc_block: int) -> np.ndarray:
    """OIHW -> [O/oc_block, I, H, W, oc_block] (the NCHW conv2d kernel's weight): the oc_block weights of one
    step are contiguous."""
    o, i, h, w = weight.shape
    return weight.reshape(o // oc_block, oc_block, i, h, w).transpose(0, 2, 3, 4, 1).copy()


def unpack_weight(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_weight`."""
    blocks, i, h, w, oc_block = packed.shape
    return packed.transpose(0, 4, 1, 2, 3).reshape(blocks * oc_block, i, h, w)


def pack_conv_weight(weight: np.ndarray, in_block: int, out_block: int) -> np.ndarray:
    """OIHW -> ``[O/out_block, I/in_block, kh, kw, in_block, out_block]``; output channels that do not fill the
    last block are padded with zero weights (a conv written NCHW through :func:`plain_crop`)."""
    o = weight.shape[0]
    if o % out_block:
        weight = np.concatenate([weight, np.zeros((-o % out_block, *weight.shape[1:]), weight.dtype)])
    o, i, h, w = weight.shape
    return np.ascontiguousarray(
        weight.reshape(o // out_block, out_block, i // in_block, in_block, h, w).transpose(0, 2, 4, 5, 3, 1))


def unpack_conv_weight(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_conv_weight`."""
    ob, ib, h, w, bi, bo = packed.shape
    return packed.transpose(0, 5, 1, 4, 2, 3).reshape(ob * bo, ib * bi, h, w)


def pack_dense_weight(weight: np.ndarray, n_block: int) -> np.ndarray:
    """A dense's ``[K, N]`` weight -> ``[N/n_block, K, n_block]``: the panel of one column tile is contiguous."""
    k, n = weight.shape
    return np.ascontiguousarray(weight.reshape(k, n // n_block, n_block).transpose(1, 0, 2))


def unpack_dense_weight(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_dense_weight`."""
    panels, k, n_block = packed.shape
    return packed.transpose(1, 0, 2).reshape(k, panels * n_block)


def pack_depthwise_weight(weight: np.ndarray, block: int) -> np.ndarray:
    """``[C, 1, kh, kw] -> [C/block, kh, kw, block]``."""
    c, _, h, w = weight.shape
    return np.ascontiguousarray(weight.reshape(c // block, block, h, w).transpose(0, 2, 3, 1))


def unpack_depthwise_weight(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_depthwise_weight`."""
    c, h, w, b = packed.shape
    return packed.transpose(0, 3, 1, 2).reshape(c * b, 1, h, w)


def out_size(size: int, before: int, after: int, kernel: int, stride: int, dilation: int) -> int:
    """Output extent of a convolution window along one axis."""
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def conv2d(data, weight, strides, padding, dilation, out_dtype: str = "float32", groups: int = 1):
    """conv2d from NCHW (4-D) or NCHW[bi]c (5-D) ``data`` to NCHW[bo]c.

    ``weight`` is packed by :func:`pack_conv_weight` (``bi = 1`` for 4-D data). With ``groups`` > 1 both
    blocks must divide a group's channels (``bo | O/groups``, ``bi | I/groups``): an output block then
    reads the ``in_blocks`` input blocks of its own group. Narrow groups (``g`` input and ``g`` output
    channels each, ``g < bo``; the weight packed with ``bi = g``, data blocked like the output): output lane
    ``i`` reads lane ``i // g * g + rci`` of the same block, and the anchor carries :data:`NARROW_GROUP` = ``g``
    for the schedule (a shuffle per input channel, :mod:`.x86.intrin.group_shuffle`).
    """
    out_blocks, in_blocks, kh, kw, bi, bo = (int(d) for d in weight.shape)
    blocks_per_group = out_blocks // groups
    blocked_in = len(data.shape) == 5
    narrow = blocked_in and groups > out_blocks
    if narrow and (in_blocks != 1 or int(data.shape[4]) != bo or bo % bi or groups * bi != int(data.shape[1]) * bo):
        raise ValueError(f"narrow groups need {groups} groups of {bi} channels blocked by {bo} in and out, "
                         f"got data {list(data.shape)} and weight {list(weight.shape)}")
    n, h, w = int(data.shape[0]), int(data.shape[2]), int(data.shape[3])
    top, left, bottom, right = padding
    if blocked_in and (kh, kw) == (1, 1) and max(strides) > 1 and not any(padding):
        data = subsample(data, strides)
        n, h, w, strides = int(data.shape[0]), int(data.shape[2]), int(data.shape[3]), (1, 1)
    if any(padding):
        pads = ([0, 0, top, left, 0], [0, 0, bottom, right, 0]) if blocked_in else \
            ([0, 0, top, left], [0, 0, bottom, right])
        data = topi.nn.pad(data, *pads, name="pad_temp")
    out_h = out_size(h, top, bottom, kh, strides[0], dilation[0])
    out_w = out_size(w, left, right, kw, strides[1], dilation[1])
    rco, rci = te.reduce_axis((0, in_blocks), "rco"), te.reduce_axis((0, bi), "rci")
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def read(b, ob, y, x, i):
        iy, ix = y * strides[0] + ry * dilation[0], x * strides[1] + rx * dilation[1]
        if narrow:
            return data[b, ob + rco, iy, ix, i // bi * bi + rci]
        block = ob // blocks_per_group * in_blocks + rco if groups > 1 else rco  # plain index for groups 1
        return data[b, block, iy, ix, rci] if blocked_in else data[b, block * bi + rci, iy, ix]

    return te.compute(
        (n, out_blocks, out_h, out_w, bo),
        lambda b, ob, y, x, i: te.sum(read(b, ob, y, x, i).astype(out_dtype)
                                      * weight[ob, rco, ry, rx, rci, i].astype(out_dtype), axis=[rco, ry, rx, rci]),
        name=CONV_ANCHOR, attrs={NARROW_GROUP: bi} if narrow else None)


def subsample(data, strides):
    """The pixels a strided 1x1 conv reads, gathered: ``SUBSAMPLE[b, c, y, x] = data[b, c, sy*y, sx*x]``.

    Read in place, a stride-2 1x1 conv uses half of every input cache line it loads; on the gathered copy
    it runs as a stride-1 conv. Measured (AVX2, 2 threads, kernel alone): ResNet-50's 1024->2048 14->7
    conv at 133 GFLOP/s strided, 160 as the stride-1 conv on the gathered input."""
    n, blocks, h, w, block = (int(d) for d in data.shape)
    out_h, out_w = (h - 1) // strides[0] + 1, (w - 1) // strides[1] + 1
    return te.compute((n, blocks, out_h, out_w, block),
                      lambda b, c, y, x, i: data[b, c, y * strides[0], x * strides[1], i], name=SUBSAMPLE)


def depthwise_conv2d(data, weight, strides, padding, dilation):
    """Depthwise conv2d (multiplier 1) from NCHW[b]c to NCHW[b]c; ``weight`` from :func:`pack_depthwise_weight`."""
    n, blocks, h, w, block = (int(d) for d in data.shape)
    _, kh, kw, _ = (int(d) for d in weight.shape)
    top, left, bottom, right = padding
    padded = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right, 0], name="PaddedInput")
    out_h = out_size(h, top, bottom, kh, strides[0], dilation[0])
    out_w = out_size(w, left, right, kw, strides[1], dilation[1])
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    return te.compute(
        (n, blocks, out_h, out_w, block),
        lambda b, c, y, x, i: te.sum(
            padded[b, c, y * strides[0] + ry * dilation[0], x * strides[1] + rx * dilation[1], i] * weight[c, ry, rx, i],
            axis=[ry, rx]),
        name=DEPTHWISE_ANCHOR)


def blocked_view(tensor, block: int):
    """An operand of NCHW rank 1-4 (an activation, or a broadcast constant like a ``(1, C, 1, 1)`` bias)
    seen as NCHW[block]c under NumPy broadcasting; scalars and 5-D tensors are returned as they are."""
    rank = len(tensor.shape)
    if rank in (0, 5):
        return tensor
    n, c, h, w = [1] * (4 - rank) + [int(d) for d in tensor.shape]
    blocks, inner = (c // block, block) if c > 1 else (1, 1)

    def read(b, cb, y, x, i):
        index = [b if n > 1 else 0, cb * block + i if c > 1 else 0, y if h > 1 else 0, x if w > 1 else 0]
        return tensor[tuple(index[4 - rank:])]

    return te.compute((n, blocks, h, w, inner), read, name="T_blocked_view")


def to_blocked(tensor, block: int):
    """NCHW -> NCHW[block]c (a layout transform kernel). Channels that do not fill the last block are padded
    with zeros (the INT8 kernels' layout; FP32 blocks always divide the channels)."""
    n, c, h, w = (int(d) for d in tensor.shape)
    if c % block == 0:
        return te.compute((n, c // block, h, w, block), lambda b, cb, y, x, i: tensor[b, cb * block + i, y, x],
                          name=TO_BLOCKED)
    zero = tirx.const(0, tensor.dtype)
    return te.compute((n, -(-c // block), h, w, block),
                      lambda b, cb, y, x, i: tirx.Select(cb * block + i < c,
                                                         tensor[b, tirx.min(cb * block + i, c - 1), y, x], zero),
                      name=TO_BLOCKED)


def plain_crop(conv, channels: int):
    """A conv's NCHW[b]c result (channels padded to whole blocks) as NCHW ``channels``-channel output: the padded
    channels are never stored. The x86 conv2d_nchwc rule computes the padded tile in registers and stores
    this stage from them: a conv whose output channels have no block reads its blocked input in place (no
    ``to_plain`` before it) and writes the plain output a network's head returns."""
    n, blocks, h, w, block = (int(d) for d in conv.shape)
    return te.compute((n, channels, h, w), lambda b, c, y, x: conv[b, c // block, y, x, c % block], name=PLAIN_CROP)


def to_plain(tensor, channels: int | None = None):
    """NCHW[b]c -> NCHW (a layout transform kernel); ``channels`` drops the padding of the last block (None:
    every channel)."""
    n, blocks, h, w, block = (int(d) for d in tensor.shape)
    return te.compute((n, channels or blocks * block, h, w),
                      lambda b, c, y, x: tensor[b, c // block, y, x, c % block], name=TO_PLAIN)


def depth_to_space(data, groups: int, sh: int, sw: int):
    """NCHW[b]c -> NCHW[b]c depth-to-space of a phase conv's output (``TransposeConvToConv``): input channel
    ``g*sh*sw*Cg + (a*sw + b)*Cg + cg`` at ``(y, x)`` goes to channel ``g*Cg + cg`` at ``(sh*y + a, sw*x + b)``.
    With ``Cg`` a multiple of the block, an output vector is one input vector: whole-vector copies, where the
    plain form took a ``to_plain``, a transpose gathering along rows and a ``to_blocked`` after."""
    n, blocks, h, w, block = (int(d) for d in data.shape)
    group_blocks = blocks // (groups * sh * sw)  # Cg / block

    def read(b, cb, y, x, i):
        g, cgb = cb // group_blocks, cb % group_blocks
        phase = (y % sh) * sw + x % sw
        return data[b, (g * sh * sw + phase) * group_blocks + cgb, y // sh, x // sw, i]

    return te.compute((n, groups * group_blocks, h * sh, w * sw, block), read, name="depth_to_space_nchwc")


def channel_shuffle(data, groups: int):
    """NCHW[b]c -> NCHW[b]c channel shuffle (ShuffleNet: reshape to ``[N, g, C/g, H, W]``, swap the two channel
    axes, reshape back to NCHW): output channel ``j`` is input channel ``(j % g) * (C / g) + j // g``. An output
    vector gathers its lanes from ``g`` input vectors of the same pixel."""
    n, blocks, h, w, block = (int(d) for d in data.shape)
    per_group = blocks * block // groups

    def read(b, cb, y, x, i):
        j = cb * block + i
        src = j % groups * per_group + j // groups
        return data[b, src // block, y, x, src % block]

    return te.compute((n, blocks, h, w, block), read, name=CHANNEL_SHUFFLE)


def pool2d(data, pool_type: str, pool_size, strides, padding, dilation, ceil_mode: bool = False,
           count_include_pad: bool = True):
    """Max (``pool_type`` "max") or average ("avg") pooling from NCHW[b]c to NCHW[b]c: topi's ``pool2d``, the
    compute Relax legalizes ``max_pool2d`` / ``avg_pool2d`` to, with the blocked layout's name, so windows,
    padding, ceil mode and the average's divisor are the NCHW op's."""
    block = int(data.shape[4])
    return topi.nn.pool2d(data, [int(k) for k in pool_size], [int(s) for s in strides],
                          [int(d) for d in dilation], [int(p) for p in padding], pool_type, bool(ceil_mode),
                          layout=f"NCHW{block}c", count_include_pad=bool(count_include_pad))


def spatial_mean(data, out_shape):
    """The mean over H and W of NCHW[b]c ``data``, written NCHW: ``out_shape`` is ``(N, C, 1, 1)`` (keepdims)
    or ``(N, C)``. Sum, then divide by H * W, as Relax legalizes ``mean``."""
    n, blocks, h, w, block = (int(d) for d in data.shape)
    ry, rx = te.reduce_axis((0, h), "ry"), te.reduce_axis((0, w), "rx")
    total = te.compute((n, blocks, block), lambda b, cb, i: te.sum(data[b, cb, ry, rx, i], axis=[ry, rx]),
                       name=SPATIAL_SUM)
    count = te.const(h * w, data.dtype)
    return te.compute([int(d) for d in out_shape], lambda b, c, *_: total[b, c // block, c % block] / count,
                      name="spatial_mean")


class KernelLayout:
    """How a kernel's arguments differ from its partition function's (NCHW activations, OIHW weights).

    ``weights``: parameter index -> packing, ``("oc", oc_block)`` (NCHW kernel, :func:`pack_weight`),
    ``("conv", bi, bo)``, ``("winograd", bi, bo)`` (:func:`winograd.pack_weight`), ``("depthwise", b)`` or
    ``("dense", n_block)`` (:func:`pack_dense_weight`);
    ``activations``: parameter index -> block of an input
    passed NCHW[b]c; ``out_block``: the output's block (None: NCHW); ``plain_out``: the output is computed in
    blocks of ``out_block`` (channels padded) and written NCHW (:func:`plain_crop`).
    """

    def __init__(self, weights: dict | None = None, activations: dict | None = None, out_block: int | None = None,
                 plain_out: bool = False):
        self.weights = dict(weights or {})
        self.activations = dict(activations or {})
        self.out_block = out_block
        self.plain_out = plain_out

    @property
    def packed(self) -> dict:
        """Parameter index -> oc_block of the weights an NCHW kernel reads packed (``("oc", oc_block)``)."""
        return {i: blocks[0] for i, (kind, *blocks) in self.weights.items() if kind == "oc"}

    @property
    def blocked(self) -> bool:
        return self.out_block is not None

    def describe(self, activations: str = "NCHW") -> str:
        text = f"NCHW{self.out_block}c" if self.blocked else activations
        if self.plain_out:
            text = f"NCHW (computed NCHW{self.out_block}c)"
        for kind, *blocks in self.weights.values():
            text += ", weight " + {"oc": "OIHW{}o", "conv": "OIHW{}i{}o", "depthwise": "CHW{}c",
                                   "winograd": "Winograd F(2x2,3x3) {1}o", "dense": "NK{}n"}[kind].format(*blocks)
        return text

    def shape(self, index: int, shape: list[int]) -> list[int]:
        """Parameter ``index``'s shape as the kernel reads it, from its shape in the partition function."""
        if index in self.activations:
            return blocked_shape(shape, self.activations[index])
        if index not in self.weights:
            return shape
        kind, *b = self.weights[index]
        if kind == "dense":
            k, n = shape
            return [n // b[0], k, b[0]]
        o, i, h, w = shape
        if kind == "oc":
            return [o // b[0], i, h, w, b[0]]
        if kind == "conv":
            return [-(-o // b[1]), i // b[0], h, w, b[0], b[1]]
        if kind == "winograd":
            return [winograd.ALPHA, winograd.ALPHA, o // b[1], i, b[1]]
        return [o // b[0], h, w, b[0]]

    def pack(self, index: int, weight: np.ndarray) -> np.ndarray:
        """Parameter ``index``'s constant as the kernel reads it."""
        if index not in self.weights:
            return weight
        kind, *blocks = self.weights[index]
        return _PACK[kind](weight, *blocks)

    def plain(self, arrays: list) -> list:
        """A kernel call's arrays (inputs, then the output) in the partition function's layouts."""
        out = list(arrays)
        for index, (kind, *_) in self.weights.items():
            out[index] = _UNPACK[kind](out[index])
            if self.plain_out:  # the zero weights of the padded output channels
                out[index] = out[index][:out[-1].shape[1]]
        for index in list(self.activations) + ([len(out) - 1] if self.blocked and not self.plain_out else []):
            n, cb, h, w, b = out[index].shape
            out[index] = out[index].transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
        return out


_PACK = {"oc": pack_weight, "conv": pack_conv_weight, "depthwise": pack_depthwise_weight,
         "winograd": winograd.pack_weight, "dense": pack_dense_weight}
_UNPACK = {"oc": unpack_weight, "conv": unpack_conv_weight, "depthwise": unpack_depthwise_weight,
           "winograd": winograd.unpack_weight, "dense": unpack_dense_weight}
