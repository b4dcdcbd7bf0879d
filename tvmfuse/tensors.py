"""TensorInfo: the name, static shape and dtype of a model input or output; seeded random inputs; the
``NAME:D1,D2`` shape parser of both CLIs (no TVM, no ONNX imports)."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from .errors import InputError, ShapeError


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Name, static shape and numpy dtype name of a model input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: Mapping) -> "TensorInfo":
        return cls(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]))

    def __str__(self) -> str:
        return f"{self.name} {tuple(self.shape)} {self.dtype}"


def numpy_file_kind(path) -> str | None:
    """``"npz"`` (a zip archive, what ``numpy.savez`` writes), ``"npy"`` (``numpy.save``), or None for anything
    else (numpy would read it as a pickle and say so; an unreadable path also gives None)."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        return None
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "npz"
    return "npy" if head == b"\x93NUMPY" else None


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME:1,3,224,224`` (the name may itself contain colons; the last one splits)."""
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape:
        raise ShapeError(f"--shape {text!r}: expected NAME:D1,D2,... such as input:1,3,224,224")
    return name, shape


def parse_const_args(texts) -> dict | None:
    """``--const NAME=VALUE`` arguments as ``{NAME: "VALUE"}`` (None for none);
    :func:`tvmfuse.frontend.pin.pin_inputs` parses and checks the values against the model."""
    pinned = {}
    for text in texts or []:
        name, sep, value = text.partition("=")
        if not sep or not name or not value:
            raise InputError(f"--const {text}: expected NAME=VALUE (a number, or numbers separated by commas)")
        pinned[name] = value
    return pinned or None


def random_inputs(expected: Sequence[TensorInfo], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of the right shapes and dtypes (standard normal for floats, small ints otherwise)."""
    rng = np.random.default_rng(seed)
    out = {}
    for info in expected:
        dt = np.dtype(info.dtype)
        if dt.kind == "f":
            out[info.name] = rng.standard_normal(info.shape).astype(dt)
        elif dt.kind == "b":
            out[info.name] = rng.integers(0, 2, info.shape).astype(dt)
        else:
            out[info.name] = rng.integers(0, 8, info.shape).astype(dt)
    return out
