"""Winograd F(2x2, 3x3) conv2d in the blocked layout: NCHW[bi]c in, NCHW[bo]c out.

A 3x3 stride-1 convolution computed on 4x4 input tiles with 2x2 outputs each (Lavin & Gray, 2015): the
input tiles are transformed (``V = B^T d B``), multiplied per transform position by the transformed
weights (``M = U V``, 16 independent ``[O x I] x [I x tiles]`` products) and transformed back
(``Y = A^T M A``), where the partition's epilogue is applied. The products need 2.25x fewer
multiply-adds than the direct convolution; the transforms are adds on data that stays in cache.

The entries of ``B`` and ``A`` are 0 and +-1, so both transforms are written out as the sums and differences
they are (:func:`transform`). As products with constant matrices (16 terms per value, unrolled) each tile and
channel vector took 256 multiply-adds in the input transform, the zeros included (``x * 0.0`` is not 0 for every
float, so neither TVM nor LLVM drops it), where 48 adds do, and each output 16 multiply-adds by coefficients
chosen at run time where 8 adds do once the 2 x 2 outputs of a tile are unrolled. Kernels alone (AVX-512, Zen 4,
2 threads, best of 3 runs): 64 channels at 56x56 0.80 -> 0.54 ms, 128 at 28x28 0.59 -> 0.48, 256 at 14x14
0.58 -> 0.48, 512 at 7x7 0.77 -> 0.61.

The weights are transformed at compile time, with the packing of every other kernel
(``U = G g G^T``, laid out ``[4, 4, O/bo, I, bo]``: ``bo`` output channels of one input channel are one
vector). Where it pays is decided by :func:`pays`.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx, topi
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

TILE = 2  # outputs per tile side: F(2x2, 3x3)
KERNEL = 3  # the kernel side it takes
ALPHA = TILE + KERNEL - 1  # input tile side
INPUT = "winograd_input"  # V: transformed input tiles
PRODUCT = "winograd_product"  # M: the per-position products
ANCHOR = "winograd_output"  # Y: back-transformed outputs (the epilogue follows it)


def matrices() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A, B, G)`` of F(2x2, 3x3), float64: ``Y = A^T [(G g G^T) * (B^T d B)] A``."""
    return _cook_toom_convolution(_interpolation_points(ALPHA), TILE, KERNEL)


def min_channels(lanes: int | None) -> int:
    """The fewest input and output channels for which Winograd pays, by the float32 vector width."""
    return 32 if lanes is not None and lanes >= 16 else 64


def pays(in_channels: int, out_channels: int, kernel, strides, dilation, padding, groups: int,
         lanes: int | None = None) -> bool:
    """Whether a conv2d runs as Winograd F(2x2, 3x3): 3x3, stride 1, no dilation, padding 1, groups 1, and
    at least :func:`min_channels` input and output channels.

    Before the transforms were sums (AVX2 against the direct blocked kernel, kernel alone): 256ch at 14x14
    0.69 ms against 1.42, 128ch at 28x28 0.79 against 1.23, 64ch at 56x56 even; on AVX-512 from 64 channels.
    With them (2026-11-30, Zen 4, kernel alone, best of 3): AVX2 code 64ch at 56x56 0.69 against 1.15 ms,
    AVX-512 32ch at 56x56 0.15 against 0.26, and whole models, shipped logs, interleaved: AVX2 code resnet18
    14.6-14.8 -> 12.9-13.0 ms, resnet50 37.1-37.4 -> 35.5-35.7 (their 64-channel layer1); AVX-512 unet 5.8-6.0
    -> 5.4-5.5, yolov8n 9.06-9.14 -> 8.69-8.70 (their 32-channel 3x3 convs)."""
    return (list(kernel) == [3, 3] and list(strides) == [1, 1] and list(dilation) == [1, 1]
            and list(padding) == [1, 1, 1, 1] and groups == 1
            and min(in_channels, out_channels) >= min_channels(lanes))


