"""The ONNX importer's ``Clip`` with constant bounds, imported as the ``R.clip`` / ``R.nn.relu`` it ends up as.

TVM's converter makes each Clip two TE kernels (``maximum`` and ``minimum`` PrimFuncs, about 1 ms a Clip to make:
0.15 s of importing seven corpus and zoo models with 162 Clips) plus a NaN guard per bound, which
:class:`tvmfuse.passes.canonicalize.CanonicalizeClip` then folds and rewrites into one ``R.clip``. For the Clips
whose rewrite is known here, float32 data with finite float32 scalar constants as the lower bound (and the upper
one, if given, not below it), that op is made directly, with the bounds and the form the rewrite gives: ``relu``
for a lower bound of 0 alone. Everything else (an upper bound alone, which the rewrite may merge with a Relu
before it; bounds computed at run time; NaN or infinite bounds; a lower bound above the upper, where ONNX's
output is the upper bound and ``R.clip``'s the lower; other dtypes) goes through TVM's converter as before.
"""

from __future__ import annotations

import functools

import numpy as np

def _bound(expr) -> float | None:
    """A finite float32 scalar constant's value; None for anything else."""
    from ..passes.utils import const_array

    value = const_array(expr)
    if value is None or value.dtype != np.float32 or value.size != 1 or not np.isfinite(value).all():
        return None
    return float(value.reshape(()))


@functools.cache
def converter():
    """The converter class for ``Clip`` (imports TVM)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    from ..passes.canonicalize import F32_MAX, clip_op

    class Clip(onnx_frontend.Clip):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            x = inputs[0]
            lo = _bound(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
            hi = _bound(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else F32_MAX
            if getattr(x.ty, "dtype", None) != "float32" or lo is None or hi is None or lo > hi:
                return super()._impl_v13(bb, inputs, attr, params)  # lo > hi: the output is hi, not a clip
            return clip_op(x, lo, hi)

    return Clip
