"""TE computes for the blocked channel layout NCHW[b]c (activations ``[N, C/b, H, W, b]``).

With ``b`` the target's float32 vector width, the ``b`` channels of one pixel are one vector: a conv2d
output tile is stored with whole-vector stores straight from its accumulators, a depthwise tap is one
vector load whatever the stride or row width, and a 1x1 conv's input channels are read in cache-line
runs. MKL-DNN and TVM's old x86 conv2d used the same layout.

- Weights are packed once at compile time (:mod:`.packing`): conv2d ``OIHW -> [O/bo, I/bi, kh, kw, bi, bo]``
  (``bi = 1`` when the kernel reads NCHW input, e.g. the stem), depthwise ``[C, 1, kh, kw] -> [C/b, kh, kw, b]``.
- A channel count no block divides takes a padded block where that adds at most an eighth
  (:func:`padded_block`): zero weights for the padded channels and zeros stored in them (:func:`zero_padding`).
- Epilogue operands in NCHW (bias ``(1, C, 1, 1)``, a residual left NCHW) are read through inlined
  views, so the epilogue ops of the partition body apply unchanged.
- :func:`to_blocked` / :func:`to_plain` are the layout transforms the lowering inserts at partition
  boundaries where a plain NCHW tensor is needed.
- :func:`pool2d`: max/average pooling of a blocked activation stays blocked (no transform before it, and
  the conv after it reads it blocked); :func:`spatial_mean` (global average pooling) reads it blocked and
  writes the small NCHW result, so the last feature map is never transformed.
"""

from __future__ import annotations

from tvm import te, tirx, topi


CONV_ANCHOR = "conv2d_NCHWc"
DEPTHWISE_ANCHOR = "DepthwiseConv2d_NCHWc"
TO_BLOCKED = "to_blocked"
TO_PLAIN = "to_plain"
SUBSAMPLE = "subsample"  # the gathered input of a strided 1x1 conv
CHANNEL_SHUFFLE = "channel_shuffle_nchwc"
PLAIN_CROP = "plain_crop"  # a conv computed in NCHW[b]c with padded channels, written NCHW (see plain_crop)
ZERO_PADDING = "zero_padding"  # the last stage of a kernel writing a padded block (see zero_padding)
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


def least_padding_block(channels: int, lanes: int) -> tuple[int, int]:
    """``(block, padded channels)``: of a whole vector and 8, the block that pads ``channels`` least (the wider
    on a tie)."""
    block = min((b for b in (lanes, 8) if b <= lanes), key=lambda b: (-(-channels // b) * b, -b))
    return block, -(-channels // block) * block


def padded_block(channels: int, lanes: int) -> int | None:
    """The block of a ``channels``-channel activation that :func:`block_for` leaves NCHW, its last block padded
    (zero weights for the padded channels, zeros stored in them): the block that pads least (the wider on a
    tie), where the padding adds at most an eighth. None otherwise. ShuffleNetV2's 58 and 116 channels (64 and
    128 in blocks of 16): its depthwise kernels ran 0.38-0.64x and its 1x1 convs 0.75-0.81x the time of the NCHW
    kernels at 58 / 116 (Zen 4, per kernel); 12 -> 16 (a third more work) lost 1.19x on PP-OCRv6 det's head."""
    if block_for(channels, lanes) is not None:
        return None
    block, padded = least_padding_block(channels, lanes)
    return block if (padded - channels) * 8 <= channels else None


def channel_block(channels: int, lanes: int) -> int | None:
    """The block a conv or depthwise kernel's activation takes: :func:`block_for`, else :func:`padded_block`."""
    return block_for(channels, lanes) or padded_block(channels, lanes)


def blocked_shape(shape, block: int) -> list[int]:
    """An NCHW shape in NCHW[block]c, the last block padded when ``block`` does not divide the channels."""
    n, c, h, w = (int(d) for d in shape)
    return [n, -(-c // block), h, w, block]


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
    seen as NCHW[block]c under NumPy broadcasting; scalars and 5-D tensors are returned as they are. The padded
    lanes of a last block that ``block`` does not fill read the last channel (finite whatever op reads them)."""
    rank = len(tensor.shape)
    if rank in (0, 5):
        return tensor
    n, c, h, w = [1] * (4 - rank) + [int(d) for d in tensor.shape]
    blocks, inner = (-(-c // block), block) if c > 1 else (1, 1)

    def read(b, cb, y, x, i):
        channel = cb * block + i if c % block == 0 else tirx.min(cb * block + i, c - 1)  # a padded block's lanes
        index = [b if n > 1 else 0, channel if c > 1 else 0, y if h > 1 else 0, x if w > 1 else 0]
        return tensor[tuple(index[4 - rank:])]

    return te.compute((n, blocks, h, w, inner), read, name="T_blocked_view")


def to_blocked(tensor, block: int):
    """NCHW -> NCHW[block]c (a layout transform kernel). Channels that do not fill the last block are padded
    with zeros (the INT8 kernels' layout, and FP32's padded blocks: :func:`padded_block`)."""
    n, c, h, w = (int(d) for d in tensor.shape)
    if c % block == 0:
        return te.compute((n, c // block, h, w, block), lambda b, cb, y, x, i: tensor[b, cb * block + i, y, x],
                          name=TO_BLOCKED)
    zero = tirx.const(0, tensor.dtype)
    return te.compute((n, -(-c // block), h, w, block),
                      lambda b, cb, y, x, i: tirx.Select(cb * block + i < c,
                                                         tensor[b, tirx.min(cb * block + i, c - 1), y, x], zero),
                      name=TO_BLOCKED)


def zero_padding(tensor, channels: int):
    """A padded NCHW[b]c result (``channels`` real channels) with zeros stored in its padded lanes, so that every
    padded tensor holds zeros there whatever the epilogue made of them (a sigmoid of 0 is not 0)."""
    n, blocks, h, w, block = (int(d) for d in tensor.shape)
    zero = tirx.const(0, tensor.dtype)
    return te.compute((n, blocks, h, w, block),
                      lambda b, cb, y, x, i: tirx.Select(cb * block + i < channels, tensor[b, cb, y, x, i], zero),
                      name=ZERO_PADDING)


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
