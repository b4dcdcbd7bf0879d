"""TransposeConvToConv: a transposed conv becomes a stride-1 conv with ``s*s`` phases + depth-to-space (+ crop).

Text detectors (PP-OCR's DB head, every version in the corpus) upsample with ``ConvTranspose`` kernel 2,
stride 2, no padding; U-Nets with kernel 3, stride 2, padding 1, output padding 1. TVM's default kernel for it
scatters over the whole output: 78 % of en_ppocrv3_det's time (124 of 159 ms) was its two ConvTranspose
kernels, 84 % of the zoo's U-Net (41.7 of 49.7 ms) its one 3x3 stride-2 ConvTranspose.

The sub-pixel form (per axis, stride ``s``, kernel ``k``, ``M = ceil(k / s)``): output row ``s*q + a`` (phase
``a``) receives ``x[q - m] * W[a + s*m]`` for ``m < M``, a correlation of the input padded by ``M - 1`` with the
taps reversed. So one ``M x M`` conv with ``O*s*s`` output channels (weight
``V[(a, b, o), c, t, u] = W[c, o, a + s*(M-1-t), b + s*(M-1-u)]``, zero beyond the kernel, packed at compile
time) computes every phase; a depth-to-space interleaves them and a slice removes the transposed conv's
padding (and adds its output padding). With stride == kernel and no padding this is a 1x1 conv and no slice.
The conv runs on the conv2d family's kernel, and a following per-channel bias ``add`` is moved into it (each
output channel's bias repeated ``s*s`` times). For ``k = 3, s = 2`` the 2x2 phase kernels hold 16 taps for
the 9 of the kernel: twice the multiply-adds, on a kernel that runs them ~100x faster.

A grouped transposed conv becomes a grouped phase conv: each group's phases are a block of its output channels
(U-Net's depthwise 2x2 stride-2 upsampling is a 1x1 conv with 4 outputs per channel). Dilation keeps TVM's
default kernel.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from tvmfuse.schedules.families import static_shape

from .utils import const_array, rewrite_call, rewrite_functions

_CONV_T, _ADD, _RESHAPE, _SLICE, _BN = (tvm.ir.Op.get(n) for n in (
    "relax.nn.conv2d_transpose", "relax.add", "relax.reshape", "relax.strided_slice", "relax.nn.batch_norm"))
# The depth-to-space's transpose: [N, groups, sh, sw, C/groups, H, W] -> [N, groups, C/groups, H, sh, W, sw].
DEPTH_TO_SPACE_AXES = (0, 1, 4, 5, 2, 6, 3)


class _Phases(NamedTuple):
    """A phase conv's output ``[n, channels * sh * sw, h, w]`` and the depth-to-space after it."""

    n: int
    channels: int  # the transposed conv's output channels
    h: int
    w: int
    sh: int
    sw: int
    crop: tuple | None  # (y0, y1, x0, x1) of the interleaved map, None: all of it
    groups: int


def _rewritable(call) -> bool:
    a = call.attrs
    w = const_array(call.args[1])
    xs = static_shape(call.args[0])
    return (w is not None and w.ndim == 4 and xs is not None and len(xs) == 4 and int(a.groups) >= 1
            and w.shape[0] % int(a.groups) == 0 and all(int(d) == 1 for d in a.dilation)
            and all(int(s) >= 1 for s in a.strides)
            and all(int(p) >= 0 for p in a.padding) and len(a.padding) == 4
            and (a.data_layout, a.kernel_layout, a.out_layout) == ("NCHW", "IOHW", "NCHW")
            and (a.out_dtype is None or str(a.out_dtype) in ("", str(call.args[0].ty.dtype))))


def phase_weight(w: np.ndarray, strides: tuple[int, int], groups: int = 1) -> np.ndarray:
    """IOHW transposed-conv weight -> the OIHW weight of its phase conv, ``[O*sh*sw, I/groups, Mh, Mw]``,
    output channel ``(phase a*sw + b) * O + o``: phase-major, so each phase's channels are whole blocks of
    the blocked layout and the depth-to-space moves whole vectors (``tvmfuse.schedules.computes.blocked.depth_to_space``).

    With groups, each group's phases are its own block of output channels (group-major, as a grouped conv
    and the depth-to-space after it both want), phase-major within it."""
    if groups > 1:
        return np.concatenate([phase_weight(part, strides) for part in np.split(w, groups, axis=0)])
    c_in, c_out, kh, kw = w.shape
    (sh, sw), mh, mw = strides, math.ceil(kh / strides[0]), math.ceil(kw / strides[1])
    v = np.zeros((c_out, sh, sw, c_in, mh, mw), w.dtype)
    for a in range(sh):
        for t in range(mh):
            tap_h = a + sh * (mh - 1 - t)
            if tap_h >= kh:
                continue
            for b in range(sw):
                for u in range(mw):
                    tap_w = b + sw * (mw - 1 - u)
                    if tap_w < kw:
                        v[:, a, b, :, t, u] = w[:, :, tap_h, tap_w].T
    return v.transpose(1, 2, 0, 3, 4, 5).reshape(c_out * sh * sw, c_in, mh, mw)


