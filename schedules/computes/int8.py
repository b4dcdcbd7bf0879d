"""TE computes of the INT8 kernels (conv2d, depthwise conv2d, dense), shared by all targets.

Quantization convention (the rest of tvmfuse builds on it):

- Activations are uint8, asymmetric, one scale ``s_x`` and zero point ``za`` per tensor.
- Weights are int8, symmetric, one scale ``s_w[o]`` per output channel, values in [-127, 127], zero point 0.
  (-128 is excluded: VNNI's u8 x s8 products then stay within what every backend sums exactly.)
- The kernel sums raw codes: ``acc[o] = sum(x_u8 * w_s8) + bias_i32[o]``. Mathematically the convolution
  of the real input needs ``sum((x - za) * w)``; the difference ``za * sum(w[o])`` is folded into the int32
  bias at compile time (:func:`tvmfuse.schedules.computes.int8_ref.fold_zero_point`). Spatial padding is therefore
  filled with ``za`` (the code of a real 0), not with 0.
- Epilogue (:class:`Epilogue`), applied per output element inside the kernel:
  quantized output: ``y = clip(round(float32(acc) * M[o]) + zy, lo, hi)`` with ``M[o] = s_x * s_w[o] / s_y``
  in float32 and round half to even (``nearbyint``); ``lo``/``hi`` are the dtype's range, narrowed for
  relu / relu6 (clips in the quantized domain, :meth:`Epilogue.make`). float32 output (dequantize):
  ``y = float32(acc) * M[o]`` with ``M[o] = s_x * s_w[o]``, then the optional clip.
- Residual add (:class:`Residual`): the residual code ``r`` (uint8 or int8, scale ``s_r``, zero point
  ``zr``) is dequantized and added in float before requantizing, in one fused multiply-add:
  ``v = fma(float32(acc), M[o], float32(r - zr) * R)`` with ``R = s_r / s_y`` (float32 output: ``R = s_r``).
  An explicit ``llvm.fma``, rounded once on every target: TVM's LLVM backend may or may not contract a
  float32 product feeding an add (one rounding instead of two), so a plain sum of two products is not
  reproducible by a numpy reference; ``int8_ref.fma32`` is the fma's exact twin. (A float64 sum would be
  exact too, at twice the vector work: ResNet-50's 1x1 convs with a residual ran at 115-180 GMAC/s that way,
  against 350-440 for the others.)
- Hardswish (:class:`HardSwish`): the activation is applied to the real value ``v`` (the float32 product
  above, or the fused sum with a residual), so ``M[o] = s_x * s_w[o]`` and ``R = s_r`` whatever the
  output: ``y = v * (clip(v, lo - shift, hi - shift) + shift) * K`` with ``K = 1 / (6 s_y)`` (float32
  output: ``1 / 6``), then rounded and offset by ``zy`` like any quantized output. Clipping before adding
  the shift keeps every add away from a multiply, so no FMA can form and float32 stays bit-exact.
- Weight layouts: conv2d OIHW -> ``[ceil(O/16), ceil(I/4), kh, kw, 16, 4]`` int8 (VNNI: the 16x4 block of
  one step is 64 contiguous bytes; O and I padded with zero weights); dense ``[N, K]`` (output features
  first, i.e. ONNX MatMul's ``[K, N]`` transposed) -> ``[ceil(N/16), ceil(K/4), 16, 4]``; depthwise keeps
  ``[C, 1, kh, kw]``. Conv2d and dense also take each 16x4 block as int16 pairs ``[2, 16, 2]`` (input
  channels 2p, 2p+1 of the 16 outputs side by side, sign-extended: ``int8_ref.to_pairs``), the layout of the
  ``vpmaddwd`` step on CPUs without VNNI; the dtype tells the layouts apart. Packing helpers:
  :mod:`tvmfuse.schedules.computes.int8_ref`.

Stage (block) names, which the schedules look up: conv2d ``data_pack`` (input to NCHW4c, padded with
``za``) -> ``conv2d_int8`` (int32 accumulator in NCHW16c over the padded channels) -> ``requantize``
(NCHW output); depthwise ``data_pad`` -> ``depthwise_int8`` -> ``requantize``; dense [``data_pad`` when K is
not a multiple of 4] -> ``dense_int8`` (``[M, ceil(N/16)*16]``) -> ``requantize``.
"""

from __future__ import annotations

from tvm import te, tirx

# Re-exported: the epilogue's types and names are part of this module's interface.
from .. import families
from .int8_epilogue import (EPILOGUE, OUT_DTYPES, QUANT_RANGE, TABLE_SIZE, Epilogue, HardSwish,  # noqa: F401
                            Int8KernelError, Requantized, Residual, _epilogue_stage, check_table)

