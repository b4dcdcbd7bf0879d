"""``MatMulInteger`` with a constant weight computed in int32 by tvmfuse's INT8 dense kernel (CPU targets with INT8
kernels), instead of as a float32 MatMul (:mod:`.integer_ops`).

That is what a dynamically quantized model spends its time on (``quantize_dynamic`` on a transformer or a CRNN:
every MatMul is ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul``). The float32 path reads the weight
as float32, four times the bytes, and multiplies on FMA units; the INT8 dense kernel multiplies uint8 codes by
int8 weights 64 at a time with ``vpdpbusd`` (VNNI), or adds int16 pairs without it.

Arithmetic. ONNX's result is ``y[m, n] = sum_k (a[m, k] - za) (w[k, n] - zw)`` in int32, ``za`` computed at run
time. The kernel multiplies uint8 by int8, so the weight is stored as ``w8 = w - 128`` (uint8 weights) or ``w``
(int8 weights), ``shift = 128 - zw`` or ``-zw``, and

    y[m, n] = sum_k a[m, k] w8[k, n] + shift * sum_k a[m, k] - za * C[n],   C[n] = sum_k (w[k, n] - zw),

every term an integer, so the result is exact (``|y| < K * 255 * 255 < 2**31`` for K up to 33,000): the kernel
sums ``a * w8`` and adds ``bias[n] = -za * C[n]`` (a run-time vector, one multiply per column) in its int32
epilogue; the row term, where ``shift`` is not 0, is one int32 row sum and an add that TVM fuses into the
``Cast`` and ``Mul`` after it. ``quantize_dynamic``'s default int8 weights with zero point 0 have no row term.
The output is then the integer op's own, bit for bit, and what follows (``Cast``, ``Mul`` by the scales, the
bias) runs as the model wrote it.

Taken for ``MatMulInteger`` (default domain) with a uint8 input, a constant 2-D weight and scalar zero points (a per-row or per-column one stays with :mod:`.integer_ops` / :mod:`.qlinear`).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


DOMAIN = "tvmfuse"
OP_TYPE = "IntegerMatMul"
#: the backend's ``int8_weights`` whose INT8 kernels these rewrites use
PACKINGS = ("amx", "vnni", "avxvnni", "pairs")


def scalar(value: np.ndarray | None) -> bool:
    return value is None or value.size == 1


def scalar_zero_point(rw, za: str) -> bool:
    """Whether the data zero point ``za`` is absent, or one value (a constant, or computed at run time)."""
    if not za:
        return True
    if za in rw.initializers:
        return scalar(numpy_helper.to_array(rw.initializers[za]))
    return rw.shapes.get(za) in ((), (1,))


def weight_terms(w: np.ndarray, zw: np.ndarray | None) -> tuple[np.ndarray, int, np.ndarray]:
    """``(w8 [N, K] int8, shift, -C [N] int32)`` of the weight ``w [K, N]`` and its zero point."""
    z = int(np.asarray(zw).reshape(())) if zw is not None else 0
    wide = w.astype(np.int32)
    if w.dtype == np.uint8:
        w8, shift = wide - 128, 128 - z
    else:
        w8, shift = wide, -z
    return np.ascontiguousarray(w8.T).astype(np.int8), shift, -(wide - z).sum(axis=0).astype(np.int32)


def node(rw, node: onnx.NodeProto, packing: str, readers: dict, outputs: set):
    """``(IntegerMatMul node, new initializers, replaced nodes)`` for ``node``; None when it does not apply."""
    from tvmfuse.schedules import families

    from ..passes.int8 import kernels

    inputs = list(node.input) + [""] * (4 - len(node.input))
    a, w_name, za, zw = inputs[:4]
    shape = rw.shapes.get(a)
    w = numpy_helper.to_array(rw.initializers[w_name]) if w_name in rw.initializers else None
    if w is None or w.ndim != 2 or w.dtype not in (np.uint8, np.int8):
        return None
    if shape is not None and (not shape or shape[-1] not in (w.shape[0], -1)):  # unknown after a tvmfuse node
        return None
    if rw.dtypes.get(a) != TensorProto.UINT8:
        return None
    zw_value = numpy_helper.to_array(rw.initializers[zw]) if zw in rw.initializers else None
    if (zw and zw_value is None) or not scalar(zw_value) or not scalar_zero_point(rw, za):
        return None
    w8, shift, neg_c = weight_terms(w, zw_value)
    family = families.DENSE
    packed = kernels.packed_weight(family.int8, w8, family.int8.pack, packing)
    prefix = node.name or node.output[0]
    names = [rw.fresh(f"{w_name}_packed"), rw.fresh(f"{w_name}_neg_column_sums") if za else ""]
    new = [numpy_helper.from_array(packed, names[0])]
    if za:  # the column term -za * C[n]; a zero point of 0 has none
        new.append(numpy_helper.from_array(neg_c, names[1]))
    op = helper.make_node(OP_TYPE, [a, za, names[0], names[1]], list(node.output), name=prefix, domain=DOMAIN,
                          out_features=int(w.shape[1]), shift=int(shift),
                          exact_pairs=int(kernels.exact_pairs(family.int8, packed, packing)))
    return op, new, [node]


def converter():
    """The ONNX importer's converter class for ``IntegerMatMul`` (imports TVM)."""
    from tvm import relax, te
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    from tvmfuse.schedules import families
    from tvmfuse.schedules.computes import int8

    from ..passes.utils import OPAQUE, add_kernel

    class IntegerMatMul(OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            a, za, weight, neg_c = inputs
            shape = [int(d) for d in a.ty.shape]
            rows, k, n = int(np.prod(shape[:-1])), shape[-1], int(attr["out_features"])
            data = bb.normalize(relax.op.reshape(a, [rows, k])) if len(shape) != 2 else a  # rank 1 too
            if za is None:
                bias = relax.const(np.zeros(n, np.int32))
            else:
                zero = bb.normalize(relax.op.reshape(relax.op.astype(za, "int32"), [1]))
                bias = bb.normalize(relax.op.multiply(zero, neg_c))
            tensors = [te.placeholder((rows, k), "uint8", name="data"),
                       te.placeholder(tuple(int(d) for d in weight.ty.shape), str(weight.ty.dtype), name="weight"),
                       te.placeholder((n,), "int32", name="bias")]
            out = int8.dense_compute(*tensors, None, out_features=n, epilogue=int8.Epilogue(out_dtype="int32"))
            func = int8.prim_func(tensors + [out]).with_attrs({
                "tvmfuse.partition": "integer_matmul", "tvmfuse.family": families.int8_kernel_name(families.DENSE),
                "tvmfuse.layout": families.DENSE.int8.layout, "tvmfuse.ops": "matmul_integer", "op_pattern": OPAQUE})
            if int(attr.get("exact_pairs", 0)):
                func = func.with_attr(int8.EXACT_PAIRS_ATTR, True)
            gv = add_kernel(bb, func, "tvmfuse_integer_matmul")
            y = bb.normalize(relax.call_tir(gv, [data, weight, bias], relax.TensorType((rows, n), "int32")))
            shift = int(attr.get("shift", 0))
            if shift:
                sums = relax.op.sum(relax.op.astype(data, "int32"), axis=[1], keepdims=True)
                y = relax.op.add(y, relax.op.multiply(sums, relax.const(np.int32(shift))))
            return relax.op.reshape(y, shape[:-1] + [n]) if len(shape) != 2 else y

    return IntegerMatMul
