"""RegroupConv: a grouped conv with fewer than 16 output channels per group merges groups until it has 16.

The blocked kernel of a grouped conv (``blocked.conv2d`` with ``groups``) needs each 16-channel output
block (8 on AVX2) inside one group. ResNeXt's 3x3 convs have 4 or 8 channels per group (32 groups of a
128- or 256-channel layer) and stayed on the NCHW grouped kernel at 5-6 GFLOP/s (the zoo's
resnext50_32x4d: 1.5-1.8 ms for one 8-per-group 3x3 conv at 16x16, against ~0.2 ms for its
16-per-group neighbours on the blocked kernel). Here ``f = 16 / (O / G)`` neighbouring groups become one:
the weight ``[O, I/G, kh, kw]`` grows to ``[O, f*I/G, kh, kw]`` with each output channel's own group's
weights in place and zeros for the other ``f - 1`` groups it now spans. That is ``f`` times the
multiply-adds (2x or 4x for ResNeXt) on a kernel that runs them ~30x faster. The result is the same
sum: the added terms are exact zeros (unless an input is inf or NaN, where ``0 * inf`` is NaN).

Where the target's blocked FP32 kernel runs the groups as they are (4 or 8 channels per group on x86,
:func:`~tvmfuse.schedules.computes.partition.narrow_groups`: a shuffle step per channel, no extra multiply-adds), the
conv is left grouped; the rest (NCHW kernels, INT8 graphs, CUDA, groups of 2) are merged as above.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvmfuse.schedules.computes.partition import narrow_groups
from tvmfuse.schedules.families import GROUP_CONV2D, family_of, static_shape

from .utils import const_array, rewrite_call, rewrite_functions

BLOCK = 16  # output channels per merged group: a multiple of AVX2's (8) and AVX-512's (16) block
MAX_FACTOR = 4  # at most 4x the multiply-adds

_CONV = tvm.ir.Op.get(GROUP_CONV2D.anchor_op)


def factor(out_channels: int, groups: int) -> int | None:
    """How many groups to merge (None: none), for ``out_channels`` split into ``groups``."""
    per_group = out_channels // groups
    if per_group >= BLOCK or BLOCK % per_group:
        return None
    f = BLOCK // per_group
    return f if f <= MAX_FACTOR and groups % f == 0 else None


def merge_groups(weight: np.ndarray, groups: int, f: int) -> np.ndarray:
    """``[O, I/G, kh, kw]`` -> ``[O, f*I/G, kh, kw]``: each output channel's weights at its group's place
    among the ``f`` groups merged with it, zeros elsewhere."""
    out_channels, per_in = weight.shape[:2]
    per_out = out_channels // groups
    merged = np.zeros((out_channels, f * per_in) + weight.shape[2:], weight.dtype)
    for o in range(out_channels):
        place = (o // per_out) % f
        merged[o, place * per_in:(place + 1) * per_in] = weight[o]
    return merged


@relax.expr_functor.mutator
class _Regroup(relax.PyExprMutator):
    def __init__(self, mod=None, lanes: int | None = None):
        super().__init__(mod)
        self.lanes = lanes

    def visit_call_(self, call):
        return rewrite_call(super().visit_call_(call), {_CONV: self._regroup})

    def _regroup(self, call):
        if not family_of(call).grouped or narrow_groups(call, self.lanes) is not None:
            return None
        weight, shape = const_array(call.args[1]), static_shape(call)
        a = call.attrs
        if weight is None or shape is None or (a.data_layout, a.kernel_layout) != ("NCHW", "OIHW"):
            return None
        groups = int(a.groups)
        f = factor(int(weight.shape[0]), groups)
        if f is None:
            return None
        merged = relax.const(merge_groups(weight, groups, f), str(weight.dtype))
        return relax.op.nn.conv2d(call.args[0], merged, strides=a.strides, padding=a.padding, dilation=a.dilation,
                                  groups=groups // f, data_layout=a.data_layout, kernel_layout=a.kernel_layout,
                                  out_layout=a.out_layout, out_dtype=a.out_dtype)


def RegroupConv(lanes: int | None = None):  # noqa: N802 - a pass, named like TVM's
    """The pass. ``lanes``: the blocked layout's vector width where the target runs narrow groups as they are
    (:func:`~tvmfuse.schedules.computes.partition.narrow_groups`, FP32 on x86); those convs are left grouped. None merges
    every group it can (NCHW kernels, CUDA, INT8)."""

    @tvm.transform.module_pass(opt_level=0, name="RegroupConv")
    def regroup(mod, _ctx):
        return rewrite_functions(mod, lambda m: _Regroup(m, lanes))

    return regroup