BLOCK_O = 16  # output channels per VNNI step (int32 lanes of one zmm register)
BLOCK_I = 4  # input channels summed by one VNNI product
BLOCKED_LAYOUT = f"NCHW{BLOCK_O}c"  # uint8 activations between INT8 kernels: 16 channels of a pixel in 16 bytes
# What ``signed_data`` subtracts from the uint8 codes: tensor cores multiply s8 x s8, and
# ``sum((x - 128 - (za - 128)) * w) == sum((x - za) * w)``, so folding the bias with ``za - 128`` keeps every
# output identical.
SIGNED_SHIFT = 128
# PrimFunc attr: the kernel's int8 weight was checked to have every pair of a 16x4 step within +-128 codes
# (each pair's positive codes summed, and its negative ones), so a u8 x s8 product pair fits int16 and the
# step may add pairs in int16 (x86 ``vpmaddubsw`` without VNNI). Set by the INT8 passes, read by the rules.
EXACT_PAIRS_ATTR = "tvmfuse.int8_exact_pairs"


def _shape(t) -> list[int]:
    return [int(d) for d in t.shape]


def _check(cond: bool, kernel: str, message: str) -> None:
    if not cond:
        raise Int8KernelError(f"{kernel}: {message}")


def _check_vector(kernel: str, name: str, t, length: int, dtype: str) -> None:
    _check(_shape(t) == [length] and str(t.dtype) == dtype, kernel,
           f"{name} must be [{length}] {dtype}, got {_shape(t)} {t.dtype}")


def _check_epilogue(kernel: str, bias, multiplier, residual, epilogue: Epilogue, out_shape: list[int],
                    table=None, bias_dtype: str = "int32") -> None:
    """Bias and multiplier hold one value per output channel: ``C`` of NCHW, ``C/16 * 16`` (the padded
    channels included) of NCHW16c; a residual has the output's shape; a table goes with ``epilogue.table``.
    ``bias_dtype``: what the kernel adds its sums to (a kernel summing in float32 may take a float32 bias)."""
    check_table(kernel, table, epilogue)
    channels = out_shape[1] * (out_shape[4] if len(out_shape) == 5 else 1)
    _check_vector(kernel, "bias", bias, channels, bias_dtype)
    if epilogue.out_dtype == "int32":
        _check(multiplier is None, kernel, "an int32 output takes no multiplier")
    else:
        _check_vector(kernel, "multiplier", multiplier, channels, "float32")
    _check((residual is None) == (epilogue.residual is None), kernel,
           "a residual tensor needs Epilogue.residual (its zero point and scale), and vice versa")
    if residual is not None:
        _check(_shape(residual) == out_shape and str(residual.dtype) in QUANT_RANGE, kernel,
               f"residual must be {out_shape} uint8/int8, got {_shape(residual)} {residual.dtype}")


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    vals = tuple(int(x) for x in v)
    return (vals[0], vals[0]) if len(vals) == 1 else (vals[0], vals[1])


def _padding(v) -> tuple[int, int, int, int]:
    """int, (h, w) or (top, left, bottom, right) -> (top, left, bottom, right)."""
    if isinstance(v, int):
        return v, v, v, v
    vals = tuple(int(x) for x in v)
    if len(vals) == 2:
        return vals[0], vals[1], vals[0], vals[1]
    if len(vals) == 4:
        return vals
    raise Int8KernelError(f"INT8 conv: padding must be an int, (h, w) or (top, left, bottom, right), got {v!r}")


def _out_size(size: int, before: int, after: int, kernel: int, stride: int, dilation: int) -> int:
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def _padded(data, shape, index, zero_point, name: str, attrs: dict | None = None, dtype: str | None = None,
            shift: int = 0, centred: bool = False):
    """A stage of ``shape`` whose element ``index(*i) -> (valid, data index)`` reads ``data`` or ``za``, both
    less ``shift`` and in ``dtype`` (None: the data's). ``zero_point``: ``za``, an int, or a ``[1]`` tensor of
    the data's dtype holding it (known at run time only). ``centred``: both less ``za`` instead (``shift``
    unused), so the padding is the constant 0.

    The read is clamped into ``data`` and chosen with a select rather than guarded by ``if_then_else``:
    branch-free rows vectorize (a 144x58x58 padded plane: 0.03 ms instead of 0.24 ms on AVX2).
    """
    tensor = isinstance(zero_point, te.Tensor)
    if centred:
        shift, za = (zero_point[0].astype("int32") if tensor else zero_point), tirx.const(0, dtype or data.dtype)
    elif tensor:
        za = (zero_point[0].astype("int32") - shift).astype(dtype or data.dtype)
    else:
        za = tirx.const(zero_point - shift, dtype or data.dtype)
    dims = _shape(data)

    def read(i):
        if centred or shift:
            return (data[i].astype("int32") - shift).astype(dtype)
        return data[i] if dtype is None else data[i].astype(dtype)

    def body(*i):
        valid, src = index(*i)
        if valid is None:  # every element reads data: a plain reindexing stage
            return read(src)
        safe = tuple(tirx.max(tirx.min(s, d - 1), 0) for s, d in zip(src, dims))
        return tirx.Select(valid, read(safe), za)

    return te.compute(shape, body, name=name, attrs=attrs)


