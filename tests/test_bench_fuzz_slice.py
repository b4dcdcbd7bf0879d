"""bench/device/fuzz_slice.py: the fuzz slice of the GPU round, prepared and checked here on the host CPU
(the same code the GPU machine runs, with an x86 target): a clean case passes, a wrong output is a mismatch,
a case that cannot be built or run is reported, fp16 is judged by relative L2 error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "device"))

import fuzz_slice  # noqa: E402


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    fuzz_slice.prepare(directory, [0], "x86-host")  # fp16 is refused for x86: recorded, not raised
    return directory


def test_prepare_records_libraries_references_and_refusals(prepared):
    cases = json.loads((prepared / "cases.json").read_text())["cases"]
    fp32, fp16 = cases
    assert fp32["library"] == "0_fp32.so" and (prepared / "0_fp32.so").exists() and fp32["rules"]
    assert "precision fp16 is not built for target x86-host" in fp16["compile_error"]
    data = np.load(prepared / "0.npz")
    assert any(k.startswith("in:") for k in data.files) and [f"out:{n}" for n in fp32["outputs"]] == \
        [k for k in data.files if k.startswith("out:")]


def test_check_passes_a_clean_case_and_catches_a_wrong_one(prepared, tmp_path):
    report = fuzz_slice.check_all(prepared, tmp_path / "out.json")
    assert [r["status"] for r in report["rows"]] == ["ok", "not built"]
    assert json.loads((tmp_path / "out.json").read_text()) == report
    row = json.loads((prepared / "cases.json").read_text())["cases"][0]
    data = dict(np.load(prepared / "0.npz"))
    key = f"out:{row['outputs'][0]}"
    data[key] = data[key] + 0.5 * (np.abs(data[key]).max() + 1)
    np.savez(prepared / "0.npz", **data)
    assert fuzz_slice.check_case(prepared, row)["status"] == "mismatch"
    assert fuzz_slice.check_case(prepared, {**row, "library": "missing.so"})["status"] == "error"


def test_fp16_is_judged_by_relative_l2_error(prepared, monkeypatch):
    import tvmfuse

    row = {**json.loads((prepared / "cases.json").read_text())["cases"][0], "precision": "fp16"}
    want = [np.load(prepared / "0.npz")[f"out:{n}"] for n in row["outputs"]]

    class Runner:
        def __init__(self, scale):
            self.scale = scale

        def run(self, x):
            return [w * self.scale for w in want]

    monkeypatch.setattr(tvmfuse, "load", lambda path: Runner(1.005))  # 0.5% off: within fp16's 1%
    assert fuzz_slice.check_case(prepared, row)["status"] == "ok"
    monkeypatch.setattr(tvmfuse, "load", lambda path: Runner(1.05))
    assert fuzz_slice.check_case(prepared, row)["status"] == "mismatch"