def pack_weight(weight: np.ndarray, in_block: int, out_block: int) -> np.ndarray:
    """OIHW (3x3) -> ``U`` ``[4, 4, O/out_block, I, out_block]`` (``in_block`` is the input's block; the
    layout does not depend on it)."""
    del in_block
    _, _, g = matrices()
    o, i, _, _ = weight.shape
    # g w g^T per (o, c) as one matrix product, kron(g, g) on the 9 taps: u[a, b] = sum_kl g[a, k] g[b, l] w[k, l].
    # np.einsum's unoptimized loop took 62 ms per ResNet-50 weight; two batched 4x3 products 108 ms for a
    # 512x512 weight, this 68 ms (the same values: g's entries are 0, 1 and 1/2).
    u = (weight.reshape(o * i, KERNEL * KERNEL).astype(np.float64) @ np.kron(g, g).T).astype(weight.dtype)
    return np.ascontiguousarray(u.reshape(o // out_block, out_block, i, ALPHA, ALPHA).transpose(3, 4, 0, 2, 1))


def unpack_weight(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_weight` (``G`` has full column rank: its pseudo-inverse recovers ``g``)."""
    _, _, g = matrices()
    _, _, ob, i, bo = packed.shape
    u = packed.astype(np.float64).transpose(0, 1, 2, 4, 3).reshape(ALPHA, ALPHA, ob * bo, i)
    g_inv = np.linalg.pinv(g)
    return np.einsum("ae,enoc,bn->ocab", g_inv, u, g_inv).astype(packed.dtype)


def transform(b: np.ndarray, e, value):
    """``sum_r b[r, e] value(r)`` for a loop variable ``e``: for each ``e`` the values whose entry is +1 added
    and then those whose entry is -1 subtracted, in ``r`` order (``b``'s entries must be 0 or +-1, each
    column with a +1), chosen by a ``Select`` over ``e`` that the unrolled schedule folds."""
    if not np.isin(b, (-1.0, 0.0, 1.0)).all() or not (b == 1.0).any(axis=0).all():
        raise ValueError("the transform matrix must hold only 0 and +-1, and a +1 in every column")
    sums = []
    for column in b.T:
        plus, minus = np.flatnonzero(column > 0), np.flatnonzero(column < 0)
        total = value(int(plus[0]))
        for r in plus[1:]:
            total = total + value(int(r))
        for r in minus:
            total = total - value(int(r))
        sums.append(total)
    out = sums[-1]
    for k in range(len(sums) - 2, -1, -1):
        out = tirx.Select(e == k, sums[k], out)
    return out


def conv2d(data, weight, out_dtype: str = "float32"):
    """The Winograd conv2d (see the module doc) of NCHW[bi]c ``data`` with ``weight`` from :func:`pack_weight`;
    padding 1 on every side, so the output has ``data``'s height and width."""
    out_dtype = str(out_dtype)
    n, in_blocks, h, w, bi = (int(d) for d in data.shape)
    _, _, out_blocks, channels, bo = (int(d) for d in weight.shape)
    a_np, b_np, _ = matrices()
    tiles_h, tiles_w = -(-h // TILE), -(-w // TILE)
    per_image = tiles_h * tiles_w
    padded = topi.nn.pad(data, [0, 0, 1, 1, 0], [0, 0, tiles_h * TILE + 1 - h, tiles_w * TILE + 1 - w, 0],
                         name="pad_temp")

    def tile_pixel(p, ry, rx, cb, c):
        image, t = p // per_image, p % per_image
        return padded[image, cb, (t // tiles_w) * TILE + ry, (t % tiles_w) * TILE + rx, c].astype(out_dtype)

    v = te.compute((ALPHA, ALPHA, in_blocks, n * per_image, bi), lambda e, u, cb, p, c: transform(
        b_np, e, lambda ra: transform(b_np, u, lambda rb: tile_pixel(p, ra, rb, cb, c))), name=INPUT)
    rco, rci = te.reduce_axis((0, channels // bi), "rco"), te.reduce_axis((0, bi), "rci")
    m = te.compute((ALPHA, ALPHA, out_blocks, n * per_image, bo), lambda e, u, ob, p, o: te.sum(
        weight[e, u, ob, rco * bi + rci, o].astype(out_dtype) * v[e, u, rco, p, rci], axis=[rco, rci]),
        name=PRODUCT)

    def tile_of(image, y, x):
        return image * per_image + (y // TILE) * tiles_w + x // TILE

    return te.compute((n, out_blocks, h, w, bo), lambda i, ob, y, x, o: transform(
        a_np, y % TILE, lambda sa: transform(a_np, x % TILE, lambda sb: m[sa, sb, ob, tile_of(i, y, x), o])),
        name=ANCHOR)
