"""TransposeConvToConv: a transposed conv whose stride equals its kernel becomes a 1x1 conv + depth-to-space.

Text detectors (PP-OCR's DB head, every version in the corpus) upsample with ``ConvTranspose`` kernel 2,
stride 2, no padding. TVM's default kernel for it scattered over the whole output: 78 % of en_ppocrv3_det's
time (124 of 159 ms) was its two ConvTranspose kernels. With stride == kernel the output windows do not
overlap: ``y[n, o, s*i + a, s*j + b] = sum_c x[n, c, i, j] * W[c, o, a, b]``, which is a 1x1 conv with
``O*kh*kw`` output channels (weight ``W'[(o, a, b), c] = W[c, o, a, b]``, packed at compile time) followed by
a depth-to-space (reshape, transpose, reshape). The conv then runs on the conv2d family's kernel, and a
following per-channel bias ``add`` is moved into it (each output channel's bias repeated ``kh*kw`` times).

Groups other than 1, padding, output padding and dilation keep TVM's default kernel.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvmfuse.schedules.families import static_shape

from .utils import const_array, rewrite_functions

_CONV_T, _ADD, _RESHAPE = (tvm.ir.Op.get(n) for n in ("relax.nn.conv2d_transpose", "relax.add", "relax.reshape"))


def _rewritable(call) -> bool:
    a = call.attrs
    w = const_array(call.args[1])
    xs = static_shape(call.args[0])
    return (w is not None and w.ndim == 4 and xs is not None and len(xs) == 4 and int(a.groups) == 1
            and tuple(int(s) for s in a.strides) == w.shape[2:]
            and all(int(p) == 0 for p in a.padding) and all(int(p) == 0 for p in a.output_padding)
            and all(int(d) == 1 for d in a.dilation)
            and (a.data_layout, a.kernel_layout, a.out_layout) == ("NCHW", "IOHW", "NCHW")
            and (a.out_dtype is None or str(a.out_dtype) in ("", str(call.args[0].ty.dtype))))


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self._made = []  # (the transposed var of each depth-to-space this pass wrote, its conv, dims)

    def _conv_transpose(self, call):
        if not _rewritable(call):
            return None
        w = const_array(call.args[1])
        c_in, c_out, kh, kw = w.shape
        n, _, h, wd = static_shape(call.args[0])
        packed = np.ascontiguousarray(w.transpose(1, 2, 3, 0)).reshape(c_out * kh * kw, c_in, 1, 1)
        conv = self.builder_.emit(relax.op.nn.conv2d(call.args[0], relax.const(packed, str(w.dtype))))
        return self._depth_to_space(conv, (n, c_out, h, wd, kh, kw))

    def _depth_to_space(self, conv, dims):
        n, c_out, h, wd, kh, kw = dims
        split = self.builder_.emit(relax.op.reshape(conv, (n, c_out, kh, kw, h, wd)))
        moved = self.builder_.emit(relax.op.permute_dims(split, [0, 1, 4, 2, 5, 3]))
        self._made.append((moved, conv, dims))
        return relax.op.reshape(moved, (n, c_out, h * kh, wd * kw))

    def _made_by_us(self, var):
        """``(conv, dims)`` when ``var`` is bound to the last reshape of a depth-to-space this pass wrote."""
        if not isinstance(var, relax.Var):
            return None
        value = self.lookup_binding(var)
        if not (isinstance(value, relax.Call) and value.op == _RESHAPE):
            return None
        for moved, conv, dims in self._made:
            if value.args[0].same_as(moved):
                return conv, dims
        return None

    def _bias(self, call):
        a, b = call.args
        made, value = self._made_by_us(a), const_array(b)
        if made is None or value is None:
            return None
        conv, dims = made
        c_out, kh, kw = dims[1], dims[4], dims[5]
        if value.size != c_out or value.ndim not in (3, 4) or value.shape[-3:] != (c_out, 1, 1):
            return None  # not one value per output channel
        if static_shape(call) != static_shape(a):
            return None
        bias = np.repeat(value.reshape(c_out), kh * kw).reshape(1, c_out * kh * kw, 1, 1).astype(value.dtype)
        added = self.builder_.emit(relax.op.add(conv, relax.const(bias, str(value.dtype))))
        return self._depth_to_space(added, dims)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        new = None
        if call.op == _CONV_T:
            new = self._conv_transpose(call)
        elif call.op == _ADD:
            new = self._bias(call)
        return call if new is None else new


@tvm.transform.module_pass(opt_level=0, name="TransposeConvToConv")
def TransposeConvToConv(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return rewrite_functions(mod, _Rewrite)
