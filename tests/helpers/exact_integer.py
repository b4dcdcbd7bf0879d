"""References for dynamically quantized models that do not depend on the CPU they run on.

``exact`` runs a model on onnx's reference evaluator, whose ConvInteger / MatMulInteger sum in int32 as the
ONNX spec says. ``saturating`` runs it the way onnxruntime's U8S8 kernels do on CPUs without VNNI (AVX2, and
AVX-512 before Cascade Lake): ``vpmaddubsw`` multiplies unsigned activations by signed weights and adds each
pair of adjacent products into an int16 that saturates at +-32767, so a pair of large codes is clipped before
the int32 sum. With full-range int8 weights (``quantize_dynamic``'s default; its ``reduce_range`` is the
documented remedy) onnxruntime's results then depend on the CPU; these two references make a test's bound
hold on every CPU, and show which of onnxruntime or tvmfuse moved.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun


def exact(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The model's outputs with exact integer arithmetic (onnx's reference evaluator)."""
    return ReferenceEvaluator(model).run(None, feeds)


def saturating(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The outputs with ConvInteger / MatMulInteger summed through int16 pairs, as onnxruntime without VNNI."""
    return ReferenceEvaluator(model, new_ops=[ConvInteger, MatMulInteger]).run(None, feeds)


def pair_saturated_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for raw uint8 ``a`` [M, K] and int8 ``b`` [K, N], each adjacent pair of products along K added
    and clipped to int16 before the int64 sum (``vpmaddubsw``, then ``vpmaddwd`` with ones)."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    if a.shape[1] % 2:
        a, b = np.pad(a, ((0, 0), (0, 1))), np.pad(b, ((0, 1), (0, 0)))
    pairs = a[:, 0::2, None] * b[None, 0::2, :] + a[:, 1::2, None] * b[None, 1::2, :]
    return np.clip(pairs, -32768, 32767).sum(axis=1)


def _zero_point(zp) -> int:
    if zp is not None and np.asarray(zp).size != 1:
        raise NotImplementedError("the saturating reference takes one activation zero point")
    return 0 if zp is None else int(np.asarray(zp).reshape(()))


def _weight_zero(zp) -> None:
    if zp is not None and np.any(zp):
        raise NotImplementedError("the saturating reference takes symmetric (zero point 0) weights")


class ConvInteger(OpRun):  # the evaluator matches a new op by its class name
    op_domain = ""

    def _run(self, x, w, x_zero_point=None, w_zero_point=None, auto_pad=None, dilations=None, group=None,
             kernel_shape=None, pads=None, strides=None):
        _weight_zero(w_zero_point)
        if (group or self.group or 1) != 1 or any(d != 1 for d in (dilations or self.dilations or [1])):
            raise NotImplementedError("the saturating reference takes dense, undilated convs")
        zp = _zero_point(x_zero_point)
        pads, strides = pads or self.pads or [0] * 4, strides or self.strides or [1, 1]
        n, _, h, wd = x.shape
        o, _, kh, kw = w.shape
        # The unsigned codes as the kernel reads them: padding holds the zero point, and the zero point's
        # share is taken off the int32 sum afterwards (zero point x the weight's column sum).
        xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=zp)
        oh, ow = (h + pads[0] + pads[2] - kh) // strides[0] + 1, (wd + pads[1] + pads[3] - kw) // strides[1] + 1
        out = np.empty((n, o, oh, ow), np.int32)
        wm = w.reshape(o, -1).T
        for b in range(n):
            cols = np.stack([xp[b, :, i * strides[0]:i * strides[0] + kh, j * strides[1]:j * strides[1] + kw].ravel()
                             for i in range(oh) for j in range(ow)])
            acc = pair_saturated_dot(cols, wm) - zp * wm.astype(np.int64).sum(axis=0)
            out[b] = acc.T.reshape(o, oh, ow)
        return (out,)


class MatMulInteger(OpRun):
    op_domain = ""

    def _run(self, a, b, a_zero_point=None, b_zero_point=None):
        _weight_zero(b_zero_point)
        zp = _zero_point(a_zero_point)
        return ((pair_saturated_dot(a, b) - zp * b.astype(np.int64).sum(axis=0)).astype(np.int32),)
