"""Measuring on another machine (``--measure-only DIR``) and combining the results (``--merge``).

``tvmfuse compare ... -o DIR`` leaves everything another machine needs in ``DIR``: the libraries
(``libs/``), the model with its shapes fixed (``model.onnx``), the inputs (``inputs.npz``) and
onnxruntime FP32's outputs on them (``reference.npz``). On a lent GPU machine or a deployment box,
``tvmfuse compare --measure-only DIR`` loads the libraries that can run there (with the TVM runtime),
checks and times them (and the peers, where installed) and writes ``measured-<host>.json``.
``tvmfuse compare --merge DIR/report.json measured-gpu.json -o OUT`` puts the rows side by side, grouped by
device: ratios come only from rows measured in the same run on the same device, never across machines.
"""

from __future__ import annotations

import copy
import socket
from pathlib import Path

import numpy as np

from .. import targets
from ..errors import InputError
from . import arms as arms_mod
from . import contenders as peers_mod
from .environment import cpu_device, environment
from .report import Report, atomic_write
from .run import _peer_row, measure, run_id


def _inputs(directory: Path) -> list[dict]:
    path = directory / "inputs.npz"
    if not path.exists():
        raise InputError(f"{directory}: no inputs.npz (measure-only needs a folder written by tvmfuse compare -o)")
    with np.load(path, allow_pickle=False) as saved:
        count = 1 + max(int(k.split("/", 1)[0]) for k in saved.files)
        xs = [{} for _ in range(count)]
        for k in saved.files:
            i, name = k.split("/", 1)
            xs[int(i)][name] = saved[k]
    return xs


def measure_only(directory, output=None, budget: float | None = None, threads: int | None = None,
                 profile: bool = True, progress: bool = False) -> Path:
    """Measure the libraries of a ``compare`` folder on this machine; write and return the result file."""
    import json

    from ..threads import cpu_budget

    directory = Path(directory)
    source = Report.load(directory).data
    threads = threads or cpu_budget()
    xs = _inputs(directory)
    run = run_id()
    data = copy.deepcopy({k: source[k] for k in ("schema", "command", "seed", "model", "settings")})
    data.update(created=run.split(" ", 1)[1], environment=environment(threads), contenders=[], ratios=[], fastest={})
    data["settings"].update(threads=threads, measured_from=str(directory))
    if budget is not None:
        data["settings"]["budget_s"] = budget
    for old in source["contenders"]:
        if old["kind"] != "tvmfuse" or old["build"] is None:
            continue
        row = dict(old, run=run, status="build-only", threads=None, correctness=None, latency=None, profile=None)
        spec = targets.resolve(old["target"])
        row["device"] = arms_mod.device_of(spec)
        row["reason"] = spec.backend().why_not_runnable()
        if not (directory / old["build"]["library"]).exists():
            row.update(status="failed", reason=f"library {old['build']['library']} is missing from {directory}")
        data["contenders"].append(row)
    made = {}
    shapes = {i["name"]: tuple(i["shape"]) for i in source["model"]["inputs"]}
    for old in source["contenders"]:
        if old["kind"] != "peer":
            continue
        row = _peer_row(old["name"], cpu_device())
        row["run"] = run
        peer = peers_mod.make_peer(old["name"], (directory / "model.onnx").read_bytes(), directory / "model.onnx",
                                   shapes, threads)
        if isinstance(peer, str):
            row.update(status="not installed" if "not installed" in peer else "failed", reason=peer)
        else:
            made[old["name"]] = peer
        data["contenders"].append(row)
    names = [r["name"] for r in data["contenders"]]
    if data["settings"]["baseline"] not in names and names:
        data["settings"]["baseline"] = names[0]
    y = None  # labels stay with the original run's machine; accuracy is reported there
    measure(data, directory, made, xs, y, threads, profile, progress)
    path = Path(output) if output is not None else directory / f"measured-{socket.gethostname()}.json"
    atomic_write(path, json.dumps(data, indent=1) + "\n")
    return path


def merge(paths, output=None) -> Report:
    """Combine reports (``report.json`` files or result files of ``--measure-only``) into one.

    Rows keep their device and run; a name measured in several runs gets `` [host]`` appended after its
    first appearance. Ratios and the fastest row come from each run alone.
    """
    if len(paths) < 2:
        raise InputError("--merge needs at least two report files")
    reports = [Report.load(p).data for p in paths]
    out = copy.deepcopy(reports[0])
    out["merged_from"] = []
    out["contenders"], out["ratios"], out["fastest"] = [], [], {}
    seen: set[str] = set()
    for path, data in zip(paths, reports):
        if data["model"]["sha256"] != reports[0]["model"]["sha256"]:
            raise InputError(f"{path}: a different model ({data['model']['source']}, sha256 "
                             f"{data['model']['sha256'][:12]}) than {paths[0]} ({reports[0]['model']['source']})")
        host = data["environment"].get("host", "?")
        renamed = {}
        for row in data["contenders"]:
            name = row["name"]
            if name in seen:
                name = f"{name} [{host}]"
            seen.add(name)
            renamed[row["name"]] = name
            out["contenders"].append(dict(row, name=name))
        for r in data["ratios"]:
            out["ratios"].append(dict(r, contender=renamed[r["contender"]], baseline=renamed[r["baseline"]]))
        for device, name in data["fastest"].items():
            key = device if device not in out["fastest"] else f"{device} [{host}]"
            out["fastest"][key] = renamed[name]
        out["merged_from"].append({"file": str(path), "run": data["created"], "environment": data["environment"]})
    report = Report(out)
    if output is not None:
        report.write(output)
    return report

