"""Calibration tables: the calibrated range of every observed tensor, saved as JSON and loaded back checked.

A table is what calibration produces and what quantization consumes, so a user can calibrate once and
reuse the table (``tvmfuse quantize --table``). The file looks like::

    {
      "format": "tvmfuse-calibration",
      "format_version": 1,
      "method": "entropy",
      "options": {"num_bins": 2048, "num_quantized_bins": 128},
      "model": "zoo:tiny_convnet",
      "tvmfuse_version": "0.1.0",
      "created": "2025-01-01T00:00:00+00:00",
      "ranges": {"input": [-2.1, 2.3], "lv": [0.0, 4.5]}
    }

Keys of ``ranges`` are the tensor keys of :func:`tvmfuse.quant.keys.observed_tensors`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Mapping

from ..errors import TvmfuseError

FORMAT = "tvmfuse-calibration"
FORMAT_VERSION = 1
_REQUIRED = ("format", "format_version", "method", "options", "model", "tvmfuse_version", "ranges")


class CalibrationError(TvmfuseError):
    """Calibration cannot proceed or its result cannot be used: bad data, a corrupt table, no samples."""


def _tvmfuse_version() -> str:
    from ..version import __version__

    return __version__


@dataclasses.dataclass
class CalibrationTable:
    """Calibrated ``(lo, hi)`` per tensor key, with how they were obtained.

    Attributes
    ----------
    ranges : dict
        Tensor key -> ``(lo, hi)``, finite floats with ``lo <= hi``.
    method : str
        The calibration method (``"minmax"``, ``"entropy"``, ``"percentile"``).
    options : dict
        The method's options (JSON values), e.g. ``{"percentile": 99.99}``.
    model : str
        Where the model came from (a path or ``zoo:NAME``).
    tvmfuse_version : str
        The tvmfuse version that calibrated.
    created : str
        ISO 8601 UTC time of calibration.
    """

    ranges: dict[str, tuple[float, float]]
    method: str
    options: dict = dataclasses.field(default_factory=dict)
    model: str = ""
    tvmfuse_version: str = dataclasses.field(default_factory=_tvmfuse_version)
    created: str = dataclasses.field(default_factory=lambda: datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"))

    def __post_init__(self):
        self.ranges = {str(k): (float(lo), float(hi)) for k, (lo, hi) in self.ranges.items()}
        problems = _range_problems(self.ranges)
        if problems:
            raise CalibrationError(f"calibration table for {self.model or 'a model'}: {problems[0]}")

    def __getitem__(self, key: str) -> tuple[float, float]:
        try:
            return self.ranges[key]
        except KeyError:
            raise CalibrationError(f"calibration table for {self.model or 'a model'} has no range for tensor "
                                   f"{key!r} (it has {len(self.ranges)}: {_preview(self.ranges)})") from None

    def __contains__(self, key: str) -> bool:
        return key in self.ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def to_json(self) -> dict:
        """The JSON object :meth:`save` writes."""
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "method": self.method,
                "options": dict(self.options), "model": self.model, "tvmfuse_version": self.tvmfuse_version,
                "created": self.created, "ranges": {k: [lo, hi] for k, (lo, hi) in self.ranges.items()}}

    @classmethod
    def from_json(cls, data, source: str = "<json>") -> "CalibrationTable":
        """Check and read the object :meth:`to_json` produced; ``source`` names it in errors."""
        if not isinstance(data, Mapping):
            raise CalibrationError(f"{source}: not a calibration table (a JSON object is expected, got "
                                   f"{type(data).__name__})")
        if data.get("format") != FORMAT:
            raise CalibrationError(f"{source}: not a calibration table (format is {data.get('format')!r}, "
                                   f"expected {FORMAT!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise CalibrationError(f"{source}: calibration table format_version {data.get('format_version')!r} "
                                   f"is not supported (this tvmfuse reads {FORMAT_VERSION})")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise CalibrationError(f"{source}: calibration table lacks key(s) {missing}")
        for key, kind in (("method", str), ("model", str), ("tvmfuse_version", str), ("options", Mapping),
                          ("ranges", Mapping)):
            if not isinstance(data[key], kind):
                raise CalibrationError(f"{source}: calibration table key {key!r} must be a {kind.__name__}, "
                                       f"got {type(data[key]).__name__}")
        ranges = {}
        for name, value in data["ranges"].items():
            if (not isinstance(value, (list, tuple)) or len(value) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
                raise CalibrationError(f"{source}: range of tensor {name!r} must be [lo, hi] numbers, "
                                       f"got {_short(value)}")
            try:
                ranges[name] = (float(value[0]), float(value[1]))
            except OverflowError:  # an integer with hundreds of digits
                raise CalibrationError(f"{source}: range of tensor {name!r} is not finite: {_short(value)}") from None
        problems = _range_problems(ranges)
        if problems:
            raise CalibrationError(f"{source}: {problems[0]}")
        return cls(ranges, data["method"], dict(data["options"]), data["model"], data["tvmfuse_version"],
                   str(data.get("created", "")))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the table as JSON to ``path`` atomically (a temp file beside it, then ``os.replace``)."""
        path = Path(path)
        try:
            text = json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"
        except (TypeError, ValueError) as e:
            raise CalibrationError(f"{path}: calibration table options are not JSON values ({e})") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CalibrationTable":
        """Read a table written by :meth:`save`.

        Raises
        ------
        CalibrationError
            Naming the file and what is wrong: missing, not JSON, another format or version, missing keys,
            a range that is not two finite numbers with ``lo <= hi``.
        """
        path = Path(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise CalibrationError(f"calibration table not found: {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise CalibrationError(f"{path}: cannot read calibration table ({e})") from None
        try:
            data = json.loads(text)
        except ValueError as e:
            raise CalibrationError(f"{path}: calibration table is not valid JSON ({e})") from None
        except RecursionError:
            raise CalibrationError(f"{path}: calibration table is not valid JSON (nested too deeply)") from None
        return cls.from_json(data, str(path))


def _range_problems(ranges: Mapping[str, tuple[float, float]]) -> list[str]:
    """What is wrong with the ranges (non-finite bounds, lo > hi), one line per tensor."""
    problems = []
    for name, (lo, hi) in ranges.items():
        if not (math.isfinite(lo) and math.isfinite(hi)):
            problems.append(f"range of tensor {name!r} is not finite: [{lo}, {hi}]")
        elif lo > hi:
            problems.append(f"range of tensor {name!r} has lo > hi: [{lo}, {hi}]")
    return problems


def _short(value, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a damaged file can hold a huge value)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _preview(ranges: Mapping, count: int = 5) -> str:
    names = list(ranges)
    return ", ".join(names[:count]) + (", ..." if len(names) > count else "")
