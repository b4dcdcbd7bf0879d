"""Small helpers shared by the graph passes."""

from __future__ import annotations

import numpy as np
import tvm


def const_array(expr) -> np.ndarray | None:
    """The numpy value of a Relax constant, or None when ``expr`` is not a constant."""
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    return None
