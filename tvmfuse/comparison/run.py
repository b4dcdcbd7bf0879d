"""``tvmfuse.compare``: build every arm, check every contender's outputs, time them together, profile them."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import shlex
import socket
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InputError
from . import arms as arms_mod
from . import contenders as peers_mod
from . import correctness, environment, stats, timing
from .report import SCHEMA, Report, html_missing

PROFILE_S = 2.0  # about this long per contender for its kernel profile


def _log(enabled: bool, text: str) -> None:
    if enabled:
        print(f"compare: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def fixed_threads():
    """The adaptive governor off while measuring: every contender keeps the thread count it was given."""
    old = os.environ.get("TVMFUSE_THREADS")
    os.environ["TVMFUSE_THREADS"] = "fixed"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TVMFUSE_THREADS", None)
        else:
            os.environ["TVMFUSE_THREADS"] = old


def run_id() -> str:
    return f"{socket.gethostname()} {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}"


def _peer_row(name: str, device: str) -> dict:
    return {"name": name, "kind": "peer", "target": None, "precision": "fp32", "logs": None, "device": device,
            "status": "measured", "reason": "", "build": None, "threads": None, "correctness": None,
            "latency": None, "profile": None}


def _model(model, shapes):
    from ..frontend.load import fix_input_shapes, load_model

    proto, source = load_model(model)
    digest = hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()
    infos = fix_input_shapes(proto, shapes)
    return proto, source, digest, infos


def compare(model, arms: Sequence[str] | str, peers: Sequence[str] = ("onnxruntime",), baseline: str | None = None,
            calib=None, int8_method: str = "entropy", inputs=None, labels=None, threads: int | None = None,
            budget: float = 60.0, logs=None, seed: int = 0, output=None, shapes=None, target_ci: float = 0.02,
            profile: bool = True, progress: bool = False, command: str | None = None) -> Report:
    """Build ``arms`` (``TARGET[:fp32|:int8][@LOGS]``), measure them beside ``peers``; return the Report.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        As for :func:`tvmfuse.compile` (``zoo:NAME`` for a built-in model).
    arms : list of str or str
        Arms such as ``["x86-avx512", "x86-avx512:int8", "x86-host@none", "cuda-sm90"]`` (or comma-separated).
    peers : list of str
        ``"onnxruntime"`` and/or ``"openvino"``; a peer that is not installed is a row saying so.
    baseline : str, optional
        The arm or peer every ratio is taken against (default: the first arm).
    calib, int8_method
        Calibration data for INT8 arms (as :func:`tvmfuse.quantize`); without it the comparison inputs.
    inputs, labels
        An ``.npz`` (or ``.npy`` folder) of input batches and an ``.npy`` of integer labels; default four
        seeded random batches.
    threads : int, optional
        Threads for every contender (default: this process's CPU budget, :func:`tvmfuse.threads.cpu_budget`).
    budget : float
        Seconds of timing at most (rounds stop earlier once every ratio's interval is within ``target_ci``).
    logs : str or os.PathLike, optional
        Tuning logs folder for arms without ``@LOGS`` (default: the shipped logs).
    output : str or os.PathLike, optional
        The report folder: libraries go to ``libs/``; the report files are written when given.
    """
    from ..threads import cpu_budget

    if output is not None and html_missing():  # said before minutes of measuring, not after
        warnings.warn(f"index.html will not be written: {html_missing()}; report.json and report.md will",
                      stacklevel=2)
    arm_list = arms_mod.parse_arms(arms if isinstance(arms, str) else ",".join(arms))
    peers = list(dict.fromkeys(peers))
    for p in peers:
        if p not in peers_mod.peer_names():
            raise InputError(f"unknown peer {p!r}; known: {', '.join(peers_mod.peer_names())}")
    names = [a.name for a in arm_list] + peers
    baseline = baseline or names[0]
    if baseline not in names:
        raise InputError(f"--baseline {baseline!r} is neither an arm nor a peer ({', '.join(names)})")
    threads = threads or cpu_budget()
    if threads < 1:
        raise InputError(f"--threads must be at least 1, got {threads}")
    proto, source, digest, infos = _model(model, shapes)
    xs = correctness.samples(inputs, infos, seed)
    y = correctness.labels(labels, len(xs))
    out = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="tvmfuse-compare-"))
    libs = out / "libs"
    libs.mkdir(parents=True, exist_ok=True)
    model_path = out / "model.onnx"
    model_path.write_bytes(proto.SerializeToString())
    np.savez(out / "inputs.npz", **{f"{i}/{k}": v for i, x in enumerate(xs) for k, v in x.items()})
    env = environment.environment(threads)
    run = run_id()
    rows, built = [], {}
    for arm in arm_list:
        _log(progress, f"building {arm.name}")
        if arm.logs == "default" and logs is not None:
            arm = arms_mod.Arm(arm.name, arm.target, arm.precision, str(logs))
        row, cm = arms_mod.build(arm, proto, None, calib if calib is not None else xs, int8_method, libs)
        row["run"] = run
        rows.append(row)
        built[arm.name] = cm
    cpu = environment.cpu_device()
    made = {}
    for p in peers:
        row = _peer_row(p, cpu)
        row["run"] = run
        peer = peers_mod.make_peer(p, proto.SerializeToString(), model_path, {i.name: i.shape for i in infos}, threads)
        if isinstance(peer, str):
            row.update(status="not installed" if "not installed" in peer else "failed", reason=peer)
        else:
            made[p] = peer
        rows.append(row)
    data = {"schema": SCHEMA, "created": run.split(" ", 1)[1], "command": command or _command(),
            "seed": seed, "model": {"source": source, "sha256": digest, "inputs": [i.to_json() for i in infos],
                                    "samples": len(xs), "labels": y is not None},
            "settings": {"threads": threads, "budget_s": budget, "baseline": baseline, "target_ci": target_ci,
                         "calibration": _calibration_text(calib, int8_method, len(xs))},
            "environment": env, "contenders": rows, "ratios": [], "fastest": {}}
    measure(data, out, made, xs, y, threads, profile, progress)
    report = Report(data)
    if output is not None:
        report.write(out, formats=("json", "md") if html_missing() else ("json", "md", "html"))
    return report


def _command() -> str:
    return " ".join(shlex.quote(a) for a in ["tvmfuse", *sys.argv[1:]]) if sys.argv and sys.argv[0].endswith(
        "tvmfuse") else " ".join(shlex.quote(a) for a in sys.argv)


def _calibration_text(calib, method: str, count: int) -> str:
    if calib is None:
        return f"{method}, on the {count} comparison input batches"
    return f"{method}, on {calib if isinstance(calib, (str, os.PathLike)) else 'the given batches'}"


def measure(data: dict, out: Path, peers: dict, xs: list, y, threads: int, profile: bool, progress: bool) -> None:
    """Load, check, time and profile every contender that can run here; fill ``data`` in place."""
    rows = {r["name"]: r for r in data["contenders"]}
    live = {}
    with fixed_threads():
        for name, row in rows.items():
            if row["kind"] != "tvmfuse" or row["build"] is None:
                continue
            if row["reason"]:
                continue  # build-only: cannot run here (the reason says why)
            try:
                live[name] = peers_mod.TvmfuseContender(name, out / row["build"]["library"], threads,
                                                        row["build"].get("kernel_info"))
            except Exception as e:  # noqa: BLE001 - a library that does not load is a row, not a crash
                row.update(status="failed", reason=f"load: {(str(e).splitlines() or [''])[0][:300]}")
        live.update(peers)
        _check(rows, live, xs, y, reference_outputs(out, xs), progress)
        runnable = live
        for name in runnable:
            rows[name]["status"] = "measured"
            rows[name]["threads"] = {"requested": threads, "read_back": runnable[name].threads()}
        _time(data, rows, runnable, xs[0], progress)
        if profile:
            for name, c in runnable.items():
                _log(progress, f"profiling {name}")
                p50 = rows[name]["latency"]["p50"] / 1e3 if rows[name]["latency"] else 0.01
                rows[name]["profile"] = c.profile(xs[0], max(3, min(50, int(PROFILE_S / max(p50, 1e-4)))))
    data["environment"]["load_after"] = environment.load()


def reference_outputs(out: Path, xs: list) -> list | None:
    """onnxruntime FP32's outputs on ``xs`` (saved as ``reference.npz`` for ``--measure-only`` on machines
    without onnxruntime); None when it is neither installed nor saved."""
    path = out / "reference.npz"
    if path.exists():
        with np.load(path, allow_pickle=False) as saved:
            count = len({k.split("/")[1] for k in saved.files})
            return [[saved[f"{i}/{j}"] for j in range(count)] for i in range(len(xs))]
    peer = peers_mod.make_peer("onnxruntime", (out / "model.onnx").read_bytes(), None, {}, 1)
    if isinstance(peer, str):
        return None
    ref = [peer.run(x) for x in xs]
    np.savez(path, **{f"{i}/{j}": a for i, outs in enumerate(ref) for j, a in enumerate(outs)})
    return ref


def _check(rows: dict, live: dict, xs: list, y, ref: list | None, progress: bool) -> None:
    """Every live contender's outputs on every sample against onnxruntime FP32 (``ref``; None: unchecked)."""
    outputs = {}
    for name, c in list(live.items()):
        try:
            outputs[name] = [c.run(x) for x in xs]
        except Exception as e:  # noqa: BLE001 - a contender that fails at run time is a row with the reason
            rows[name].update(status="failed", reason=f"run: {(str(e).splitlines() or [''])[0][:300]}")
            del live[name]
    for name, got in outputs.items():
        row = rows[name]
        if ref is None:
            continue
        fp32 = None
        if row["precision"] == "int8":
            twin = outputs.get(row["target"])  # the same target's FP32 arm, when compared too
            fp32 = twin if twin is not None else ref
        row["correctness"] = correctness.check(got, ref, row["precision"], y, fp32)
    _log(progress, "checked outputs against onnxruntime FP32" if ref is not None else
         "onnxruntime is not installed: outputs not checked")


def _time(data: dict, rows: dict, live: dict, x: dict, progress: bool) -> None:
    baseline = data["settings"]["baseline"]
    if baseline not in live:
        if not live:
            return
        _log(progress, f"baseline {baseline} cannot be measured here; ratios use {next(iter(live))}")
        baseline = next(iter(live))
        data["settings"]["measured_baseline"] = baseline
    twin_name = f"{baseline} (A/A)"
    twin = _twin(live[baseline], rows[baseline])
    fns = {n: (lambda c=c: c.run(x)) for n, c in live.items()}
    if twin is not None:
        fns[twin_name] = lambda: twin.run(x)
    def device(n):  # the A/A twin has no row yet: it runs where its baseline runs
        return rows.get(n, rows[baseline])["device"]

    by_device = {}
    for n in fns:
        by_device.setdefault(device(n), []).append(n)
    pairs = [(n, baseline) for n in fns if n != baseline and device(n) == device(baseline)]
    _log(progress, f"timing {len(fns)} contenders, {data['settings']['budget_s']:.0f} s at most")
    rounds = timing.measure(fns, baseline, pairs, budget_s=data["settings"]["budget_s"],
                            target_ci=data["settings"]["target_ci"], seed=data["seed"])
    if twin is not None:
        aa = dict(rows[baseline], name=twin_name, kind="aa", build=None, profile=None,
                  reason=f"{baseline} loaded a second time")
        data["contenders"].append(aa)
        rows[twin_name] = aa
    for n, r in rounds.items():
        rows[n]["latency"] = stats.latency_summary(r)
    for n, b in pairs:
        est = stats.paired_ratio(rounds[n], rounds[b])
        data["ratios"].append({"contender": n, "baseline": b, "device": rows[n]["device"], **est})
    for device in by_device:
        ok = [n for n in by_device[device] if rows[n]["kind"] != "aa" and rows[n]["latency"]
              and (rows[n]["correctness"] or {}).get("within_tolerance", True)]
        if ok:
            data["fastest"][device] = min(ok, key=lambda n: rows[n]["latency"]["p50"])


def _twin(contender, row: dict):
    """A second, independently loaded copy of the baseline (None when it cannot be made)."""
    try:
        if isinstance(contender, peers_mod.TvmfuseContender):
            return peers_mod.TvmfuseContender(row["name"], contender.model.path, contender._threads,
                                              contender.kernel_info)
        if isinstance(contender, peers_mod.OnnxRuntimeContender):
            return peers_mod.OnnxRuntimeContender(row["name"], contender._bytes, contender._threads)
        return peers_mod.OpenVinoContender(row["name"], *contender._args)
    except Exception:  # noqa: BLE001 - no noise floor row rather than no report
        return None
