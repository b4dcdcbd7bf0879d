"""Softmax as one kernel of row stages (the x86 rule is :mod:`.x86.softmax`): the ``softmax`` row family's
compute and legalization (``families.ROW_FAMILIES``), the twin of :mod:`.layer_norm`."""

from __future__ import annotations

import tvm
from tvm import te, topi

from .. import families

# Stage names of :func:`softmax` (its schedules look them up).
KERNEL = families.SOFTMAX_KERNEL.name
SOFTMAX_STAGES = ("softmax_max", "T_fast_exp", "softmax_sum", "softmax_recip", "softmax_norm")


def softmax(x, axis: int = -1, annotations: dict | None = None):
    """Softmax along ``axis`` with ``fast_exp`` (as ``topi.nn.fast_softmax``), each exponential computed once
    and stored (``T_fast_exp``) and each row scaled by one reciprocal of its sum (``softmax_recip``), so the
    schedules can keep a row in cache through its max, exp, sum and scale passes. topi's version divides per
    element and, once its stages are inlined, computes every exponential twice (sum, then output). The output
    stage carries the row-kernel mark (``families.ROW_MARK``) and ``annotations``."""
    axis = axis % len(x.shape)

    def row(indices, k):
        return indices[:axis] + (k,) + indices[axis:]

    def rest(indices):
        return indices[:axis] + indices[axis + 1:]

    reduced = tuple(d for i, d in enumerate(x.shape) if i != axis)
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    top = te.compute(reduced, lambda *i: te.max(x[row(i, k)], axis=k), name="softmax_max")
    delta = te.compute(x.shape, lambda *i: x[i] - top[rest(i)], name="softmax_delta")
    exp = topi.fast_exp(delta)
    k2 = te.reduce_axis((0, x.shape[axis]), name="k")
    total = te.compute(reduced, lambda *i: te.sum(exp[row(i, k2)], axis=k2), name="softmax_sum")
    recip = te.compute(reduced, lambda *i: tvm.tirx.const(1.0, x.dtype) / total[i], name="softmax_recip")
    return te.compute(x.shape, lambda *i: exp[i] * recip[rest(i)], name="softmax_norm",
                      attrs={"axis": axis, families.ROW_MARK: KERNEL, **(annotations or {})})


def legalize(bb, call, annotations: dict | None = None):
    """``relax.nn.softmax`` computed by :func:`softmax` (the ``softmax`` row family's legalization);
    ``annotations``: kernel name -> its output stage's."""
    return bb.call_te(softmax, call.args[0], axis=int(call.attrs.axis),
                      annotations=(annotations or {}).get(KERNEL), primfunc_name_hint=KERNEL)
