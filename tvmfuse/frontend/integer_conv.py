"""``ConvInteger`` with a constant weight on tvmfuse's INT8 conv2d kernel, exact in int32, as
:mod:`.integer_matmul` does for ``MatMulInteger`` (the arithmetic is in its docstring).

A convolution pads its input with the zero point (a padded tap adds ``(za - za) (w - zw) = 0``), so the kernel
pads with ``za`` read at run time, sums ``x_pad * w8``, and adds ``bias[o] = b[o] - za * C[o]`` (``C[o]`` the sum
of ``w - zw`` over the window and the input channels; ``b`` the model's int32 bias when the conv's only reader
adds one, as ddddocr's ``common_old.onnx`` does: the add is absorbed). The row term of a uint8 weight becomes
a window term, ``shift * T[b, y, x]`` with ``T`` the sum of the padded input over each output's window and all
input channels: a small kernel of its own (:func:`window_sums`), added in int32.

Taken for ``ConvInteger`` with a uint8 NCHW input, a constant OIHW weight, one group and scalar zero points.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import integer_matmul as base
from .integer_ops import rounded_bias

OP_TYPE = "IntegerConv"


def _int32_bias(rw, node: onnx.NodeProto, channels: int, readers: dict, outputs: set) -> onnx.NodeProto | None:
    """The ``Add(result, b)`` that is the conv's only reader, ``b`` one int32 value per output channel (``[1, O, 1,
    1]``, ``[O, 1, 1]``) or a single one, as its known shape says: what the kernel's bias can take."""
    after = readers.get(node.output[0], [])
    if len(after) != 1 or after[0].op_type != "Add" or node.output[0] in outputs:
        return None
    add = after[0]
    if len(add.input) != 2 or list(add.input).count(node.output[0]) != 1:
        return None
    shape = rw.shapes.get(next(n for n in add.input if n != node.output[0]))
    if shape is None or -1 in shape:
        return None
    per_channel = len(shape) >= 3 and tuple(shape[-3:]) == (channels, 1, 1) and all(d == 1 for d in shape[:-3])
    return add if per_channel or int(np.prod(shape)) == 1 else None


def _rounded(bias: str, producers: dict) -> str:
    """``q`` of a bias written ``[Reshape](Cast(to=int32)(q))`` (:func:`.integer_ops.rounded_bias`): the same
    integers as float32, which the kernel's bias converts with a plain ``astype``. TVM's importer spells ONNX's
    float-to-int32 Cast with its out-of-range cases in int64 arithmetic, which took LLVM 0.4 s a layer to build.
    "" otherwise."""
    found = rounded_bias(bias, producers)
    return found[1].input[0] if found is not None else ""


def node(rw, conv: onnx.NodeProto, packing: str, readers: dict, outputs: set):
    """``(IntegerConv node, new initializers, replaced nodes)`` for ``conv``; None when it does not apply."""
    from tvmfuse.schedules import families

    from ..passes.int8 import kernels

    a, w_name, za, zw = (list(conv.input) + [""] * 4)[:4]
    w = numpy_helper.to_array(rw.initializers[w_name]) if w_name in rw.initializers else None
    attrs = {x.name: helper.get_attribute_value(x) for x in conv.attribute}
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    if w is None or w.ndim != 4 or w.dtype not in (np.uint8, np.int8) or attrs.get("group", 1) != 1 \
            or (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) != "NOTSET":
        return None
    shape = rw.shapes.get(a)
    if rw.dtypes.get(a) != onnx.TensorProto.UINT8 or (shape is not None and len(shape) != 4):
        return None
    zw_value = numpy_helper.to_array(rw.initializers[zw]) if zw in rw.initializers else None
    if (zw and zw_value is None) or not base.scalar(zw_value) or not base.scalar_zero_point(rw, za):
        return None
    o = w.shape[0]
    w8, shift, neg_c = base.weight_terms(w.reshape(o, -1).T, zw_value)
    family = families.CONV2D
    packed = kernels.packed_weight(family.int8, w8.reshape(w.shape), family.int8.pack, packing)
    add = _int32_bias(rw, conv, o, readers, outputs)
    names = [rw.fresh(f"{w_name}_packed"), rw.fresh(f"{w_name}_neg_sums") if za else ""]
    new = [numpy_helper.from_array(packed, names[0])] + ([numpy_helper.from_array(neg_c, names[1])] if za else [])
    bias = "" if add is None else next(n for n in add.input if n != conv.output[0])
    rounded = _rounded(bias, rw.producers) if bias else ""
    out = conv.output[0] if add is None else add.output[0]
    made = helper.make_node(OP_TYPE, [a, za, names[0], names[1], rounded or bias], [out], name=conv.name or out,
                            domain=base.DOMAIN, out_channels=o, shift=int(shift),
                            kernel_shape=list(w.shape[2:]), strides=list(attrs.get("strides", [1, 1])),
                            pads=list(attrs.get("pads", [0, 0, 0, 0])), dilations=list(attrs.get("dilations", [1, 1])),
                            exact_pairs=int(kernels.exact_pairs(family.int8, packed, packing)))
    return made, new, [conv] + ([add] if add is not None else [])


