"""The anchors' TE computes, one per family (``families.Family.compute`` / ``blocked_compute`` name them):
conv2d, depthwise and grouped conv2d, dense, in NCHW (from ``topi.nn`` or here) and in NCHW[b]c (from
:mod:`.blocked` and :mod:`.winograd`). :mod:`.partition` interprets the rest of a partition around them.
"""

from __future__ import annotations

from tvm import te, topi

from . import blocked, winograd
from .blocked import out_size
from ..common import row_vector

# The even/odd column split of a stride-2 depthwise kernel's padded input.
PHASE_SPLIT = "PhaseSplit"


def ints(values) -> list[int]:
    return [int(v) for v in values]


def _whole_vectors(width: int, lanes: int) -> int:
    """``width`` rounded up to whole vectors of ``lanes``."""
    return -(-width // lanes) * lanes


def _cropped(conv, out_w: int, name: str):
    """``conv`` (rows computed in whole vectors) cut to ``out_w`` columns; the schedules inline the crop
    into the epilogue."""
    n, c, h, _ = (int(d) for d in conv.shape)
    return te.compute((n, c, h, out_w), lambda b, o, y, x: conv[b, o, y, x], name=name)


def _conv2d_packed(data, packed, strides, padding, dilation, out_dtype, wide: int | None = None):
    """NCHW conv2d reading a weight packed by :func:`.packing.pack_weight`; same block names as topi's. With ``wide``,
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
    return _cropped(conv, out_w, "Conv2dCrop") if wide else conv


def whole_vector_rows(out_width: int, lanes: int) -> int | None:
    """The row width an NCHW conv with pixel vectors computes at: ``out_width`` rounded up to whole vectors
    when its own pixel vectors (:func:`common.row_vector`) would be under half a vector and the rounding adds
    at most a quarter; None keeps the row. 24 -> 12 2x2 on a 321-wide map (321 = 3 x 107: 3-pixel vectors)
    took 5.1-6.7 ms against 1.3-1.4 at 320 wide (Zen 4)."""
    wide = _whole_vectors(out_width, lanes)
    if row_vector(out_width, lanes) * 2 >= lanes or wide == out_width or (wide - out_width) * 4 > out_width:
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
    wide = _whole_vectors(out_w, lanes)
    padded = topi.nn.pad(data, [0, 0, top, left], [0, 0, bottom, right + (wide - out_w) * strides[1]],
                         name="PaddedInput")
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    conv = te.compute(
        (n, out_channels, out_h, wide),
        lambda b, o, y, x: te.sum(
            padded[b, o // multiplier, y * strides[0] + ry * dilation[0], x * strides[1] + rx * dilation[1]]
            * weight[o, 0, ry, rx], axis=[ry, rx]),
        name="DepthwiseConv2d")
    return _cropped(conv, out_w, "DepthwiseCrop")


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
    wide = _whole_vectors(out_w, lanes) if lanes else out_w
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
    return _cropped(conv, out_w, "DepthwiseCrop")


def _conv_args(call) -> tuple[list[int], list[int], list[int]]:
    a = call.attrs
    return ints(a.strides), ints(a.padding), ints(a.dilation)


def conv2d(call, data, weight, lanes: int | None = None, out_dtype: str | None = None):
    """groups = 1 conv2d; a 5-D weight is packed by :func:`.packing.pack_weight` (see ``partition.partition_compute``).
    With ``lanes`` and a channel count no vector divides (so the kernel's vectors run along rows), rows
    whose pixel vectors (:func:`common.row_vector`) would be short are computed in whole vectors, then
    cropped (:func:`whole_vector_rows`). ``out_dtype``: the accumulator's (float32 for float16 operands; None:
    the operands')."""
    if len(weight.shape) == 5:
        out_channels, out_width = int(call.ty.shape[1]), int(call.ty.shape[3])
        wide = whole_vector_rows(out_width, lanes) if lanes and out_channels % lanes else None
        return _conv2d_packed(data, weight, *_conv_args(call), out_dtype or call.ty.dtype, wide)
    return topi.nn.conv2d_nchw(data, weight, *_conv_args(call), out_dtype=out_dtype)


def depthwise_conv2d(call, data, weight, lanes: int | None = None, out_dtype: str | None = None):
    """Depthwise conv2d; rows computed in whole vectors of ``lanes`` where that pays (see the helpers). Without
    ``lanes`` (a backend with no vectors: CUDA, where a thread computes a strip of outputs from a tile in shared
    memory) topi's plain form: padding, then the window."""
    strides, padding, dilation = _conv_args(call)
    if out_dtype not in (None, str(data.dtype)):
        lanes = None  # the whole-vector forms are the CPU's, in the operands' type
    if lanes and phase_split_pays(strides[1], dilation[1], int(call.ty.shape[3]), int(weight.shape[3])):
        return _depthwise_phase_split(data, weight, strides, padding, dilation, lanes)
    if lanes and int(call.ty.shape[3]) % lanes:
        return _depthwise_whole_vectors(data, weight, strides, padding, dilation, lanes)
    # Relax weight (C*M, 1, kh, kw) -> topi's depthwise filter (C, M, kh, kw).
    in_channels = int(data.shape[1])
    multiplier = int(weight.shape[0]) // in_channels
    filt = topi.reshape(weight, (in_channels, multiplier, int(weight.shape[2]), int(weight.shape[3])))
    return topi.nn.depthwise_conv2d_nchw(data, filt, strides, padding, dilation, out_dtype=out_dtype)


def group_conv2d(call, data, weight, lanes: int | None = None, out_dtype: str | None = None):
    """Grouped conv2d. Without ``lanes`` (NCHW kernels: CUDA) the groups are an axis of their own, so the
    kernel is a batched GEMM (``C[g, I, J] += A[g, I, K] * B[g, J, K]``) the GEMM rules tile; topi's form
    reads the input at ``f // (O / G) * (C / G) + c`` and is no GEMM to them."""
    if lanes is None:
        return _group_conv2d_batched(data, weight, *_conv_args(call), int(call.attrs.groups), out_dtype)
    return topi.nn.group_conv2d_nchw(data, weight, *_conv_args(call), int(call.attrs.groups), out_dtype=out_dtype)


def _group_conv2d_batched(data, weight, strides, padding, dilation, groups: int, out_dtype: str | None):
    batch, _, height, width = (int(d) for d in data.shape)
    out_channels, group_in, kh, kw = (int(d) for d in weight.shape)
    group_out = out_channels // groups
    top, left, bottom, right = padding if len(padding) == 4 else (padding[0], padding[1]) * 2
    out_h = (height + top + bottom - dilation[0] * (kh - 1) - 1) // strides[0] + 1
    out_w = (width + left + right - dilation[1] * (kw - 1) - 1) // strides[1] + 1
    padded = topi.nn.pad(data, (0, 0, top, left), (0, 0, bottom, right), name="pad_temp")
    acc = out_dtype or str(data.dtype)
    rc = te.reduce_axis((0, group_in), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    grouped = te.compute(
        (batch, groups, group_out, out_h, out_w),
        lambda n, g, f, y, x: te.sum(
            padded[n, g * group_in + rc, y * strides[0] + ry * dilation[0], x * strides[1] + rx * dilation[1]]
            .astype(acc) * weight[g * group_out + f, rc, ry, rx].astype(acc), axis=[rc, ry, rx]),
        name="group_conv2d_nchw", tag="group_conv2d_nchw")
    return te.compute((batch, out_channels, out_h, out_w),
                      lambda n, c, y, x: grouped[n, c // group_out, c % group_out, y, x], name="group_conv2d_out",
                      tag=topi.tag.INJECTIVE)


def dense(call, data, weight, lanes: int | None = None, out_dtype: str | None = None):
    """``data[M, K] x weight[K, N]``; a 3-D weight is packed ``[N/n_block, K, n_block]``
    (:func:`.packing.pack_dense_weight`). Both name the product ``T_matmul_NN``, as topi does."""
    del lanes
    if len(weight.shape) == 2:
        return topi.nn.matmul(data, weight, out_dtype=out_dtype)
    (m, k), (panels, _, n_block) = ([int(d) for d in data.shape], [int(d) for d in weight.shape])
    acc = out_dtype or str(data.dtype)
    r = te.reduce_axis((0, k), name="k")
    return te.compute((m, panels * n_block), lambda i, j: te.sum(
        data[i, r].astype(acc) * weight[j // n_block, r, j % n_block].astype(acc), axis=r), name="T_matmul_NN",
        tag="matmul")


def conv2d_blocked(call, data, weight):
    """NCHW[b]c conv2d; a 5-D weight packed by ``winograd.pack_weight`` selects Winograd (``partition._blocked_layout``)."""
    if len(weight.shape) == 5:
        return winograd.conv2d(data, weight, call.ty.dtype)
    return blocked.conv2d(data, weight, *_conv_args(call), call.ty.dtype)


def group_conv2d_blocked(call, data, weight):
    """NCHW[b]c grouped conv2d whose blocks divide a group's channels (see :func:`.partition.blockable`)."""
    return blocked.conv2d(data, weight, *_conv_args(call), call.ty.dtype, groups=int(call.attrs.groups))


def depthwise_conv2d_blocked(call, data, weight):
    return blocked.depthwise_conv2d(data, weight, *_conv_args(call))
