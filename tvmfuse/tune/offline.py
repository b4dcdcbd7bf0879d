"""Offline tuning: candidates built here, timed on a device no tracker reaches, the winners written back.

A GPU is lent now and then, for minutes, with no network path to it, so MetaSchedule's RPC runner cannot
measure there. Instead:

1. here, :func:`export_candidates` builds, for every kernel of a model whose rule has knobs
   (``Backend.candidates``: the CUDA GEMM tiles of conv2d and dense, the depthwise tiles), one library holding
   each candidate schedule as a function ``candidate<i>`` (real cubins; the default schedule is ``candidate0``), and a JSON
   file per kernel with the tuning record of each candidate;
2. there, ``bench/device/time_candidates.py`` (TVM runtime only) checks every candidate's output against
   ``candidate0`` on the same inputs and times it, writing one results JSON;
3. here, :func:`import_results` writes each kernel's fastest correct candidate into the target's tuning logs
   (``tuning_logs/<target>/``) with its time, and compile applies it (``scheduled_by``: ``tuning_log``); every
   correct candidate's time trains the XGBoost cost model kept with the logs (:mod:`.cost_model`), which
   picks what the next round builds (``max_candidates``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import targets
from ..errors import InputError
from . import cost_model
from .database import LogStore, default_root
from .records import decoded_record, record_json, register_intrinsics

CANDIDATES = "tvmfuse-candidates"  # format of a kernel's candidate file
TIMES = "tvmfuse-candidate-times"  # format of the device's results file
TIMES_VERSION = 1


def _args(func) -> list[dict]:
    """Shape and dtype of each buffer parameter, in order (the output last)."""
    from tvm.s_tir import meta_schedule as ms

    return [{"shape": [int(d) for d in a.shape], "dtype": str(a.dtype)}
            for a in ms.arg_info.ArgInfo.from_prim_func(func)]


def export_candidates(model, target, directory, shapes=None, precision: str = "fp32",
                      max_candidates: int | None = None, logs=None, consts=None, table=None) -> list[Path]:
    """Build the candidates of every kernel of ``model`` with knobs for ``target`` into ``directory``; return
    the candidate files written (one ``<index>_<kernel>.json`` + ``.so`` pair per kernel). ``max_candidates``:
    per kernel, the default and the best the cost model of the tuning logs ``logs`` (default: the shipped
    folder) predicts, once it has learnt enough (:mod:`.cost_model`); every candidate until then. ``consts``:
    pinned inputs, as for ``tvmfuse.compile``. ``precision`` ``"int8"`` needs ``table`` (a
    ``CalibrationTable`` or its path): the library ``tvmfuse.quantize(table=...)`` builds, whose INT8 kernels
    the records then fit."""
    from ..quant.table import CalibrationTable

    if (precision == "int8") != (table is not None):
        raise InputError("offline INT8 candidates need the calibration table the library will be quantized with "
                         "(--precision int8 --table TABLE), and a table goes with --precision int8")
    if table is not None and not isinstance(table, CalibrationTable):
        table = CalibrationTable.load(Path(table))
    import tvm
    from tvm import s_tir
    from tvm.driver import build as tvm_build
    from tvm.s_tir import meta_schedule as ms

    from .tuner import extract_tasks

    spec = targets.resolve(target)
    backend = spec.backend()
    tvm_target = spec.tvm_target()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    predictor = None
    if max_candidates is not None:
        if max_candidates < 1:
            raise InputError(f"--max-candidates {max_candidates}: give at least 1 (the default schedule)")
        predictor = cost_model.load(LogStore(logs if logs is not None else default_root(), spec).path)
    float_precision = "fp32" if precision == "int8" else precision
    for index, task in enumerate(extract_tasks(model, spec, shapes, float_precision, consts, table)):
        found = backend.candidates(task.mod)
        if len(found) < 2:
            continue  # one schedule: nothing to choose
        workload = ms.database.Workload(task.mod)
        args_info = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        ranked = None
        if predictor is not None and len(found) > max_candidates:
            order = cost_model.rank(predictor, task.mod, tvm_target, args_info, [trace for _, trace in found])
            if order is not None:
                found = [found[0]] + [found[i] for i in order if i != 0][:max_candidates - 1]
                ranked = {"samples": cost_model.samples(predictor), "kept": len(found)}
        functions, entries = {}, []
        for i, (config, trace) in enumerate(found):
            sch = s_tir.Schedule(task.mod)
            trace.apply_to_schedule(sch, remove_postproc=False)
            name = f"candidate{i}"
            functions[name] = sch.mod["main"].with_attr("global_symbol", name)
            record = ms.database.TuningRecord(trace, workload, None, tvm_target, args_info)
            entries.append({"function": name, "config": config, "record": record_json(record)})
        module = tvm.transform.Sequential(backend.kernel_passes())(tvm.IRModule(functions))
        stem = f"{index:03d}_{task.name}"
        library = directory / f"{stem}.so"
        with tvm_target:  # nvcc reads the architecture from the current target
            tvm_build(module, target=tvm_target, pipeline=backend.tir_pipeline()).export_library(str(library))
        info = {"format": CANDIDATES, "kernel": task.name, "key": task.key, "weight": task.weight,
                "target": spec.to_json(), "precision": precision, "library": library.name,
                "args": _args(task.mod["main"]), "workload": workload.as_json(), "ranked_by_cost_model": ranked,
                "candidates": entries}
        path = directory / f"{stem}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, path)
        written.append(path)
    return written


def _read_json(path: Path, what: str, fmt: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError(f"{what} {path}: cannot read ({e.strerror or type(e).__name__})") from None
    except ValueError as e:
        raise InputError(f"{what} {path}: not JSON ({str(e)[:80]})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise InputError(f"{what} {path}: not a {fmt} file")
    return data


def import_results(results, directory, logs=None) -> dict:
    """Write each kernel's fastest correct candidate from the device's ``results`` (timings of the candidate
    files in ``directory``) into the tuning logs ``logs`` (default: the shipped folder). Returns kernel name ->
    what was written: ``{"candidate", "us", "default_us"}``, or ``{"skipped": why}``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from .shared_form import shared_form

    times = _read_json(Path(results), "results", TIMES)
    outcome, stores, learnt = {}, {}, {}
    for kernel, measured in sorted((times.get("kernels") or {}).items()):
        candidates_path = Path(directory) / f"{measured.get('file', '')}"
        info = _read_json(candidates_path, "candidates", CANDIDATES)
        if info.get("key") != measured.get("key"):
            outcome[kernel] = {"skipped": f"{candidates_path.name} holds another kernel (key differs)"}
            continue
        ok = [c for c in measured.get("candidates", []) if c.get("ok") and isinstance(c.get("us"), (int, float))]
        if not ok:
            outcome[kernel] = {"skipped": "no candidate matched candidate0's output"}
            continue
        best = min(ok, key=lambda c: c["us"])
        entry = next(e for e in info["candidates"] if e["function"] == best["function"])
        spec = targets.resolve(dict(info["target"]["config"], host=info["target"]["host"],
                                    backend=info["target"].get("backend", "")) if info["target"]["name"] == "custom"
                               else info["target"]["name"])
        register_intrinsics(spec, (e["record"] for e in info["candidates"]))
        # filed under the kernel's shared form, so the record applies whatever constants (calibration table) the
        # compiled kernel has
        exact = ms.database.Workload.from_json(info["workload"])
        workload = ms.database.Workload(tvm.IRModule({"main": shared_form(exact.mod["main"])}))
        record = decoded_record(entry["record"], workload)
        timed = ms.database.TuningRecord(record.trace, workload, [best["us"] * 1e-6], spec.tvm_target(),
                                         record.args_info)
        store = stores.setdefault(spec.name, LogStore(logs if logs is not None else default_root(), spec))
        store.append([(workload.as_json(), record_json(timed))])
        default = next((c["us"] for c in ok if c["function"] == "candidate0"), None)
        outcome[kernel] = {"candidate": best["function"], "us": best["us"], "default_us": default}
        traces = {e["function"]: decoded_record(e["record"], workload).trace for e in info["candidates"]}
        learnt.setdefault(spec.name, []).append(
            (workload.mod, spec.tvm_target(), record.args_info, [(traces[c["function"]], c["us"]) for c in ok]))
    for name, kernels in learnt.items():  # every correct candidate's time, for the next round's ranking
        count = cost_model.learn(stores[name].path, kernels)
        for kernel in outcome:
            if "candidate" in outcome[kernel]:
                outcome[kernel].setdefault("model_samples", count)
    return outcome