def window_sums(shape, kernel, strides, pads, dilations):
    """``(data [N, C, H, W] uint8, za [1] uint8) -> T [N, OH, OW] int32``: the sum of the input padded with
    ``za`` over each output's window and every input channel, and ``(N, OH, OW)``. Scheduled here (rows in
    parallel, columns in vectors): the channel sums of each row into a padded plane, then the window's taps
    added a row at a time."""
    n, c, h, w = (int(d) for d in shape)
    (kh, kw), (sh, sw), (dh, dw), (top, left, bottom, right) = kernel, strides, dilations, pads
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (w + left + right - dw * (kw - 1) - 1) // sw + 1
    from tvm import tirx

    func = _window_sums(tuple(kernel), tuple(strides), tuple(pads), tuple(dilations))
    shapes = ((n, c, h, w), (1,), (n, oh, ow))
    buffers = {param: tirx.decl_buffer(shape, dtype, name=name) for param, shape, dtype, name in
               zip(func.params, shapes, ("uint8", "uint8", "int32"), ("data", "zero_point", "window_sums"))}
    return func.specialize(buffers), (n, oh, ow)


@functools.lru_cache(maxsize=None)
def _window_sums(kernel, strides, pads, dilations):
    """:func:`window_sums` for symbolic sizes, parsed once per window (TVMScript takes ~0.1 s a parse)."""
    from tvm.script import tirx as T

    from tvmfuse.schedules.backend import SCHEDULED_BY

    (kh, kw), (sh, sw), (dh, dw), (top, left, bottom, right) = kernel, strides, dilations, pads

    @T.prim_func(private=True)
    def sums(d: T.handle, z: T.handle, o: T.handle):
        n, c, h, w, oh, ow = T.int32(), T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        data = T.match_buffer(d, (n, c, h, w), "uint8")
        za = T.match_buffer(z, (1,), "uint8")
        out = T.match_buffer(o, (n, oh, ow), "int32")
        plane = T.alloc_buffer((n, h + top + bottom, w + left + right), "int32")
        for b in range(n):
            for y in T.parallel(h + top + bottom):
                for x in T.vectorized(w + left + right):
                    plane[b, y, x] = T.Cast("int32", za[0]) * c
            for y in T.parallel(h):
                for x in T.vectorized(w):
                    plane[b, y + top, x + left] = 0
                for ch in range(c):
                    for x in T.vectorized(w):
                        plane[b, y + top, x + left] = plane[b, y + top, x + left] + T.Cast("int32", data[b, ch, y, x])
            for y in T.parallel(oh):
                for x in T.vectorized(ow):
                    out[b, y, x] = 0
                for ky, kx in T.grid(kh, kw):
                    for x in T.vectorized(ow):
                        out[b, y, x] = out[b, y, x] + plane[b, y * sh + ky * dh, x * sw + kx * dw]

    return sums.with_attrs({"tirx.noalias": True, "tirx.is_scheduled": True, SCHEDULED_BY: "tvmfuse.window_sums"})


def converter():
    """The ONNX importer's converter class for ``IntegerConv`` (imports TVM)."""
    from tvm import relax, te
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    from tvmfuse.schedules import families
    from tvmfuse.schedules.computes import int8

    from ..passes.utils import OPAQUE, add_kernel

    class IntegerConv(OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            a, za, weight, neg_c, bias = (list(inputs) + [None] * 5)[:5]
            shape = [int(d) for d in a.ty.shape]
            o = int(attr["out_channels"])
            conv = {"strides": tuple(attr["strides"]), "padding": tuple(attr["pads"]),
                    "dilation": tuple(attr["dilations"])}
            zero = relax.const(np.zeros(1, np.uint8)) if za is None else bb.normalize(relax.op.reshape(za, [1]))
            total = relax.const(np.zeros(o, np.int32))
            if za is not None:
                total = bb.normalize(relax.op.multiply(relax.op.astype(zero, "int32"), neg_c))
            if bias is not None:  # int32, or the float32 integers of a bias rounded at run time (_rounded)
                single = int(np.prod([int(d) for d in bias.ty.shape])) == 1
                bias = relax.op.astype(bias, "int32") if str(bias.ty.dtype) != "int32" else bias
                bias = relax.op.broadcast_to(relax.op.reshape(bias, [1]), [o]) if single else relax.op.reshape(bias, [o])
                total = bb.normalize(relax.op.add(total, bias))
            tensors = [te.placeholder(shape, "uint8", name="data"),
                       te.placeholder(tuple(int(d) for d in weight.ty.shape), str(weight.ty.dtype), name="weight"),
                       te.placeholder((o,), "int32", name="bias"), te.placeholder((1,), "uint8", name="zero_point")]
            out = int8.conv2d_compute(*tensors[:3], None, out_channels=o, input_zero_point=tensors[3],
                                      epilogue=int8.Epilogue(out_dtype="int32"), **conv)
            func = int8.prim_func(tensors + [out]).with_attrs({
                "tvmfuse.partition": "integer_conv", "tvmfuse.family": families.int8_kernel_name(families.CONV2D),
                "tvmfuse.layout": families.CONV2D.int8.layout, "tvmfuse.ops": "conv_integer", "op_pattern": OPAQUE})
            if int(attr.get("exact_pairs", 0)):
                func = func.with_attr(int8.EXACT_PAIRS_ATTR, True)
            gv = add_kernel(bb, func, "tvmfuse_integer_conv")
            out_shape = [int(d) for d in out.shape]
            y = bb.normalize(relax.call_tir(gv, [a, weight, total, zero], relax.TensorType(out_shape, "int32")))
            shift = int(attr.get("shift", 0))
            if not shift:
                return y
            sums, (n, oh, ow) = window_sums(shape, tuple(attr["kernel_shape"]), conv["strides"], conv["padding"],
                                            conv["dilation"])
            sums_gv = add_kernel(bb, sums.with_attr("op_pattern", OPAQUE), "tvmfuse_window_sums")
            t = bb.normalize(relax.call_tir(sums_gv, [a, zero], relax.TensorType((n, oh, ow), "int32")))
            window = relax.op.reshape(relax.op.multiply(t, relax.const(np.int32(shift))), [n, 1, oh, ow])
            return relax.op.add(y, window)

    return IntegerConv
