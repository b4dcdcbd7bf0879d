"""Damaged and wrong-type ONNX models, tuning-log folders, calibration tables and calibration data: a one-line
TvmfuseError (exit 2 from the CLI), never a crash.

Every kind of file tvmfuse reads gets truncated (0 bytes and more), bit-flipped (seeded positions) and
wrong-type (a PNG, text, a JSON list, a directory) versions (``helpers.corrupt``). Everything runs in
subprocesses, so a segfault or SIGBUS fails a test instead of killing pytest. Each kind runs its cases in
one subprocess through the API (``run_batch``), plus one CLI run per kind for exit status 2, the one-line
message and no output file left behind. Exported libraries and
their manifests: ``test_corrupt_libraries.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import HOST
from helpers.corrupt import (
    PNG, TEXT, truncations, bit_flips, wrong_types, write_case, run_batch, check_errors, cli, check_cli_error,
    listing)

# -- ONNX models ----------------------------------------------------------------------------------------------------


def _onnx_bytes_and_structure() -> tuple[bytes, list[int]]:
    """zoo:tiny_convnet serialized, and the offsets of its bytes outside the weights (names, attributes, dims)."""
    import tvmfuse

    model = tvmfuse.zoo.get("tiny_convnet")
    data = model.SerializeToString()
    weights = bytearray(len(data))
    for t in model.graph.initializer:
        start = data.find(t.raw_data)
        weights[start:start + len(t.raw_data)] = b"\1" * len(t.raw_data)
    return data, [i for i in range(len(data)) if not weights[i]]


def test_damaged_onnx_models_raise_tvmfuse_errors(tmp_path):
    data, structure = _onnx_bytes_and_structure()
    cases, expected, flips = [], {}, []
    for name, blob in {**truncations(data, (0, 1, 100)), **wrong_types(), "directory": None}.items():
        path = write_case(tmp_path, f"{name}.onnx", blob)
        cases.append([name, "compile", path, {}])  # fails at load, before anything is built
        expected[name] = (path, (f"{path} is not an ONNX file", f"{path}: truncated or corrupt ONNX file",
                                 f"{path} is empty (0 bytes)", "model path is a directory, not an ONNX file"))
    # Flips outside the weights reach the checker, the initializers' decoding, names, types and attributes: every
    # one must import or fail as a TvmfuseError (they used to end in UnicodeDecodeError, KeyError, ValueError).
    # Flips in the weights give a valid model.
    for name, blob in {**bit_flips(data, 2, 150, structure), **bit_flips(data, 3, 3)}.items():
        cases.append([name, "import", write_case(tmp_path, f"{name}.onnx", blob), {}])
        flips.append(name)
    outcomes = run_batch(tmp_path, cases)
    check_errors(outcomes, expected)
    bad = [outcomes[n] for n in flips if not outcomes[n]["ok"]
           and (outcomes[n]["error"].startswith("UNEXPECTED") or "\n" in outcomes[n]["message"])]
    assert not bad, "\n".join(map(str, bad))
    assert sum(not outcomes[n]["ok"] for n in flips) > 100  # most structural flips are caught


def test_cli_compile_of_a_damaged_onnx_is_one_line_exit_2(tmp_path):
    data, _ = _onnx_bytes_and_structure()
    model = write_case(tmp_path, "m.onnx", data[: len(data) // 2])
    before = listing(tmp_path)
    proc = cli("compile", model, "--target", HOST, "-o", tmp_path / "out.so", "-q")
    check_cli_error(proc, "compile", f"{model}: truncated or corrupt ONNX file ({len(data) // 2:,} bytes)")
    assert listing(tmp_path) == before


# -- tuning logs ------------------------------------------------------------------------------------------------------

LOGS_TARGET = "x86-avx512"  # the shipped folder; decoding and compiling (without running) work on any CPU
ON_LOGS_TARGET = {"target": LOGS_TARGET}


@pytest.fixture(scope="module")
def logs_base(tmp_path_factory) -> Path:
    """A logs root holding the shipped x86-avx512 logs cut to their three smallest workloads and those
    workloads' records, and helpers.tune.MODEL as ``m.onnx``."""
    from helpers.tune import MODEL

    from tvmfuse.tune.database import RECORDS, WORKLOADS, read_lines

    shipped = Path(__file__).resolve().parents[1] / "tuning_logs" / LOGS_TARGET
    workloads = read_lines(shipped / WORKLOADS)  # shipped xz-compressed
    smallest = sorted(range(len(workloads)), key=lambda i: len(workloads[i]))[:3]
    new_index = {old: new for new, old in enumerate(smallest)}
    records = [json.loads(line) for line in read_lines(shipped / RECORDS)]
    root = tmp_path_factory.mktemp("logs_base")
    folder = root / "logs" / LOGS_TARGET
    folder.mkdir(parents=True)
    (folder / WORKLOADS).write_text("".join(workloads[i] + "\n" for i in smallest))
    (folder / RECORDS).write_text("".join(json.dumps([new_index[i], r], separators=(",", ":")) + "\n"
                                          for i, r in records if i in new_index))
    (root / "m.onnx").write_bytes(MODEL.SerializeToString())
    return root


