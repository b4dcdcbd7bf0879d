"""Damaged and wrong-type input files for the corrupt-input tests (``tests/test_corrupt_*.py``): truncations,
seeded bit flips and wrong-type contents; cases run through the API in one subprocess per kind
(:func:`run_batch`: a segfault fails a test instead of killing pytest) and through the CLI (:func:`cli`)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
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
