"""The FP32 -> INT8 model flow behind ``tvmfuse.quantize``: calibration data or a saved table in, the
quantize step of the compile (calibrate the partitioned FP32 model on this CPU, then ``QuantizeGraph``), and
the manifest's ``quantization`` entry.

A workflow module (it compiles and runs the FP32 model to calibrate); ``tvmfuse.api`` drives it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

from ..passes.quantize import QuantizeGraph
from ..targets import TargetSpec
from ..tensors import TensorInfo
from .calibrate import create_calibrator
from .collect import calibrate_partitioned
from .data import CalibrationDataError, check_batch, load_calibration_data
from .table import CalibrationError, CalibrationTable

# Calibration runs the FP32 model here, whatever the compile target (x86-avx512 code may not run here).
CALIBRATION_TARGET = "x86-host"


def _is_path(value) -> bool:
    return isinstance(value, (str, os.PathLike))


def calibration_batches(calib, inputs: Sequence[TensorInfo]) -> list[dict]:
    """Checked calibration batches from a path (``.npz`` / ``.npy`` directory), one batch dict, or batches.

    Raises
    ------
    CalibrationDataError
        Naming the input whose name, shape or dtype does not fit, or an empty set.
    """
    if _is_path(calib):
        return load_calibration_data(calib, inputs)
    batches = [calib] if isinstance(calib, Mapping) else list(calib)
    if not batches:
        raise CalibrationDataError("empty calibration set: no batches were given")
    return [check_batch(batch, inputs, f"calibration batch {i}") for i, batch in enumerate(batches)]


class Quantizer:
    """One quantization of one model: a table (given, loaded or calibrated) and the ``QuantizeGraph`` step.

    Parameters
    ----------
    spec : TargetSpec
        The compile target.
    calib : str, os.PathLike, dict, iterable of dict or None
        Calibration data; None to use ``table`` instead.
    method : str
        ``"minmax"``, ``"entropy"`` or ``"percentile"`` (when calibrating).
    table : CalibrationTable, str, os.PathLike or None
        Without ``calib``: the table to use (or the path of one to load). With ``calib``: a path the new
        table is written to.
    percentile : float
        The percentile of the ``"percentile"`` method.

    Raises
    ------
    CalibrationError
        Neither calibration data nor a table, both data and a table object, an unknown method or bad
        options, a table file that is missing or corrupt.
    """

    def __init__(self, spec: TargetSpec, calib=None, method: str = "entropy", table=None,
                 percentile: float = 99.99):
        if calib is None and table is None:
            raise CalibrationError("quantize needs calibration data (calib=..., --calib DATA) or a saved "
                                   "calibration table (table=..., --table PATH)")
        if calib is not None and isinstance(table, CalibrationTable):
            raise CalibrationError("quantize got both calibration data and a CalibrationTable; pass one (with "
                                   "calibration data, table= may be a path to write the new table to)")
        if table is not None and not (_is_path(table) or isinstance(table, CalibrationTable)):
            raise CalibrationError(f"table must be a CalibrationTable or a path, got {type(table).__name__}")
        self.spec, self.calib, self.method = spec, calib, method
        self.options = {"percentile": percentile} if method == "percentile" else {}
        if calib is not None:
            create_calibrator(method, **self.options)  # an unknown method fails before anything is built
        self.table_path = Path(table) if _is_path(table) else None
        self.table = table if isinstance(table, CalibrationTable) else None
        if calib is None and self.table is None:
            self.table = CalibrationTable.load(self.table_path)
        self.batches: list[dict] | None = None
        self.inputs: list[TensorInfo] = []
        self.source = ""
        self.report: dict = {}

    def prepare(self, inputs: Sequence[TensorInfo], source: str) -> None:
        """Check the calibration data against the model's inputs (before anything is compiled)."""
        self.inputs, self.source = list(inputs), source
        if self.calib is not None:
            self.batches = calibration_batches(self.calib, self.inputs)

    def step_name(self) -> str:
        """The compile step this quantizer runs in, for progress lines."""
        if self.calib is None:
            return "partition and quantize"
        return f"partition, calibrate ({self.method}, {len(self.batches or [])} batches) and quantize"

    def __call__(self, partitioned):
        """Calibrate the partitioned module if no table was given, then quantize it (``QuantizeGraph``)."""
        if self.table is None:
            if self.batches is None:
                raise RuntimeError("Quantizer.prepare must run before the quantize step")
            self.table = calibrate_partitioned(partitioned, self.inputs, self.batches, self.method,
                                               CALIBRATION_TARGET, self.source, **self.options)
            if self.table_path is not None:
                self.table.save(self.table_path)
        return QuantizeGraph(self.table, self.spec, self.report)(partitioned)

    def manifest_entry(self) -> dict:
        """The manifest's ``quantization`` entry: how the table was made, and what QuantizeGraph did."""
        table = self.table
        entry = {"method": table.method if table else self.method,
                 "options": dict(table.options) if table else dict(self.options),
                 "table": str(self.table_path) if self.table_path is not None else None,
                 "calibrated": self.calib is not None,
                 "calibration_batches": len(self.batches) if self.batches is not None else None}
        entry.update(self.report)
        return entry