def test_damaged_tuning_logs_are_skipped_with_a_warning(logs_base, tmp_path):
    import shutil

    from tvmfuse.tune.database import RECORDS, WORKLOADS

    (sub,) = (logs_base / "logs").iterdir()
    originals = {f: (sub / f).read_bytes() for f in (WORKLOADS, RECORDS)}
    cases, skipping, errors = [], [], {}

    def folder(name, file=None, content=b""):
        root = tmp_path / name
        shutil.copytree(logs_base / "logs", root)
        if file is not None:
            target = root / sub.name / file
            target.unlink()
            if content is None:
                target.mkdir()
            else:
                target.write_bytes(content)
        return root

    for file, data in originals.items():
        short = "workloads" if file == WORKLOADS else "records"
        variants = {**truncations(data, (0, 1)), **bit_flips(data, 4, 6), **wrong_types(),
                    "nested": b"[" * 100_000 + b"\n", "nul": b"\0" * 100}
        for name, blob in variants.items():
            cases.append([f"{short}-{name}", "logs", folder(f"{short}-{name}", file, blob), ON_LOGS_TARGET])
            skipping.append(f"{short}-{name}")
        root = folder(f"{short}-directory", file, None)
        cases.append([f"{short}-directory", "logs", root, ON_LOGS_TARGET])
        errors[f"{short}-directory"] = (root / sub.name / file, "is not a file")
    root = folder("target-folder-is-a-file")
    shutil.rmtree(root / sub.name)
    (root / sub.name).write_bytes(TEXT)
    cases.append(["target-folder-is-a-file", "logs", root, ON_LOGS_TARGET])
    errors["target-folder-is-a-file"] = (f"tuning logs: {root / sub.name} ", "is not a folder")
    (tmp_path / "root-is-a-file").write_bytes(PNG)
    cases.append(["root-is-a-file", "logs", tmp_path / "root-is-a-file", ON_LOGS_TARGET])
    errors["root-is-a-file"] = (f"tuning logs: {tmp_path / 'root-is-a-file'} ", "is not a folder")
    # End to end: a compile over a damaged folder warns, skips, and builds.
    cut = folder("compile-cut", RECORDS, originals[RECORDS][:-20])
    cases.append(["compile-cut", "compile", logs_base / "m.onnx", {"logs": str(cut), **ON_LOGS_TARGET}])
    outcomes = run_batch(tmp_path, cases)
    check_errors(outcomes, errors)
    assert all(outcomes[n]["error"] == "TuningLogError" for n in errors)
    bad = []
    for name in skipping:
        o = outcomes[name]
        skipped = o["ok"] and o["result"]["skipped"]
        warned = [w for w in o.get("warnings", []) if f"skipped {skipped} line(s)" in w]
        # A bad line is skipped with one warning; a flip MetaSchedule still decodes (a sampled decision, a
        # probability) leaves the record usable; an empty file has no lines to skip.
        if not o["ok"] or (skipped and len(warned) != 1) or (not skipped and o["warnings"]) \
                or (o["result"]["records"] + skipped == 0 and name != "records-truncated-0"):
            bad.append(f"{name}: {o}")
    assert not bad, "\n".join(bad)
    compiled = outcomes["compile-cut"]
    assert compiled["ok"] and compiled["result"]["skipped_lines"] == 1 and compiled["result"]["records"] == 2, compiled
    assert any("skipped 1 line(s)" in w for w in compiled["warnings"]), compiled


def test_cli_compile_with_unusable_logs_is_one_line_exit_2(logs_base, tmp_path):
    import shutil

    from tvmfuse.tune.database import RECORDS

    root = tmp_path / "logs"
    shutil.copytree(logs_base / "logs", root)
    (sub,) = root.iterdir()
    (sub / RECORDS).unlink()
    (sub / RECORDS).mkdir()
    out = tmp_path / "out"
    out.mkdir()
    proc = cli("compile", logs_base / "m.onnx", "--target", LOGS_TARGET, "--logs", root, "-o", out / "m.so", "-q")
    check_cli_error(proc, "compile", f"{sub / RECORDS} is not a file")
    assert listing(out) == set()


# -- calibration tables and data ------------------------------------------------------------------------------------


def _table_bytes() -> bytes:
    from tvmfuse.quant.table import CalibrationTable

    table = CalibrationTable({"input": (-2.1, 2.3), "lv": (0.0, 4.5), "lv1": (0.0, 1.25e-05)}, "entropy",
                             {"num_bins": 2048, "num_quantized_bins": 128}, "zoo:tiny_convnet")
    return json.dumps(table.to_json(), indent=2).encode()


