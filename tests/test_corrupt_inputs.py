"""Damaged and wrong-type input files: a one-line TvmfuseError (exit 2 from the CLI), never a crash.

Every kind of file tvmfuse reads gets truncated (0 bytes and more), bit-flipped (seeded positions) and
wrong-type (a PNG, text, a JSON list, a directory) versions: exported libraries, their manifests, ONNX
models, tuning-log folders, calibration tables and calibration data, and ``run --inputs``. Everything runs
in subprocesses, so a segfault or SIGBUS fails a test instead of killing pytest. Library files go through
``tvmfuse run`` one subprocess each (that is where native code maps them); the other kinds run their cases
in one subprocess per kind through the API (:func:`run_batch`), plus one CLI run per kind for exit status 2,
the one-line message and no output file left behind.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import HOST

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00\x00" + bytes(range(64))
TEXT = b"this is not the file you are looking for\n"
JSON_LIST = b"[1, 2, 3]\n"


def truncations(data: bytes, lengths=(0, 1, 64)) -> dict[str, bytes]:
    """``data`` cut to each of ``lengths``, to half its size and to one byte short."""
    sizes = sorted({n for n in lengths if n < len(data)} | {len(data) // 2, len(data) - 1})
    return {f"truncated-{n}": data[:n] for n in sizes}


def bit_flips(data: bytes, seed: int, count: int, positions=None) -> dict[str, bytes]:
    """``count`` copies of ``data`` with one bit flipped each, at seeded positions (from ``positions``)."""
    rng = random.Random(seed)
    out = {}
    for _ in range(count):
        pos = rng.choice(positions) if positions is not None else rng.randrange(len(data))
        bit = rng.randrange(8)
        flipped = bytearray(data)
        flipped[pos] ^= 1 << bit
        out[f"flip-{pos}-{bit}"] = bytes(flipped)
    return out


def wrong_types() -> dict[str, bytes]:
    return {"png": PNG, "text": TEXT, "json-list": JSON_LIST}


def write_case(folder: Path, name: str, content: bytes | None) -> Path:
    """Write ``content`` to ``folder/name``; None makes ``folder/name`` a directory."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


# -- running cases in a subprocess ------------------------------------------------------------------------------

_BATCH = r'''
import json, sys, traceback, warnings
from pathlib import Path

from tvmfuse.errors import TvmfuseError

HOST = "x86-host"


def call(kind, path, extra):
    """The API call of one case; the return value is reported (JSON)."""
    if kind == "load":
        import tvmfuse
        return tvmfuse.load(path).outputs[0].name
    if kind == "import":
        from tvmfuse import frontend
        return [str(i) for i in frontend.import_model(path).inputs]
    if kind == "compile":
        import tvmfuse
        cm = tvmfuse.compile(path, target=extra.get("target", HOST), logs=extra.get("logs", False))
        return cm.tuning_logs
    if kind == "table":
        from tvmfuse.quant.table import CalibrationTable
        return len(CalibrationTable.load(path))
    if kind == "quantize-table":
        import tvmfuse
        return tvmfuse.quantize("zoo:tiny_convnet", table=path, target=HOST).quantization["method"]
    if kind == "calib":
        from tvmfuse.quant.data import load_calibration_data
        from tvmfuse.tensors import TensorInfo
        return len(load_calibration_data(path, [TensorInfo("input", (1, 3, 32, 32), "float32")]))
    if kind == "quantize-calib":
        import tvmfuse
        return tvmfuse.quantize("zoo:tiny_convnet", calib=path, target=HOST).quantization["method"]
    if kind == "logs":
        from tvmfuse import targets
        from tvmfuse.tune.database import LogStore
        db, report = LogStore(path, targets.resolve(extra.get("target", HOST))).load()
        return {"records": report.records, "skipped": len(report.skipped)}
    raise ValueError(kind)


for name, kind, path, extra in json.loads(Path(sys.argv[1]).read_text()):
    print(f"case {name}: started", file=sys.stderr, flush=True)  # the last one names a case that crashed
    outcome = {"case": name}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome["result"] = call(kind, path, extra)
        outcome.update(ok=True, warnings=[str(w.message) for w in caught if issubclass(w.category, UserWarning)])
    except TvmfuseError as e:
        outcome.update(ok=False, error=type(e).__name__, message=str(e))
    except Exception as e:  # reported, so that every case's outcome shows at once
        outcome.update(ok=False, error="UNEXPECTED " + type(e).__name__,
                       message="".join(traceback.format_exception(e))[-1500:])
    print(json.dumps(outcome), flush=True)
'''


