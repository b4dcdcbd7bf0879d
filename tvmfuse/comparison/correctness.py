"""Is each contender right? Its outputs on the comparison inputs against onnxruntime FP32.

FP32 rows must match within ``max abs error <= FP32_ATOL * max(1, max |reference|)``; fp16 rows within a
relative L2 error of ``FP16_REL`` (float16 rounding of weights and activations: the zoo's models measure
0.03-0.21% on the CPU path, so 1% flags a kernel bug, not rounding); INT8 rows within ``INT8_REL``
(quantization error, not a bug, is expected there). Top-1 agreement is
the share of samples whose first output has its largest value at the same position as the reference's;
with labels, accuracy is the share whose top-1 position is the label.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InputError, TvmfuseError
from ..tensors import TensorInfo

FP32_ATOL = 1e-3
FP16_REL = 0.01
INT8_REL = 0.2
SAMPLES = 4  # seeded random samples when no --inputs are given


def samples(path: str | Path | None, inputs: Sequence[TensorInfo], seed: int, count: int = SAMPLES) -> list[dict]:
    """The comparison inputs: the batches of an ``.npz`` / ``.npy`` folder, or ``count`` seeded random ones."""
    if path is None:
        rng = np.random.default_rng(seed)
        return [{i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in inputs} for _ in range(count)]
    from ..quant.data import load_calibration_data

    try:
        return load_calibration_data(path, inputs)
    except TvmfuseError as e:
        raise InputError(f"--inputs: {str(e).replace('calibration data', 'input data')}") from None


def labels(path: str | Path | None, count: int) -> np.ndarray | None:
    """Integer class labels, one per sample."""
    if path is None:
        return None
    try:
        y = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy raises many kinds on a bad file
        raise InputError(f"--labels {path}: cannot read as .npy ({type(e).__name__})") from None
    if not isinstance(y, np.ndarray) or y.ndim != 1 or y.shape[0] != count or y.dtype.kind not in "iu":
        raise InputError(f"--labels {path}: expected {count} integer labels (one per input sample), got "
                         f"shape {getattr(y, 'shape', None)} dtype {getattr(y, 'dtype', None)}")
    return y


def top1(outputs: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """The position of the largest value of each sample's first output."""
    return np.array([int(np.argmax(np.asarray(o[0]).reshape(-1))) for o in outputs])


def _unmatched(error: str) -> dict:
    """The ``correctness`` entry of outputs that cannot be compared with the reference at all."""
    return {"max_abs_err": None, "rel_err": None, "top1_agreement": None, "accuracy": None,
            "fp32_agreement": None, "tolerance": "", "within_tolerance": False, "error": error}


def check(outputs: list, reference: list, precision: str, y: np.ndarray | None = None,
          fp32_outputs: list | None = None) -> dict:
    """The report's ``correctness`` entry for one contender's ``outputs`` (per sample, per output)."""
    err, num, den, scale = 0.0, 0.0, 0.0, 1.0
    for got, ref in zip(outputs, reference):
        if len(got) != len(ref):
            return _unmatched(f"{len(got)} outputs, the reference has {len(ref)}")
        for g, r in zip(got, ref):
            g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
            if g.shape != r.shape:
                return _unmatched(f"output shape {g.shape}, the reference has {r.shape}")
            err = max(err, float(np.max(np.abs(g - r))) if g.size else 0.0)
            num += float(np.sum((g - r) ** 2))
            den += float(np.sum(r ** 2))
            scale = max(scale, float(np.max(np.abs(r))) if r.size else 0.0)
    rel = (num / den) ** 0.5 if den > 0 else (0.0 if num == 0 else float("inf"))
    picks = top1(outputs)
    out = {"max_abs_err": err, "rel_err": rel, "top1_agreement": float(np.mean(picks == top1(reference))),
           "accuracy": float(np.mean(picks == y)) if y is not None else None, "fp32_agreement": None}
    if fp32_outputs is not None:
        out["fp32_agreement"] = float(np.mean(picks == top1(fp32_outputs)))
    if precision in ("int8", "fp16"):
        bound = INT8_REL if precision == "int8" else FP16_REL
        out["tolerance"] = f"relative L2 error <= {bound}"
        out["within_tolerance"] = bool(rel <= bound)
    else:
        out["tolerance"] = f"max abs error <= {FP32_ATOL:g} x max(1, max |reference|) = {FP32_ATOL * scale:.3g}"
        out["within_tolerance"] = bool(err <= FP32_ATOL * scale)
    return out
