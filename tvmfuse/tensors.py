"""TensorInfo: the name, static shape and dtype of a model input or output (no TVM, no ONNX imports)."""

from __future__ import annotations

import dataclasses
from typing import Mapping


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
