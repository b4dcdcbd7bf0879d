"""Layout helpers for tests: how many layout transforms a model's graph passes leave (tests of LowerPartitions'
layout plan), and numpy NCHW <-> NCHW[b]c."""

from __future__ import annotations

import numpy as np
import tvm

from tvmfuse import frontend
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes


def transforms(model, spec, layout: str = "blocked") -> dict:
    """``{"to_blocked": calls, "to_plain": calls, "nchwc": blocked conv kernels (Winograd's too)}`` after the graph
    passes."""
    imported = frontend.import_model(model)
    mod = run_graph_passes(imported.mod, spec, spec.tvm_target(), PassRecord(), blocked=layout == "blocked")
    counts = {"to_blocked": 0, "to_plain": 0, "nchwc": 0}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs:
            kernel = func.attrs.get("tvmfuse.kernel")
            if kernel is not None and str(kernel) in counts:
                counts[str(kernel)] += str(mod["main"]).count(f"call_tir({gv.name_hint},")
            counts["nchwc"] += str(func.attrs.get("tvmfuse.family", "")) in (
                "conv2d_nchwc", "conv2d_winograd", "depthwise_conv2d_nchwc")
    return counts


def to_blocked(a: np.ndarray, block: int, fill=0) -> np.ndarray:
    """NCHW -> NCHW[block]c; the last block's missing channels are ``fill``."""
    n, c, h, w = a.shape
    full = np.full((n, -(-c // block) * block, h, w), fill, a.dtype)
    full[:, :c] = a
    return np.ascontiguousarray(full.reshape(n, -1, block, h, w).transpose(0, 1, 3, 4, 2))


def to_plain(a: np.ndarray, channels: int | None = None) -> np.ndarray:
    """NCHW[b]c -> NCHW, cropped to ``channels`` (None: every channel)."""
    n, cb, h, w, b = a.shape
    return a.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :channels]