def run_batch(tmp_path: Path, cases: list, timeout: int = 300) -> dict[str, dict]:
    """Run ``cases`` (``[name, kind, path, extra]``) in one subprocess; return name -> outcome.

    A crash fails here, naming the case that was running.
    """
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps([[name, kind, str(path), extra] for name, kind, path, extra in cases]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                       os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", _BATCH, str(spec)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tmp_path)
    started = [line for line in proc.stderr.splitlines() if line.startswith("case ")]
    assert proc.returncode == 0, (f"batch exited with {proc.returncode} (negative: killed by that signal) during "
                                  f"{started[-1] if started else '?'}\n{proc.stderr[-3000:]}")
    outcomes = {}
    for line in proc.stdout.splitlines():
        if line.startswith('{"case"'):
            outcome = json.loads(line)
            outcomes[outcome["case"]] = outcome
    assert set(outcomes) == {c[0] for c in cases}, proc.stderr[-3000:]
    return outcomes


def check_errors(outcomes: dict, expected: dict[str, tuple], may_pass: bool = False) -> None:
    """Each case ``name -> (path, texts)`` raised a TvmfuseError subclass with a one-line message naming
    ``path`` and holding one of ``texts``; with ``may_pass`` a case may also succeed (a harmless flip)."""
    bad = []
    for name, (path, wants) in expected.items():
        o = outcomes[name]
        wants = (wants,) if isinstance(wants, str) else wants
        if o["ok"] and may_pass:
            continue
        if o["ok"] or o["error"].startswith("UNEXPECTED") or "\n" in o["message"] or str(path) not in o["message"] \
                or not any(w in o["message"] for w in wants):
            bad.append(f"{name}: {o}")
    assert not bad, "\n".join(bad)


def cli(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tvmfuse", *map(str, argv)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def check_cli_error(proc: subprocess.CompletedProcess, command: str, *expected: str) -> None:
    """Exit status 2 and exactly one stderr line, ``tvmfuse <command>: error: ...``; no traceback."""
    assert proc.returncode == 2, f"exit status {proc.returncode} (negative: killed by that signal)\n{proc.stderr}"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tvmfuse {command}: error: "), proc.stderr
    assert all(e in lines[0] for e in expected), (expected, lines[0])


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# -- exported libraries and their manifests -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """zoo:tiny_convnet (x86-host) exported once for this module: ``lib.so`` and ``lib.json``.

    Compiled here, not shared: a model that has already run exports a library whose load prints TVM's
    "Scope Loaded" warnings on stderr (the VM's first use adds memory scopes to the executable), which would
    break the one-line checks below whatever ran first.
    """
    import tvmfuse

    return tvmfuse.compile("zoo:tiny_convnet", target=HOST).export(tmp_path_factory.mktemp("corrupt") / "lib.so")


def _library_cases(data: bytes) -> dict[str, tuple[bytes | None, str]]:
    cases = {name: (blob, "size does not match its manifest") for name, blob in truncations(data, (0, 64)).items()}
    cases.update({name: (blob, "sha256 does not match its manifest") for name, blob in bit_flips(data, 0, 3).items()})
    cases.update({name: (blob, "size does not match its manifest") for name, blob in wrong_types().items()})
    cases["directory"] = (None, "compiled model is a directory")
    return cases


LIBRARY_CASES = ["truncated-0", "truncated-64", "truncated-half", "truncated-short", "flip-0", "flip-1", "flip-2",
                 "png", "text", "json-list", "directory"]


def _pick(cases: dict, label: str):
    """Map the stable test ids above onto the generated case names (which hold sizes and positions)."""
    names = list(cases)
    if label == "truncated-half":
        return names[2]
    if label == "truncated-short":
        return names[3]
    if label.startswith("flip-"):
        return [n for n in names if n.startswith("flip-")][int(label[5:])]
    return label


@pytest.mark.parametrize("label", LIBRARY_CASES)
def test_cli_run_on_a_damaged_library_is_one_line_exit_2(exported, tmp_path, label):
    # One subprocess per case: this is where a truncated .so used to die of SIGBUS and a flipped one to run.
    cases = _library_cases(exported.read_bytes())
    content, message = cases[_pick(cases, label)]
    lib = write_case(tmp_path, "lib.so", content)
    (tmp_path / "lib.json").write_bytes(exported.with_suffix(".json").read_bytes())
    before = listing(tmp_path)
    proc = cli("run", lib, "--save", tmp_path / "out.npz")
    check_cli_error(proc, "run", f"{lib}: {message}")
    assert listing(tmp_path) == before  # no output, not even a partial one


def _manifest_cases(manifest_bytes: bytes) -> dict[str, tuple[bytes | None, str | tuple]]:
    manifest = json.loads(manifest_bytes)
    not_manifest = "not a tvmfuse manifest"
    # (Cut short of its final newline, which JSON does not need: one byte short loses the closing brace.)
    cases: dict[str, tuple[bytes | None, str | tuple]] = {
        name: (blob, not_manifest) for name, blob in truncations(manifest_bytes.rstrip(b"\n"), (0, 1)).items()}
    for name, blob in bit_flips(manifest_bytes, 1, 12).items():
        try:
            same = json.loads(blob) == manifest  # e.g. 1e-05 -> 1E-05 reads back the same: nothing to detect
        except ValueError:
            same = False
        if not same:
            cases[name] = (blob, (not_manifest, "edited after export"))
    cases.update({"png": (PNG, not_manifest), "text": (TEXT, not_manifest),
                  "json-list": (JSON_LIST, "a JSON object is expected, got list"),
                  "json-object": (b'{"inputs": []}', "format is None"), "directory": (None, "manifest is a directory"),
                  "deep-nesting": (b"[" * 100_000, not_manifest)})

    def edited(change, message):
        m = json.loads(manifest_bytes)
        change(m)
        return json.dumps(m, indent=2).encode(), message

    def legacy(change, message):  # format_version 1: no seal, so only the structure check stands guard
        m = json.loads(manifest_bytes)
        del m["library"], m["digest"]
        m["format_version"] = 1
        change(m)
        return json.dumps(m).encode(), message

    cases["edited-input-shape"] = edited(lambda m: m["inputs"][0].update(shape=[1, 3, 64, 64]), "edited after export")
    cases["edited-dtype"] = edited(lambda m: m["inputs"][0].update(dtype="int8"), "edited after export")
    cases["edited-sha256"] = edited(lambda m: m["library"].update(sha256="0" * 64), "edited after export")
    cases["no-outputs"] = edited(lambda m: m.update(outputs=[]), "edited after export")
    cases["seal-removed"] = edited(lambda m: (m.pop("digest"), m.pop("library")),
                                   "'digest' or 'library' entry is missing")
    cases["newer-version"] = edited(lambda m: m.update(format_version=99), "written by a newer tvmfuse")
    cases["version-string"] = edited(lambda m: m.update(format_version="2"), "is not a version number")
    cases["legacy-bad-shape"] = legacy(lambda m: m["inputs"][0].update(shape=["a"]), "'shape' must be a list")
    cases["legacy-bad-dtype"] = legacy(lambda m: m["inputs"][0].update(dtype="float33"), "is not a numpy dtype")
    cases["legacy-dynamic-input"] = legacy(lambda m: m["inputs"][0].update(shape=[-1, 3, 32, 32]), "ints >= 1")
    cases["legacy-outputs-not-list"] = legacy(lambda m: m.update(outputs="x"), "'outputs' must be a list")
    cases["legacy-target-list"] = legacy(lambda m: m.update(target=[]), "'target' must be an object")
    cases["legacy-cpu-flags"] = legacy(lambda m: m.update(cpu_flags=[1]), "'cpu_flags' must be a list of strings")
    return cases


def test_damaged_libraries_and_manifests_raise_model_load_error(exported, tmp_path):
    """Through ``tvmfuse.load`` in one subprocess: each case one ModelLoadError naming the file."""
    lib_bytes, manifest_bytes = exported.read_bytes(), exported.with_suffix(".json").read_bytes()
    cases, expected = [], {}
    for name, (content, message) in _library_cases(lib_bytes).items():
        folder = tmp_path / f"lib-{name}"
        lib = write_case(folder, "lib.so", content)
        (folder / "lib.json").write_bytes(manifest_bytes)
        cases.append([f"lib-{name}", "load", lib, {}])
        expected[f"lib-{name}"] = (lib, f"{lib}: {message}")
    for name, (content, message) in _manifest_cases(manifest_bytes).items():
        folder = tmp_path / f"manifest-{name}"
        write_case(folder, "lib.json", content)
        (folder / "lib.so").write_bytes(lib_bytes)
        cases.append([f"manifest-{name}", "load", folder / "lib.so", {}])
        expected[f"manifest-{name}"] = (f"{folder / 'lib.json'}: ", message)
    # An intact format_version 1 pair (exported before the checks) still loads, with a warning.
    legacy = json.loads(manifest_bytes)
    del legacy["library"], legacy["digest"]
    legacy["format_version"] = 1
    write_case(tmp_path / "legacy", "lib.json", json.dumps(legacy).encode())
    (tmp_path / "legacy" / "lib.so").write_bytes(lib_bytes)
    cases.append(["legacy-intact", "load", tmp_path / "legacy" / "lib.so", {}])
    outcomes = run_batch(tmp_path, cases)
    check_errors(outcomes, expected)
    assert all(outcomes[n]["error"] == "ModelLoadError" for n in expected)
    intact = outcomes["legacy-intact"]
    assert intact["ok"] and intact["result"] == "output", intact
    assert any("records no checksum" in w for w in intact["warnings"]), intact


@pytest.mark.parametrize("label, message", [("edited-input-shape", "edited after export"),
                                            ("png", "not a tvmfuse manifest")], ids=["edited-input-shape", "png"])
def test_cli_run_with_a_bad_manifest_is_one_line_exit_2(exported, tmp_path, label, message):
    content, _ = _manifest_cases(exported.with_suffix(".json").read_bytes())[label]
    (tmp_path / "lib.json").write_bytes(content)
    (tmp_path / "lib.so").write_bytes(exported.read_bytes())
    check_cli_error(cli("run", tmp_path / "lib.so"), "run", f"{tmp_path / 'lib.json'}: {message}")


def test_export_seals_the_manifest(exported):
    from tvmfuse.integrity import MANIFEST_VERSION, file_sha256, manifest_digest

    manifest = json.loads(exported.with_suffix(".json").read_text())
    size, sha = file_sha256(exported)
    assert manifest["format_version"] == MANIFEST_VERSION == 2
    assert manifest["library"] == {"size": size, "sha256": sha} and size == exported.stat().st_size
    assert manifest["digest"] == manifest_digest(manifest)


def test_run_inputs_damaged_npz_is_one_line_exit_2(exported, tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    np.savez(tmp_path / "good.npz", input=x)
    good = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "empty.npz").write_bytes(good[:0])  # numpy: EOFError
    (tmp_path / "cut.npz").write_bytes(good[: len(good) // 2])  # zipfile: BadZipFile
    np.save(tmp_path / "single.npy", x)
    for name in ("empty.npz", "cut.npz", "single.npy"):
        check_cli_error(cli("run", exported, "--inputs", tmp_path / name), "run", f"--inputs {tmp_path / name}",
                        "cannot read as .npz")


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
        expected[name] = (path, (f"{path} is not an ONNX model", "model path is a directory, not an ONNX file"))
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
    check_cli_error(proc, "compile", f"{model} is not an ONNX model")
    assert listing(tmp_path) == before


# -- tuning logs ------------------------------------------------------------------------------------------------------

LOGS_TARGET = "x86-avx512"  # the shipped folder; decoding and compiling (without running) work on any CPU
ON_LOGS_TARGET = {"target": LOGS_TARGET}


@pytest.fixture(scope="module")
def logs_base(tmp_path_factory) -> Path:
    """A logs root holding the shipped x86-avx512 logs cut to their three smallest workloads and those
    workloads' records, and helpers.tune.MODEL as ``m.onnx``."""
    from helpers.tune import MODEL

    from tvmfuse.tune.database import RECORDS, WORKLOADS

    shipped = Path(__file__).resolve().parents[1] / "tuning_logs" / LOGS_TARGET
    workloads = (shipped / WORKLOADS).read_text().splitlines()
    smallest = sorted(range(len(workloads)), key=lambda i: len(workloads[i]))[:3]
    new_index = {old: new for new, old in enumerate(smallest)}
    records = [json.loads(line) for line in (shipped / RECORDS).read_text().splitlines()]
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