def _axis(size: int, k: int, s: int, before: int, after: int, extra: int):
    """(conv padding before, after, phase rows Q, slice begin, end) along one axis."""
    m = math.ceil(k / s)
    out = (size - 1) * s + k - before - after + extra
    rows = size + m - 1
    more = max(0, math.ceil((before + out - s * rows) / s))  # output padding past the last tap: zero rows
    return m - 1, m - 1 + more, rows + more, before, before + out


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self._made = []  # (the transposed var of each depth-to-space this pass wrote, its conv, dims)

    def _conv_transpose(self, call):
        if not _rewritable(call):
            return None
        a, w = call.attrs, const_array(call.args[1])
        groups = int(a.groups)
        _, c_group, kh, kw = w.shape
        c_out = c_group * groups
        n, _, h, wd = static_shape(call.args[0])
        (sh, sw), pad, extra = (tuple(int(v) for v in a.strides), [int(v) for v in a.padding],
                                [int(v) for v in a.output_padding])
        top, bottom, qh, y0, y1 = _axis(h, kh, sh, pad[0], pad[2], extra[0])
        left, right, qw, x0, x1 = _axis(wd, kw, sw, pad[1], pad[3], extra[1])
        weight = relax.const(phase_weight(w, (sh, sw), groups), str(w.dtype))
        conv = self.builder_.emit(relax.op.nn.conv2d(call.args[0], weight, padding=[top, left, bottom, right],
                                                     groups=groups))
        crop = None if (y0, y1, x0, x1) == (0, qh * sh, 0, qw * sw) else (y0, y1, x0, x1)
        return self._depth_to_space(conv, _Phases(n, c_out, qh, qw, sh, sw, crop, groups))

    def _depth_to_space(self, conv, dims: _Phases):
        n, c_out, h, wd, kh, kw, crop, groups = dims
        split = self.builder_.emit(relax.op.reshape(conv, (n, groups, kh, kw, c_out // groups, h, wd)))
        moved = self.builder_.emit(relax.op.permute_dims(split, DEPTH_TO_SPACE_AXES))
        self._made.append((moved, conv, dims))
        interleaved = relax.op.reshape(moved, (n, c_out, h * kh, wd * kw))
        if crop is None:
            return interleaved
        y0, y1, x0, x1 = crop
        return relax.op.strided_slice(self.builder_.emit(interleaved), [2, 3], [y0, x0], [y1, x1],
                                      assume_inbound=True)

    def _made_by_us(self, var):
        """``(conv, dims)`` when ``var`` is bound to the last op (reshape, or the slice after it) of a
        depth-to-space this pass wrote."""
        value = self.lookup_binding(var) if isinstance(var, relax.Var) else None
        if isinstance(value, relax.Call) and value.op == _SLICE and isinstance(value.args[0], relax.Var):
            value = self.lookup_binding(value.args[0])
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
        c_out = dims.channels
        if value.size != c_out or value.ndim not in (3, 4) or value.shape[-3:] != (c_out, 1, 1):
            return None  # not one value per output channel
        if static_shape(call) != static_shape(a):
            return None
        bias = _per_phase(value.reshape(c_out), dims).reshape(1, -1, 1, 1)
        added = self.builder_.emit(relax.op.add(conv, relax.const(bias, str(value.dtype))))
        return self._depth_to_space(added, dims)

    def _batch_norm(self, call):
        """An inference batch-norm of the depth-to-space's output moves before it, its statistics repeated per
        phase, where ``FoldBatchNorm`` folds it into the phase conv (PP-OCR's DB heads: ConvTranspose + BN +
        ReLU). Its other two outputs (the statistics, unchanged) stay as they were."""
        made, stats = self._made_by_us(call.args[0]), [const_array(a) for a in call.args[1:]]
        if made is None or any(v is None for v in stats) or int(call.attrs.axis) != 1:
            return None
        conv, dims = made
        if any(v.shape != (dims.channels,) for v in stats):
            return None
        phased = [relax.const(_per_phase(v, dims), str(v.dtype)) for v in stats]
        bn = self.builder_.emit(relax.Call(call.op, [conv, *phased], call.attrs, None))
        normed = self.builder_.emit(relax.TupleGetItem(bn, 0))
        return relax.Tuple([self.builder_.emit(self._depth_to_space(normed, dims)), call.args[3], call.args[4]])

    def visit_call_(self, call):
        return rewrite_call(super().visit_call_(call), {_CONV_T: self._conv_transpose, _ADD: self._bias,
                                                        _BN: self._batch_norm})


def _per_phase(value: np.ndarray, dims: _Phases) -> np.ndarray:
    """A per-output-channel vector of the transposed conv -> per channel of its phase conv (group-major, then
    phase-major: the order :func:`phase_weight` writes)."""
    groups, per_group = dims.groups, value.size // dims.groups
    return np.broadcast_to(value.reshape(groups, 1, per_group),
                           (groups, dims.sh * dims.sw, per_group)).reshape(-1).copy()


@tvm.transform.module_pass(opt_level=0, name="TransposeConvToConv")
def TransposeConvToConv(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return rewrite_functions(mod, _Rewrite)
