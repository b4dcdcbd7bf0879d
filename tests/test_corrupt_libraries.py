"""Damaged exported libraries, manifests and ``run --inputs`` files: a one-line TvmfuseError (exit 2 from the
CLI), never a crash.

Every kind of file tvmfuse reads gets truncated (0 bytes and more), bit-flipped (seeded positions) and
wrong-type (a PNG, text, a JSON list, a directory) versions (``helpers.corrupt``). Everything runs in
subprocesses, so a segfault or SIGBUS fails a test instead of killing pytest. Library files go through
``tvmfuse run`` one subprocess each (that is where native code maps them). Models, tuning logs and
calibration files: ``test_corrupt_inputs.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import HOST
from helpers.corrupt import (
    PNG, TEXT, JSON_LIST, truncations, bit_flips, wrong_types, write_case, run_batch, check_errors, cli,
    check_cli_error, listing)

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
    from tvmfuse.runtime.integrity import MANIFEST_VERSION, file_sha256, manifest_digest

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
    for name in ("cut.npz", "single.npy"):
        check_cli_error(cli("run", exported, "--inputs", tmp_path / name), "run", f"--inputs {tmp_path / name}",
                        "cannot read as .npz")
    check_cli_error(cli("run", exported, "--inputs", tmp_path / "empty.npz"), "run",
                    f"--inputs {tmp_path / 'empty.npz'}: not an .npz file")