def nchw(shape) -> tuple[int, int, int, int]:
    """``(N, C, H, W)`` of an NCHW or NCHW[b]c shape (``C`` counts the block's padded channels)."""
    dims = [int(d) for d in shape]
    return tuple(dims) if len(dims) == 4 else (dims[0], dims[1] * dims[4], dims[2], dims[3])


def read_channel(data, b, ch, y, x):
    """Element (b, ch, y, x) of an NCHW or NCHW[b]c ``data``."""
    if len(data.shape) == 4:
        return b, ch, y, x
    block = int(data.shape[4])
    return b, ch // block, y, x, ch % block


def _check_data(kernel: str, data) -> None:
    rank = len(data.shape)
    _check(str(data.dtype) == "uint8" and (rank == 4 or (rank == 5 and int(data.shape[4]) == BLOCK_O)), kernel,
           f"data must be uint8 NCHW or NCHW{BLOCK_O}c, got {_shape(data)} {data.dtype}")


def out_shape_of(n: int, channels: int, out_h: int, out_w: int, out_layout: str) -> list[int]:
    """The output shape in ``out_layout``: ``"NCHW"`` or ``"NCHW16c"`` (channels padded to whole blocks)."""
    if out_layout == "NCHW":
        return [n, channels, out_h, out_w]
    _check(out_layout == BLOCKED_LAYOUT, "INT8 kernel",
           f"out_layout must be NCHW or {BLOCKED_LAYOUT}, got {out_layout!r}")
    return [n, -(-channels // BLOCK_O), out_h, out_w, BLOCK_O]


def _geometry(kernel: str, data, kh: int, kw: int, strides, padding, dilation):
    n, c, h, w = nchw(data.shape)
    (sh, sw), (dh, dw), pad = _pair(strides), _pair(dilation), _padding(padding)
    out_h, out_w = _out_size(h, pad[0], pad[2], kh, sh, dh), _out_size(w, pad[1], pad[3], kw, sw, dw)
    _check(out_h > 0 and out_w > 0, kernel, f"empty output for input {[n, c, h, w]}, kernel {kh}x{kw}")
    return (n, c, h, w), (sh, sw), (dh, dw), pad, (out_h, out_w)


def _weight_at(weight, pairs: bool, block, o, i):
    """Weight of output channel ``o`` and input channel ``i`` of a 16x4 block: ``[16, 4]`` int8, or the
    pair layout ``[2, 16, 2]`` int16 (input channels 2p and 2p+1 of the 16 outputs side by side)."""
    return weight[(*block, i // 2, o, i % 2)] if pairs else weight[(*block, o, i)]


def conv2d_compute(data, weight, bias, multiplier, residual=None, *, out_channels: int, strides=1, padding=0,
                   dilation=1, input_zero_point: int = 0, epilogue: Epilogue = Epilogue(),
                   out_layout: str = "NCHW", table=None, signed_data: bool = False) -> te.Tensor:
    """INT8 conv2d (groups = 1) with the requantize epilogue.

    Parameters
    ----------
    data : te.Tensor
        ``[N, C, H, W]`` uint8 codes, or NCHW16c ``[N, ceil(C/16), H, W, 16]`` (what the padded channels hold
        is never read: their weights are zero).
    weight : te.Tensor
        ``[ceil(O/16), ceil(C/4), kh, kw, 16, 4]`` int8, packed by ``int8_ref.pack_conv2d_weight``, or its
        int16 pair form ``[..., 2, 16, 2]`` (``int8_ref.to_pairs``).
    bias : te.Tensor
        ``[O]`` int32, with the input zero point folded in (``int8_ref.fold_zero_point``).
    multiplier : te.Tensor
        ``[O]`` float32 ``M[o]``.
    residual : te.Tensor, optional
        uint8/int8 codes of the output's shape, added as described by ``epilogue.residual``.
    out_channels : int
        O (the packed weight is padded to a multiple of 16).
    strides, padding, dilation
        As in ONNX Conv; padding is an int, ``(h, w)`` or ``(top, left, bottom, right)``.
    input_zero_point : int or te.Tensor
        ``za``, the value spatial padding is filled with; or a ``[1]`` uint8 tensor holding it (a zero point
        computed at run time: :mod:`tvmfuse.frontend.integer_conv`).
    epilogue : Epilogue
    out_layout : str
        ``"NCHW"``, or ``"NCHW16c"``: the output is ``[N, ceil(O/16), OH, OW, 16]`` and bias and multiplier
        are padded to ``ceil(O/16) * 16`` channels.
    table : te.Tensor, optional
        ``[256]`` output codes, with ``epilogue.table``: the code each requantized value is replaced by.
    signed_data : bool
        The input is summed shifted to int8 (``x - 128``, padding ``za - 128``), for ``s8 x s8`` tensor cores;
        ``bias`` is then folded with the zero point ``za - 128`` (:data:`SIGNED_SHIFT`).

    Returns
    -------
    te.Tensor
        The output in ``out_layout``, in ``epilogue.out_dtype``.
    """
    name = "INT8 conv2d"
    _check_data(name, data)
    wshape = _shape(weight)
    pairs = str(weight.dtype) == "int16"
    _check(str(weight.dtype) in ("int8", "int16") and wshape[4:] == ([2, BLOCK_O, 2] if pairs else [BLOCK_O, BLOCK_I]),
           name, f"weight must be packed int8 [O/16, I/4, kh, kw, 16, 4] or int16 [O/16, I/4, kh, kw, 2, 16, 2], "
           f"got {wshape} {weight.dtype}")
    o_blocks, c_blocks, kh, kw = wshape[:4]
    (n, c, h, w), (sh, sw), (dh, dw), pad, (out_h, out_w) = _geometry(name, data, kh, kw, strides, padding, dilation)
    blocked_in = len(data.shape) == 5
    _check(c_blocks == -(-c // BLOCK_I) or (blocked_in and c - BLOCK_O < c_blocks * BLOCK_I <= c), name,
           f"weight has {c_blocks} blocks of 4 input channels for {c} channels")
    _check(o_blocks == -(-out_channels // BLOCK_O), name,
           f"weight has {o_blocks} blocks of 16 output channels for out_channels={out_channels}")
    out_shape = out_shape_of(n, out_channels, out_h, out_w, out_layout)
    _check_epilogue(name, bias, multiplier, residual, epilogue, out_shape, table)
    top, left = pad[0], pad[1]

    def pack_index(b, cb, y, x, ci):
        ch = cb * BLOCK_I + ci
        if blocked_in and not any(pad):  # NCHW16c holds every channel a block of 4 reads: no select at all
            return None, read_channel(data, b, ch, y, x)
        valid = tirx.all(ch < c, y >= top, y < h + top, x >= left, x < w + left)
        return valid, read_channel(data, b, ch, y - top, x - left)

    # With int16 weight pairs a copied input is widened too: the pair step then broadcasts each pixel's two
    # int16 pairs straight from memory instead of forming them with byte shuffles (an in-place NCHW16c read
    # stays uint8).
    wide = "int16" if pairs and not (blocked_in and not any(pad)) else None
    _check(not (pairs and signed_data), name, "int16 weight pairs take uint8 data, not signed_data")
    shift = SIGNED_SHIFT if signed_data else 0
    packed = _padded(data, [n, c_blocks, h + pad[0] + pad[2], w + pad[1] + pad[3], BLOCK_I], pack_index,
                     input_zero_point, families.CONV2D.int8.pad_block, dtype="int8" if signed_data else wide,
                     shift=shift)
    rcb = te.reduce_axis((0, c_blocks), "rcb")
    ry, rx, rci = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx"), te.reduce_axis((0, BLOCK_I), "rci")
    acc = te.compute(
        (n, o_blocks, out_h, out_w, BLOCK_O),
        lambda b, ob, y, x, oi: te.sum(
            packed[b, rcb, y * sh + ry * dh, x * sw + rx * dw, rci].astype("int32")
            * _weight_at(weight, pairs, (ob, rcb, ry, rx), oi, rci).astype("int32"), axis=[rcb, ry, rx, rci]),
        name=families.CONV2D.int8.anchor_block)
    if out_layout != "NCHW":
        return _epilogue_stage(lambda *i: acc[i], bias, multiplier, residual, epilogue, out_shape, table)
    return _epilogue_stage(lambda b, o, y, x: acc[b, o // BLOCK_O, y, x, o % BLOCK_O], bias, multiplier,
                           residual, epilogue, out_shape, table)


def dense_compute(data, weight, bias, multiplier, residual=None, *, out_features: int,
                  epilogue: Epilogue = Epilogue(), table=None, signed_data: bool = False) -> te.Tensor:
    """INT8 dense ``y[M, N] = x[M, K] . w[N, K]^T`` with the requantize epilogue.

    ``data`` ``[M, K]`` uint8, ``weight`` ``[ceil(N/16), ceil(K/4), 16, 4]`` int8 (``int8_ref.pack_dense_weight``;
    or its int16 pairs),
    ``bias`` ``[N]`` int32 (zero point folded in), ``multiplier`` ``[N]`` float32, ``residual`` ``[M, N]``;
    ``out_features`` is N; ``table`` as for :func:`conv2d_compute`. A K that is not a multiple of 4 is padded
    (``data_pad``) with zeros, which the zero weights of the padding ignore; ``signed_data`` as for
    :func:`conv2d_compute` (``data_pad`` then always, the shifted codes). Returns ``[M, N]`` in
    ``epilogue.out_dtype``.
    """
    name = "INT8 dense"
    _check(str(data.dtype) == "uint8" and len(data.shape) == 2, name, f"data must be 2-D uint8, got {_shape(data)} {data.dtype}")
    m, k = _shape(data)
    wshape = _shape(weight)
    pairs = str(weight.dtype) == "int16"
    _check(wshape[2:] == ([2, BLOCK_O, 2] if pairs else [BLOCK_O, BLOCK_I]) and str(weight.dtype) in ("int8", "int16"),
           name, f"weight must be packed int8 [N/16, K/4, 16, 4] or int16 [N/16, K/4, 2, 16, 2], got {wshape} "
           f"{weight.dtype}")
    n_blocks, k_blocks = wshape[:2]
    _check(k_blocks == -(-k // BLOCK_I), name, f"weight has {k_blocks} blocks of 4 for K={k}")
    _check(n_blocks == -(-out_features // BLOCK_O), name,
           f"weight has {n_blocks} blocks of 16 outputs for out_features={out_features}")
    out_shape = [m, out_features]
    _check_epilogue(name, bias, multiplier, residual, epilogue, out_shape, table)
    if k % BLOCK_I or signed_data:
        # K's padding (zero weights ignore it) reads the code ``shift``: 0 once shifted
        shift = SIGNED_SHIFT if signed_data else 0
        data = _padded(data, [m, k_blocks * BLOCK_I], lambda i, j: (j < k if k % BLOCK_I else None, (i, j)),
                       shift, families.DENSE.int8.pad_block, dtype="int8" if signed_data else None, shift=shift)
    rk = te.reduce_axis((0, k_blocks * BLOCK_I), "rk")
    acc = te.compute(
        (m, n_blocks * BLOCK_O),
        lambda i, j: te.sum(data[i, rk].astype("int32")
                            * _weight_at(weight, pairs, (j // BLOCK_O, rk // BLOCK_I), j % BLOCK_O,
                                         rk % BLOCK_I).astype("int32"), axis=rk),
        name=families.DENSE.int8.anchor_block)
    return _epilogue_stage(lambda i, j: acc[i, j], bias, multiplier, residual, epilogue, out_shape, table)


def prim_func(tensors: list) -> tirx.PrimFunc:
    """PrimFunc over ``tensors`` (inputs in call order, output last), without ``global_symbol``."""
    return te.create_prim_func(list(tensors)).without_attr("global_symbol")


# One signature for the INT8 computes (``families.Int8.compute``; depthwise: :mod:`.int8_depthwise`):
# (data, weight, bias, multiplier, residual, *, channels, input_zero_point, epilogue, **conv).
def conv2d_kernel(data, weight, bias, multiplier, residual=None, *, channels: int, input_zero_point: int = 0,
                  epilogue: Epilogue = Epilogue(), **conv) -> te.Tensor:
    return conv2d_compute(data, weight, bias, multiplier, residual, out_channels=channels,
                          input_zero_point=input_zero_point, epilogue=epilogue, **conv)


def dense_kernel(data, weight, bias, multiplier, residual=None, *, channels: int, input_zero_point: int = 0,
                 epilogue: Epilogue = Epilogue(), table=None, signed_data: bool = False, **conv) -> te.Tensor:
    del input_zero_point, conv  # folded into the bias; a dense has no window
    return dense_compute(data, weight, bias, multiplier, residual, out_features=channels, epilogue=epilogue,
                         table=table, signed_data=signed_data)
