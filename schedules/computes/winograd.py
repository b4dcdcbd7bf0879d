"""Winograd F(2x2, 3x3) and F(4x4, 3x3) conv2d in the blocked layout: NCHW[bi]c in, NCHW[bo]c out.

A 3x3 stride-1 convolution computed on (m+2)x(m+2) input tiles with m x m outputs each, m = 2 or 4 (Lavin &
Gray, 2015): the input tiles are transformed (``V = B^T d B``), multiplied per transform position by the
transformed weights (``M = U V``, (m+2)^2 independent ``[O x I] x [I x tiles]`` products) and transformed back
(``Y = A^T M A``), where the partition's epilogue is applied. The products need 2.25x (m = 2) or 4x (m = 4)
fewer multiply-adds than the direct convolution; the transforms are adds on data that stays in cache. Which m a
conv gets is :func:`tile_for`'s choice: F(4x4)'s weights are 2.25x F(2x2)'s.

The entries of ``B`` and ``A`` are small integers (0 and +-1 for F(2x2); up to 8 for F(4x4)), so both
transforms are written out as the sums, differences and multiplications by constants they are (:func:`transform`),
rows first, then columns. As products with constant matrices each value multiplied every entry, the zeros
included (``x * 0.0`` is not 0 for every float, so neither TVM nor LLVM drops it): F(2x2)'s input transform took
256 multiply-adds a tile and channel vector where 48 adds do. Kernels alone (AVX-512, Zen 4, 2 threads, best of
3 runs), F(2x2) as products -> sums: 64 channels at 56x56 0.80 -> 0.54 ms, 128 at 28x28 0.59 -> 0.48, 256 at
14x14 0.58 -> 0.48, 512 at 7x7 0.77 -> 0.61; F(4x4): 0.33, 0.30, 0.38-0.42 and 0.51-0.65 ms.

The weights are transformed at compile time, with the packing of every other kernel
(``U = G g G^T``, laid out ``[m+2, m+2, O/bo, I, bo]``: ``bo`` output channels of one input channel are one
vector). Where Winograd pays at all is decided by :func:`pays`.
"""

from __future__ import annotations

import numpy as np
from tvm import te, tirx, topi
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

TILES = (2, 4)  # outputs per tile side: F(2x2, 3x3) and F(4x4, 3x3)
KERNEL = 3  # the kernel side it takes
INPUT_ROWS = "winograd_input_rows"  # B^T d: the input tiles' rows transformed
INPUT = "winograd_input"  # V: transformed input tiles
PRODUCT = "winograd_product"  # M: the per-position products
OUTPUT_ROWS = "winograd_output_rows"  # A^T M: the products' rows transformed back
ANCHOR = "winograd_output"  # Y: back-transformed outputs (the epilogue follows it)
WEIGHT_BYTES = 16 << 20  # the most F(4x4, 3x3) weights (bytes) taken: half this Zen 4's L3 (see tile_for)

# F(4x4, 3x3) of Lavin & Gray, points 0, +-1, +-2 and infinity: B and A hold small integers (the transforms are
# adds and multiplications by 2, 4, 5 and 8), G the fractions. TVM's Cook-Toom points for six (0, +-1, 1/2, -2,
# -1/2) put fractions into B.
_BT4 = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1]]
_G4 = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
       [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
_AT4 = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]


