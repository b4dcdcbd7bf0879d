"""Calibration tables: JSON round trip, atomic writes, and a clear error for each kind of corrupt file."""

from __future__ import annotations

import json
import os

import pytest

import tvmfuse
from tvmfuse.errors import TvmfuseError
from tvmfuse.quant.table import FORMAT, FORMAT_VERSION, CalibrationError, CalibrationTable


def _table() -> CalibrationTable:
    return CalibrationTable({"input": (-2.5, 3.25), "lv": (0.0, 6.0), "lv#1": (-0.375, 0.1 + 0.2)},
                            "percentile", {"percentile": 99.99, "num_bins": 2048}, "zoo:tiny_convnet")


def test_round_trip_is_exact(tmp_path):
    table = _table()
    path = table.save(tmp_path / "calib.json")
    loaded = CalibrationTable.load(path)
    assert loaded == table
    assert loaded["lv#1"] == (-0.375, 0.1 + 0.2)  # floats survive bit for bit
    assert loaded.tvmfuse_version == tvmfuse.__version__ and loaded.method == "percentile"
    assert list(loaded.ranges) == ["input", "lv", "lv#1"] and len(loaded) == 3 and "lv" in loaded


def test_file_layout(tmp_path):
    data = json.loads(_table().save(tmp_path / "t.json").read_text())
    assert data["format"] == FORMAT and data["format_version"] == FORMAT_VERSION
    assert data["ranges"]["lv"] == [0.0, 6.0] and data["model"] == "zoo:tiny_convnet"
    assert data["options"] == {"percentile": 99.99, "num_bins": 2048} and data["created"]


def test_save_replaces_atomically_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("old")
    _table().save(path)
    assert CalibrationTable.load(path).method == "percentile"
    assert os.listdir(tmp_path) == ["t.json"]


def test_interrupted_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = _table().save(tmp_path / "t.json")
    before = path.read_text()

    def fail(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    changed = CalibrationTable({"x": (0.0, 1.0)}, "minmax", {}, "other.onnx")
    with pytest.raises(OSError, match="disk full"):
        changed.save(path)
    assert path.read_text() == before and os.listdir(tmp_path) == ["t.json"]


def test_save_rejects_options_that_are_not_json(tmp_path):
    table = CalibrationTable({"x": (0.0, 1.0)}, "minmax", {"f": object()}, "m.onnx")
    with pytest.raises(CalibrationError, match="not JSON values"):
        table.save(tmp_path / "t.json")


def test_missing_key_lookup_names_the_tensor():
    with pytest.raises(CalibrationError, match="no range for tensor 'nope'.*input, lv"):
        _table()["nope"]


@pytest.mark.parametrize("ranges, match", [
    ({"x": (1.0, 0.0)}, "lo > hi"),
    ({"x": (float("nan"), 1.0)}, "not finite"),
])
def test_constructor_rejects_bad_ranges(ranges, match):
    with pytest.raises(CalibrationError, match=match):
        CalibrationTable(ranges, "minmax")


def _write(tmp_path, content) -> str:
    path = tmp_path / "calib.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def _valid() -> dict:
    return _table().to_json()


def _with(**changes) -> dict:
    data = _valid()
    data.update(changes)
    return data


def _without(key) -> dict:
    data = _valid()
    del data[key]
    return data


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ([1, 2], "JSON object is expected, got list"),
    (_with(format="tvmfuse-manifest"), "format is 'tvmfuse-manifest'"),
    (_without("format"), "format is None"),
    (_with(format_version=99), "format_version 99 is not supported"),
    (_without("ranges"), r"lacks key\(s\) \['ranges'\]"),
    (_without("method"), r"lacks key\(s\) \['method'\]"),
    (_with(ranges=[1, 2]), "'ranges' must be a Mapping"),
    (_with(options="x"), "'options' must be a Mapping"),
    (_with(ranges={"lv": [0.0]}), "range of tensor 'lv' must be \\[lo, hi\\]"),
    (_with(ranges={"lv": ["0", 1]}), "range of tensor 'lv' must be \\[lo, hi\\]"),
    (_with(ranges={"lv": [2.0, 1.0]}), "range of tensor 'lv' has lo > hi"),
    ('{"format": "tvmfuse-calibration", "format_version": 1, "method": "minmax", "options": {}, "model": "m",'
     ' "tvmfuse_version": "0", "ranges": {"lv": [NaN, 1.0]}}', "range of tensor 'lv' is not finite"),
    ('{"format": "tvmfuse-calibration", "format_version": 1, "method": "minmax", "options": {}, "model": "m",'
     ' "tvmfuse_version": "0", "ranges": {"lv": [0, Infinity]}}', "range of tensor 'lv' is not finite"),
])
def test_corrupt_tables_are_clear_errors_naming_the_file(tmp_path, content, match):
    path = _write(tmp_path, content)
    with pytest.raises(CalibrationError, match=match) as info:
        CalibrationTable.load(path)
    assert str(info.value).startswith(path) and isinstance(info.value, TvmfuseError)


def test_missing_file(tmp_path):
    with pytest.raises(CalibrationError, match="calibration table not found: .*absent.json"):
        CalibrationTable.load(tmp_path / "absent.json")


def test_binary_file_is_a_clear_error(tmp_path):
    path = tmp_path / "calib.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CalibrationError, match="calib.json"):
        CalibrationTable.load(path)