def test_damaged_calibration_tables_raise_calibration_error(tmp_path):
    data = _table_bytes()
    cases, expected, flips = [], {}, {}
    for name, blob in {**truncations(data, (0, 1)), **wrong_types(), "directory": None,
                       "nested": b"[" * 100_000, "huge-int": data.replace(b"4.5", b"1" + b"0" * 400),
                       "nan": data.replace(b"4.5", b"NaN"), "bool": data.replace(b"4.5", b"true")}.items():
        path = write_case(tmp_path, f"{name}.json", blob)
        cases.append([name, "table", path, {}])
        expected[name] = (f"{path}: ", ("calibration table", "range of tensor"))
    for name, blob in bit_flips(data, 5, 16).items():
        path = write_case(tmp_path, f"{name}.json", blob)
        cases.append([name, "table", path, {}])
        flips[name] = (f"{path}: ", ("calibration table", "range of tensor"))
    cases.append(["quantize-png", "quantize-table", tmp_path / "png.json", {}])  # the API path, before any build
    expected["quantize-png"] = (tmp_path / "png.json", "cannot read calibration table")
    outcomes = run_batch(tmp_path, cases)
    check_errors(outcomes, expected)
    # A table has no checksum: a flip in a digit loads (a different range); anything else is a CalibrationError.
    check_errors(outcomes, flips, may_pass=True)
    assert all(outcomes[n]["error"] == "CalibrationError" for n in [*expected, *flips] if not outcomes[n]["ok"])


def test_damaged_calibration_data_raise_calibration_data_error(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype("float32")
    np.savez(tmp_path / "good.npz", input=x)
    npz = (tmp_path / "good.npz").read_bytes()
    np.save(tmp_path / "good.npy", x[0])
    npy = (tmp_path / "good.npy").read_bytes()
    cases, expected, flips = [], {}, {}
    # .npz: flips in the header region (zip entry, .npy header) and in the data, which the zip CRC catches.
    npz_cases = {**truncations(npz, (0, 1, 30)), **wrong_types(), "npy-named-npz": npy}
    npz_flips = {**bit_flips(npz, 6, 8, list(range(200))), **bit_flips(npz, 7, 3)}
    for name, blob in {**npz_cases, **npz_flips}.items():
        path = write_case(tmp_path, f"{name}.npz", blob)
        cases.append([f"npz-{name}", "calib", path, {}])
        (flips if name in npz_flips else expected)[f"npz-{name}"] = (f"{path}: ", "")
    # A directory of .npy files: one damaged file beside a good one.
    npy_cases = {**truncations(npy, (0, 5, 60)), **wrong_types(), "directory": None}
    npy_flips = bit_flips(npy, 8, 8, list(range(128)))  # the header
    for name, blob in {**npy_cases, **npy_flips}.items():
        folder = tmp_path / f"npy-{name}"
        folder.mkdir()
        (folder / "input_0.npy").write_bytes(npy)
        write_case(folder, "input_1.npy", blob)
        cases.append([f"npy-{name}", "calib", folder, {}])
        (flips if name in npy_flips else expected)[f"npy-{name}"] = (f"{folder / 'input_1.npy'}: ", "")
    cases.append(["quantize-cut", "quantize-calib", tmp_path / "truncated-30.npz", {}])  # fails before any build
    expected["quantize-cut"] = (tmp_path / "truncated-30.npz", "not a readable .npz archive")
    outcomes = run_batch(tmp_path, cases)
    check_errors(outcomes, expected)
    # A flip the readers tolerate (a zip field nobody reads) loads; one in a shape digit is a shape error.
    check_errors(outcomes, flips, may_pass=True)
    assert all(outcomes[n]["error"] == "CalibrationDataError" for n in [*expected, *flips] if not outcomes[n]["ok"])


def test_cli_quantize_with_damaged_table_or_data_is_one_line_exit_2(tmp_path):
    (tmp_path / "table.json").write_bytes(_table_bytes()[:100])
    np.savez(tmp_path / "calib.npz", input=np.zeros((2, 3, 32, 32), "float32"))
    (tmp_path / "calib.npz").write_bytes((tmp_path / "calib.npz").read_bytes()[:-10])
    out = tmp_path / "out"
    out.mkdir()
    proc = cli("quantize", "zoo:tiny_convnet", "--table", tmp_path / "table.json", "--target", HOST,
               "-o", out / "q.so", "-q")
    check_cli_error(proc, "quantize", f"{tmp_path / 'table.json'}: calibration table is not valid JSON")
    proc = cli("quantize", "zoo:tiny_convnet", "--calib", tmp_path / "calib.npz", "--table", out / "t.json",
               "--target", HOST, "-o", out / "q.so", "-q")
    check_cli_error(proc, "quantize", f"{tmp_path / 'calib.npz'}: not a readable .npz archive")
    assert listing(out) == set()  # neither a library nor a table
