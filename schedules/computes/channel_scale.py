"""A squeeze-and-excitation scale applied inside the conv that reads the product (issue #18).

``conv(x * s, W) = conv(x, W * s)``, ``s`` per input channel. A conv partition whose data is ``x * scale``
(``tvmfuse.passes.channel_scale`` gives it that prologue) computes, in its NCHW[b]c kernel, the packed weight
times the scale once per call (stage :data:`SCALED_WEIGHT`: O x I x kh x kw products) and reads ``x`` as it is,
where the product was an elementwise kernel over the whole map (I x H x W products, written and read back).
"""

from __future__ import annotations

from tvm import te

SCALE_PARAM = "scale"  # the prologue's scale parameter, ``[1, C, 1, 1]``
SCALED_WEIGHT = "scaled_weight"


def _param(fn, var) -> int | None:
    return next((i for i, p in enumerate(fn.params) if p.same_as(var)), None)


def prologue(fn, anchor):
    """``(product var, x index, scale index)`` when the anchor's data is the prologue's ``x * scale`` (both
    parameters of ``fn``), else None."""
    for block in fn.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if binding.var.same_as(anchor.args[0]) and getattr(value.op, "name", None) == "relax.multiply":
                x, scale = (_param(fn, a) for a in value.args)
                if x is not None and scale is not None and fn.params[scale].name == SCALE_PARAM:
                    return binding.var, x, scale
    return None


def scaled_weight(weight, scale):
    """A packed ``[O/bo, I/bi, kh, kw, bi, bo]`` weight times a blocked ``[1, I/bi, 1, 1, bi]`` scale."""
    return te.compute(weight.shape, lambda ob, ib, y, x, bi, bo: weight[ob, ib, y, x, bi, bo] * scale[0, ib, 0, 0, bi],
                      name=SCALED_WEIGHT)
