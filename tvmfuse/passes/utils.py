"""Small helpers shared by the graph passes."""

from __future__ import annotations

import numpy as np
import tvm

# A PrimFunc's relax op_pattern: AnnotateTIROpPattern leaves a func with op_pattern set alone, and kOpaque
# keeps FuseOps from merging neighbours into the kernel (its epilogue is already inside).
OPAQUE = 8


def const_array(expr) -> np.ndarray | None:
    """The numpy value of a Relax constant, or None when ``expr`` is not a constant."""
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    return None
