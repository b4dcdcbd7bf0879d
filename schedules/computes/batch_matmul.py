"""Batched MatMul of two activations (attention's ``Q x K^T`` and ``scores x V``), or of an activation and a
constant that is not a dense's 2-D weight: ``A[..., M, K] x B[..., K, N]`` with numpy broadcasting of the
leading (batch) dims, as ONNX MatMul and ``relax.matmul`` define it.

``B`` read through a ``permute_dims`` that is part of the partition (``K^T``: the exporters' ``Transpose``
before the MatMul) is copied once per batch into ``[K, N]`` order (stage :data:`PACK`), so the product
streams whole vectors of N from it instead of gathering each one across K-strided rows.
"""

from __future__ import annotations

from tvm import te

from .. import families

ANCHOR = families.BATCH_MATMUL.anchor_block
PACK = "batch_matmul_pack"
CROP = "batch_matmul_crop"
TRANSPOSE = "T_transpose"  # topi.transpose's stage: a permute_dims the partition holds


def _broadcast(tensor, batch: tuple, *last):
    """``tensor[batch..., *last]`` with its batch dims aligned right to the output's and broadcast where 1."""
    dims = len(tensor.shape) - 2
    index = [0 if int(tensor.shape[d]) == 1 else v for d, v in enumerate(batch[len(batch) - dims:])]
    return tensor[tuple(index) + last]


def padded_width(n: int, lanes: int | None) -> int:
    """N as the product computes it: rounded up to whole vectors when it is wider than one and no vector of 4
    or more lanes divides it (a 197-token sequence), else N."""
    if not lanes or n <= lanes or any(n % v == 0 for v in (lanes, 8, 4) if v <= lanes):
        return n
    return -(-n // lanes) * lanes


def batch_matmul(call, a, b, lanes: int | None = None, out_dtype: str | None = None):
    """``relax.matmul`` of rank >= 2 operands into ``call``'s output shape; ``B`` packed (see the module).
    An N no vector divides is computed :func:`padded_width` wide from a zero-padded pack, then cropped."""
    out = [int(d) for d in call.ty.shape]
    k, n = int(a.shape[-1]), out[-1]
    wide = padded_width(n, lanes)
    if wide != n:
        source = b
        b = te.compute(tuple(b.shape[:-1]) + (wide,), lambda *i: te.if_then_else(
            i[-1] < n, source[i[:-1] + (te.min(i[-1], n - 1),)], te.const(0.0, b.dtype)), name=PACK)
    elif isinstance(b.op, te.ComputeOp) and b.op.name == TRANSPOSE:
        b = te.compute(b.shape, lambda *i: b[i], name=PACK)
    acc = out_dtype or str(a.dtype)
    r = te.reduce_axis((0, k), name="k")
    product = te.compute(out[:-1] + [wide], lambda *i: te.sum(
        _broadcast(a, i[:-2], i[-2], r).astype(acc) * _broadcast(b, i[:-2], r, i[-1]).astype(acc), axis=r),
        name=ANCHOR, tag=families.BATCH_MATMUL.name)
    return product if wide == n else te.compute(out, lambda *i: product[i], name=CROP)
