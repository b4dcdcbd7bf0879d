"""LayerNorm over the last axis as one kernel of row stages (the x86 rule is :mod:`.x86.layer_norm`), and
over the channels of NCHW as one kernel of pixel stages (:mod:`.x86.layer_norm_channels`).

``relax.nn.layer_norm`` (ONNX ``LayerNormalization``, and the spelt-out form that
:mod:`tvmfuse.passes.layer_norm` turns into it) is legalized here on CPU targets: per row, the sum, then the
sum of squared deviations from the mean (two passes over a row that stays in cache: the variance of
``x - mean``, not ``E[x^2] - mean^2``, which cancels catastrophically for rows far from zero), one reciprocal
square root, then ``(x - mean) * rstd * gamma + beta``. TVM's own rule computes both moments in one tuple
reduction, which its schedules cannot vectorize, and a spelt-out LayerNorm was three kernels and five passes.
"""

from __future__ import annotations

import tvm
from tvm import te

from .. import families

# Stage names (the x86 rules look them up): the last-axis kernel's, the channel kernel's.
# the kernels (``tvmfuse.family``, and the row mark on the output stage) over the last axis and over channels
LAST_AXIS, CHANNELS = families.LAYER_NORM_KERNEL.name, families.CHANNEL_NORM_KERNEL.name
LAYER_NORM_STAGES = ("ln_sum", "ln_delta", "ln_sqsum", "ln_rstd", "ln_norm")
SUM, DELTA, SQSUM, RSTD, NORM = LAYER_NORM_STAGES
CHANNEL_STAGES = ("lnc_sum", "lnc_delta", "lnc_sqsum", "lnc_rstd", "lnc_norm")


def last_axis(call) -> bool:
    """Whether a ``relax.nn.layer_norm`` call normalizes a float32 tensor over its last axis alone, with 1-D
    gamma and beta (what :func:`layer_norm` computes)."""
    x, gamma, beta = call.args
    rank = len(x.ty.shape)
    axes = [int(a) % rank for a in call.attrs.axes]
    return (axes == [rank - 1] and rank >= 2 and str(x.ty.dtype) == "float32"
            and all(len(t.ty.shape) == 1 and str(t.ty.dtype) == "float32" for t in (gamma, beta)))


def channel_axis(call) -> bool:
    """Whether a ``relax.nn.layer_norm`` call normalizes a float32 tensor of rank 3 or more over axis 1
    alone (the channels of NCHW: ConvNeXt's channels-first LayerNorm), with 1-D gamma and beta (what
    :func:`layer_norm_channels` computes)."""
    x, gamma, beta = call.args
    rank = len(x.ty.shape)
    axes = [int(a) % rank for a in call.attrs.axes]
    return (axes == [1] and rank >= 3 and str(x.ty.dtype) == "float32"
            and all(len(t.ty.shape) == 1 and str(t.ty.dtype) == "float32" for t in (gamma, beta)))


def layer_norm_channels(x, gamma, beta, epsilon: float, annotations: dict | None = None):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over axis 1 of ``x`` (NCHW's channels): for each
    pixel (the axes after the channels), its sum over the channels, the sum of squared deviations, one
    reciprocal square root, then the output. The statistics are indexed ``[n, *pixel]``, so the x86 rule
    (:mod:`.x86.layer_norm_channels`) takes a run of pixels, consecutive in every channel plane, as one
    vector. The output stage carries the row-kernel mark and ``annotations``."""
    batch, channels, *rest = x.shape
    dtype = x.dtype
    inverse = tvm.tirx.const(1.0 / int(channels), dtype)
    sum_, delta_, sqsum_, rstd_, norm_ = CHANNEL_STAGES
    stats = (batch, *rest)
    k = te.reduce_axis((0, channels), name="k")
    total = te.compute(stats, lambda n, *p: te.sum(x[(n, k) + p], axis=k), name=sum_)
    delta = te.compute(x.shape, lambda n, c, *p: x[(n, c) + p] - total[(n,) + p] * inverse, name=delta_)
    k2 = te.reduce_axis((0, channels), name="k2")
    squares = te.compute(stats, lambda n, *p: te.sum(delta[(n, k2) + p] * delta[(n, k2) + p], axis=k2), name=sqsum_)
    rstd = te.compute(stats, lambda *i: tvm.tirx.const(1.0, dtype) / te.sqrt(
        squares[i] * inverse + tvm.tirx.const(epsilon, dtype)), name=rstd_)
    return te.compute(x.shape, lambda n, c, *p: delta[(n, c) + p] * rstd[(n,) + p] * gamma[c] + beta[c], name=norm_,
                      attrs={families.ROW_MARK: CHANNELS, **(annotations or {})})


def layer_norm(x, gamma, beta, epsilon: float, annotations: dict | None = None):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis of ``x``; the output stage
    carries the row-kernel mark (``families.ROW_MARK``) and ``annotations``."""
    *outer, width = x.shape
    dtype = x.dtype
    inverse = tvm.tirx.const(1.0 / int(width), dtype)
    k = te.reduce_axis((0, width), name="k")
    total = te.compute(outer, lambda *o: te.sum(x[o + (k,)], axis=k), name=SUM)
    delta = te.compute(x.shape, lambda *i: x[i] - total[i[:-1]] * inverse, name=DELTA)
    k2 = te.reduce_axis((0, width), name="k2")
    squares = te.compute(outer, lambda *o: te.sum(delta[o + (k2,)] * delta[o + (k2,)], axis=k2), name=SQSUM)
    rstd = te.compute(outer, lambda *o: tvm.tirx.const(1.0, dtype) / te.sqrt(
        squares[o] * inverse + tvm.tirx.const(epsilon, dtype)), name=RSTD)
    return te.compute(x.shape, lambda *i: delta[i] * rstd[i[:-1]] * gamma[i[-1]] + beta[i[-1]], name=NORM,
                      attrs={"axis": len(x.shape) - 1, families.ROW_MARK: LAST_AXIS, **(annotations or {})})


def legalize(bb, call, annotations: dict | None = None):
    """``relax.nn.layer_norm`` legalized by :func:`layer_norm` over the last axis (:func:`last_axis`), by
    :func:`layer_norm_channels` over the channels (:func:`channel_axis`), else by TVM's own rule (the
    ``layer_norm`` row family's legalization). ``annotations``: kernel name -> its output stage's."""
    annotations = annotations or {}
    epsilon = float(call.attrs.epsilon)
    if last_axis(call):
        return bb.call_te(layer_norm, *call.args, epsilon=epsilon, annotations=annotations.get(LAST_AXIS),
                          primfunc_name_hint=LAST_AXIS)
    if channel_axis(call):
        return bb.call_te(layer_norm_channels, *call.args, epsilon=epsilon,
                          annotations=annotations.get(CHANNELS), primfunc_name_hint=CHANNELS)
    return tvm.ir.Op.get("relax.nn.layer_norm").get_attr("FLegalize")(bb, call)
