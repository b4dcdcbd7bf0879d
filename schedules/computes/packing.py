"""Weight packings of the blocked and NCHW kernels (done once, at compile time, in numpy) and
:class:`KernelLayout`, how a kernel's arguments differ from its partition function's.

- conv2d ``OIHW -> [O/bo, I/bi, kh, kw, bi, bo]`` (``bi = 1`` when the kernel reads NCHW input, e.g. the
  stem); channels that do not fill a last block are padded with zero weights;
- the NCHW conv2d kernel's ``OIHW -> [O/oc_block, I, kh, kw, oc_block]``;
- depthwise ``[C, 1, kh, kw] -> [C/b, kh, kw, b]``; a dense's ``[K, N] -> [N/n, K, n]``.
"""

from __future__ import annotations

import numpy as np

from . import winograd
from .blocked import blocked_shape


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
    last block are padded with zero weights (a conv written NCHW through :func:`.blocked.plain_crop`)."""
    o, i = weight.shape[:2]
    weight = np.pad(weight, [(0, -o % out_block), (0, -i % in_block), (0, 0), (0, 0)])  # padded channels: zeros
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
    """``[C, 1, kh, kw] -> [C/block, kh, kw, block]`` (padded channels: zeros)."""
    weight = np.pad(weight, [(0, -weight.shape[0] % block), (0, 0), (0, 0), (0, 0)])
    c, _, h, w = weight.shape
    return np.ascontiguousarray(weight.reshape(c // block, block, h, w).transpose(0, 2, 3, 1))


def unpack_depthwise_weight(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_depthwise_weight`."""
    c, h, w, b = packed.shape
    return packed.transpose(0, 3, 1, 2).reshape(c * b, 1, h, w)


class KernelLayout:
    """How a kernel's arguments differ from its partition function's (NCHW activations, OIHW weights).

    ``weights``: parameter index -> packing, ``("oc", oc_block)`` (NCHW kernel, :func:`pack_weight`),
    ``("conv", bi, bo)``, ``("winograd", bi, bo, tile)`` (:func:`winograd.pack_weight`), ``("depthwise", b)`` or
    ``("panels", n_block)`` (:func:`pack_dense_weight`);
    ``activations``: parameter index -> block of an input
    passed NCHW[b]c; ``out_block``: the output's block (None: NCHW); ``plain_out``: the output is computed in
    blocks of ``out_block`` (channels padded) and written NCHW (:func:`.blocked.plain_crop`).
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
                                   "winograd": "Winograd F({2}x{2},3x3) {1}o", "panels": "NK{}n"}[kind].format(*blocks)
        return text

    def shape(self, index: int, shape: list[int]) -> list[int]:
        """Parameter ``index``'s shape as the kernel reads it, from its shape in the partition function."""
        if index in self.activations:
            return blocked_shape(shape, self.activations[index])
        if index not in self.weights:
            return shape
        kind, *b = self.weights[index]
        if kind == "panels":
            k, n = shape
            return [n // b[0], k, b[0]]
        o, i, h, w = shape
        if kind == "oc":
            return [o // b[0], i, h, w, b[0]]
        if kind == "conv":
            return [-(-o // b[1]), -(-i // b[0]), h, w, b[0], b[1]]
        if kind == "winograd":
            alpha = b[2] + winograd.KERNEL - 1
            return [alpha, alpha, o // b[1], i, b[1]]
        return [-(-o // b[0]), h, w, b[0]]

    def pack(self, index: int, weight: np.ndarray) -> np.ndarray:
        """Parameter ``index``'s constant as the kernel reads it."""
        if index not in self.weights:
            return weight
        kind, *blocks = self.weights[index]
        return _PACK[kind](weight, *blocks)

    def plain(self, arrays: list, shapes: list | None = None) -> list:
        """A kernel call's arrays (inputs, then the output) in the partition function's layouts; ``shapes`` (the
        partition function's parameter shapes, then its output's) crops the padded channels of padded blocks."""
        out = list(arrays)
        for index, (kind, *_) in self.weights.items():
            out[index] = _UNPACK[kind](out[index])
            if self.plain_out:  # the zero weights of the padded output channels
                out[index] = out[index][:out[-1].shape[1]]
        for index in list(self.activations) + ([len(out) - 1] if self.blocked and not self.plain_out else []):
            n, cb, h, w, b = out[index].shape
            out[index] = out[index].transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
        if shapes is not None:
            out = [a if a is None or len(a.shape) != len(shape) else a[tuple(slice(0, int(d)) for d in shape)]
                   for a, shape in zip(out, shapes)]
        return out


_PACK = {"oc": pack_weight, "conv": pack_conv_weight, "depthwise": pack_depthwise_weight,
         "winograd": winograd.pack_weight, "panels": pack_dense_weight}
_UNPACK = {"oc": unpack_weight, "conv": unpack_conv_weight, "depthwise": unpack_depthwise_weight,
           "winograd": winograd.unpack_weight, "panels": unpack_dense_weight}