def matrices(tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(A, B, G)`` of F(tile x tile, 3x3), float64: ``Y = A^T [(G g G^T) * (B^T d B)] A``."""
    if tile == 2:
        return _cook_toom_convolution(_interpolation_points(tile + KERNEL - 1), tile, KERNEL)
    if tile == 4:
        return np.array(_AT4, np.float64).T, np.array(_BT4, np.float64).T, np.array(_G4, np.float64)
    raise ValueError(f"Winograd F({tile}x{tile}, 3x3) is not implemented (tiles: {TILES})")


def tile_for(batch: int, height: int, width: int, in_channels: int, out_channels: int) -> int:
    """The output tile side for ``batch`` maps of ``height`` x ``width``: 4 unless F(4x4)'s transformed weights
    (2.25x F(2x2)'s) take more than :data:`WEIGHT_BYTES`, or its tiles more products than F(2x2)'s (maps
    of one or two rows); 2 otherwise. Products are tiles times ``(tile + 2)^2``, 4 on a tie.

    In models on Zen 4 (AVX-512, 32 MiB L3), per call: ResNet-18's 512 channels at 7x7 (weights 38 MB with
    F(4x4)) 1.24 ms against 0.89 with F(2x2), the weights read from memory each time; 256 channels at
    14x14 (9 MB) tied; the CRNN's 256 channels at 4x32 (9 MB) 0.26-0.30 against 0.45 ms, 128 at 8x32 0.13
    against 0.24; ResNet-18's 128 at 28x28 0.38 against 0.54, 64 at 56x56 0.40-0.52 against 0.57."""
    if (TILES[-1] + KERNEL - 1) ** 2 * in_channels * out_channels * 4 > WEIGHT_BYTES:
        return TILES[0]

    def products(tile):
        return batch * -(-height // tile) * -(-width // tile) * (tile + KERNEL - 1) ** 2
    return min(reversed(TILES), key=products)


# The fewest input and output channels for which Winograd pays, with AVX-512 and with AVX2 (F(2x2) alone paid from
# 64 channels with AVX2, 32 with AVX-512). Kernels alone with F(4x4) (Zen 4, 2 threads, best of 3, Winograd /
# direct): AVX-512 16 channels at 80x80 0.54x, at 160x160 0.70x, 32 at 40x40 to 80x80 0.43-0.49x; AVX2 code 16
# channels 0.62x and 0.85x, 32 0.35-0.39x. Whole models (interleaved, best of 3): AVX-512 unet 0.87x, yolov8n
# 0.98x (16 channels, from 32); AVX2 code unet 0.90x, yolov8n 0.95x (32 channels, from 64), then unet 0.98x,
# yolov8n 0.99x (16, from 32).
MIN_CHANNELS = 16


def pays(in_channels: int, out_channels: int, kernel, strides, dilation, padding, groups: int) -> bool:
    """Whether a conv2d runs as Winograd (F(2x2) or F(4x4): :func:`tile_for`): 3x3, stride 1, no dilation,
    padding 1, groups 1, and at least :data:`MIN_CHANNELS` input and output channels.

    Before the transforms were sums (AVX2 against the direct blocked kernel, kernel alone): 256ch at 14x14
    0.69 ms against 1.42, 128ch at 28x28 0.79 against 1.23, 64ch at 56x56 even; on AVX-512 from 64 channels.
    With them (2026-11-30, Zen 4, kernel alone, best of 3): AVX2 code 64ch at 56x56 0.69 against 1.15 ms,
    AVX-512 32ch at 56x56 0.15 against 0.26, and whole models, shipped logs, interleaved: AVX2 code resnet18
    14.6-14.8 -> 12.9-13.0 ms, resnet50 37.1-37.4 -> 35.5-35.7 (their 64-channel layer1); AVX-512 unet 5.8-6.0
    -> 5.4-5.5, yolov8n 9.06-9.14 -> 8.69-8.70 (their 32-channel 3x3 convs)."""
    return (list(kernel) == [3, 3] and list(strides) == [1, 1] and list(dilation) == [1, 1]
            and list(padding) == [1, 1, 1, 1] and groups == 1
            and min(in_channels, out_channels) >= MIN_CHANNELS)


_PACK_COLUMNS = 1 << 13  # (o, i) pairs per chunk of pack_weight's product: 2.4 MB of float64 for F(4x4)


def pack_weight(weight: np.ndarray, in_block: int, out_block: int, tile: int) -> np.ndarray:
    """OIHW (3x3) -> ``U`` ``[tile + 2, tile + 2, O/out_block, I, out_block]`` (``in_block`` is the input's block;
    the layout does not depend on it)."""
    del in_block
    _, _, g = matrices(tile)
    alpha = tile + KERNEL - 1
    o, i, _, _ = weight.shape
    # g w g^T per (o, c) as one matrix product, kron(g, g) on the 9 taps: u[a, b] = sum_kl g[a, k] g[b, l] w[k, l],
    # in float64 on the taps already in the packed order, so the product lands in the final layout. Columns go
    # in chunks that keep the float64 temporaries in cache and reuse their memory: a fresh process faults in
    # every page of a whole-weight temporary, and ResNet-50's 13 weights took 280-410 ms the whole-array way
    # (float64 copy, product, cast, transposed copy) against 64 ms this way (Zen 4), with the same bits.
    taps = weight.reshape(o // out_block, out_block, i, KERNEL * KERNEL).transpose(3, 0, 2, 1)
    taps = taps.reshape(KERNEL * KERNEL, -1)
    kron = np.kron(g, g)
    u = np.empty((alpha * alpha, taps.shape[1]), weight.dtype)
    for start in range(0, taps.shape[1], _PACK_COLUMNS):
        u[:, start:start + _PACK_COLUMNS] = kron @ taps[:, start:start + _PACK_COLUMNS].astype(np.float64)
    return u.reshape(alpha, alpha, o // out_block, i, out_block)


def unpack_weight(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_weight` (``G`` has full column rank: its pseudo-inverse recovers ``g``)."""
    alpha, _, ob, i, bo = packed.shape
    _, _, g = matrices(alpha - KERNEL + 1)
    u = packed.astype(np.float64).transpose(0, 1, 2, 4, 3).reshape(alpha, alpha, ob * bo, i)
    g_inv = np.linalg.pinv(g)
    return np.einsum("ae,enoc,bn->ocab", g_inv, u, g_inv).astype(packed.dtype)


def transform(b: np.ndarray, e, value):
    """``sum_r b[r, e] value(r)`` for a loop variable ``e``, written out for each ``e``: the term of the first
    positive entry, then the others in ``r`` order added or subtracted by their sign, each multiplied by its
    entry's magnitude where that is not 1 (never by a zero); chosen by a ``Select`` over ``e`` that the unrolled
    schedule folds. ``b``'s entries must be integers, each column with a positive one."""
    if not (b == np.round(b)).all() or not (b > 0).any(axis=0).all():
        raise ValueError("the transform matrix must hold integers, and a positive entry in every column")

    def term(r, entry):
        return value(int(r)) if abs(entry) == 1 else value(int(r)) * float(abs(entry))

    sums = []
    for column in b.T:
        first = int(np.flatnonzero(column > 0)[0])
        total = term(first, column[first])
        for r in np.flatnonzero(column):
            if r != first:
                total = total + term(r, column[r]) if column[r] > 0 else total - term(r, column[r])
        sums.append(total)
    out = sums[-1]
    for k in range(len(sums) - 2, -1, -1):
        out = tirx.Select(e == k, sums[k], out)
    return out


def conv2d(data, weight, out_dtype: str = "float32"):
    """The Winograd conv2d (see the module doc) of NCHW[bi]c ``data`` with ``weight`` from :func:`pack_weight`
    (its first dimension gives the tile); padding 1 on every side, so the output has ``data``'s height and width.
    Each transform is two stages, rows then columns: in one, F(4x4)'s unrolled sums of sums were too large for
    TVM's simplifier and LLVM (a 256-channel kernel took 15 s to build)."""
    out_dtype = str(out_dtype)
    n, in_blocks, h, w, bi = (int(d) for d in data.shape)
    alpha, _, out_blocks, channels, bo = (int(d) for d in weight.shape)
    tile = alpha - KERNEL + 1
    a_np, b_np, _ = matrices(tile)
    tiles_h, tiles_w = -(-h // tile), -(-w // tile)
    per_image = tiles_h * tiles_w
    padded = topi.nn.pad(data, [0, 0, 1, 1, 0], [0, 0, tiles_h * tile + 1 - h, tiles_w * tile + 1 - w, 0],
                         name="pad_temp")

    def tile_pixel(p, ry, rx, cb, c):
        image, t = p // per_image, p % per_image
        return padded[image, cb, (t // tiles_w) * tile + ry, (t % tiles_w) * tile + rx, c].astype(out_dtype)

    shape = (alpha, alpha, in_blocks, n * per_image, bi)
    rows = te.compute(shape, lambda e, rb, cb, p, c: transform(b_np, e, lambda ra: tile_pixel(p, ra, rb, cb, c)),
                      name=INPUT_ROWS)
    v = te.compute(shape, lambda e, u, cb, p, c: transform(b_np, u, lambda rb: rows[e, rb, cb, p, c]), name=INPUT)
    rco, rci = te.reduce_axis((0, channels // bi), "rco"), te.reduce_axis((0, bi), "rci")
    m = te.compute((alpha, alpha, out_blocks, n * per_image, bo), lambda e, u, ob, p, o: te.sum(
        weight[e, u, ob, rco * bi + rci, o].astype(out_dtype) * v[e, u, rco, p, rci], axis=[rco, rci]),
        name=PRODUCT)
    # the columns' sums over whole tiles (tiles_h * tile rows): a tile's region is then the same for every tile
    cols = te.compute((n, out_blocks, tiles_h * tile, tiles_w, alpha, bo), lambda i, ob, y, tx, sb, o: transform(
        a_np, y % tile, lambda sa: m[sa, sb, ob, i * per_image + (y // tile) * tiles_w + tx, o]), name=OUTPUT_ROWS)
    return te.compute((n, out_blocks, h, w, bo), lambda i, ob, y, x, o: transform(
        a_np, x % tile, lambda sb: cols[i, ob, y, x // tile, sb, o]), name=ANCHOR)
