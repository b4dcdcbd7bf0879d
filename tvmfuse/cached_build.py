"""What ``compile`` needs from the cache and the tuning logs: the logs it applies (decoded once per process
while unchanged), the fingerprints of its options, and whole builds looked up and stored
(:mod:`tvmfuse.cache.models`)."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from . import targets
from .cache import models

_LOADED_LOGS: dict = {}
_LOGS_LOCK = threading.Lock()


def _log_stores(logs, spec: targets.TargetSpec) -> list:
    from .tune.database import LogStore, default_root, shipped_fallback

    root = default_root() if logs is None or logs is True else logs
    fallback = shipped_fallback(spec)
    return [LogStore(root, spec)] + ([LogStore(root, fallback)] if fallback is not None else [])


def load_logs(logs, spec: targets.TargetSpec):
    """The tuning logs for ``spec`` (a :class:`~tvmfuse.tune.lazy_logs.LazyLogs`: records decoded when a kernel
    needs them) and its manifest entry; (None, None) when there is nothing to apply."""
    if logs is False or not spec.backend().applies_tuning_logs:
        return None, None
    stores = _log_stores(logs, spec)
    # Decoding a folder's records costs about a second; a process that compiles again (compare's arms, a test
    # suite, a service) reuses what it decoded while the files are unchanged.
    key = tuple((str(s.path), s.stamp()) for s in stores)
    with _LOGS_LOCK:
        loaded = _LOADED_LOGS.get(key)
    if loaded is None:
        from .tune.lazy_logs import LazyLogs

        lazy = LazyLogs(stores[0], fill_from=stores[1] if len(stores) > 1 else None)
        report = lazy.report
        loaded = (None, None) if report.records == 0 and not report.skipped else (lazy, report.to_json())
        with _LOGS_LOCK:
            _LOADED_LOGS[key] = loaded
    return loaded[0], (dict(loaded[1]) if loaded[1] is not None else None)


def logs_digest(logs, spec: targets.TargetSpec) -> str:
    """The content of the tuning logs a compile would apply ("none" when it applies none)."""
    files = log_files(logs, spec)
    return models.digest_files(files) if files else "none"


def _hash_arrays(h, arrays) -> None:
    """Feed ``h`` each named array's name, dtype, shape and bytes, in name order."""
    for name in sorted(arrays, key=str):
        value = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{value.dtype}\0{value.shape}\0".encode())
        h.update(value.tobytes())


def consts_digest(consts) -> str | None:
    """The pinned inputs' names, dtypes, shapes and values, as a digest (None when there are none)."""
    if not consts:
        return None
    h = hashlib.sha256()
    _hash_arrays(h, consts)
    return h.hexdigest()


def quantize_digest(calib, table, preprocess) -> str | None:
    """The content a quantize build calibrates from: a calibration table (the path of one, or one), or
    calibration data that is a file, a folder, ``"random:N"``, a batch or a list of batches; None where it
    cannot be told without consuming it (an iterator) or the build writes a file (data and a table path)."""
    import json

    from .quant.table import CalibrationTable

    if calib is None:
        if isinstance(table, CalibrationTable):
            return "table " + hashlib.sha256(json.dumps(table.to_json(), sort_keys=True).encode()).hexdigest()
        return "table " + models.digest_files([table]) if table is not None else None
    if table is not None:
        return None
    h = hashlib.sha256(repr(preprocess).encode())
    if isinstance(calib, str) and calib.startswith("random:"):
        return "data " + calib
    if isinstance(calib, (str, os.PathLike)):
        path = Path(calib)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return "data " + models.digest_files(files) + " " + h.hexdigest()
    batches = [calib] if isinstance(calib, dict) else calib if isinstance(calib, (list, tuple)) else None
    if batches is None:
        return None
    for batch in batches:
        if not isinstance(batch, dict):
            return None
        _hash_arrays(h, batch)
    return "data " + h.hexdigest()


def lookup(store, key: str, progress: bool):
    """(library file, state) of the build stored under ``key``, or None. The library is loaded when the
    model first runs (a compile that only exports it never maps it); the entry's checksum vouches for it."""
    start = time.perf_counter()
    found = models.load(store, key)
    if found is None:
        return None
    state, library = found
    seconds = time.perf_counter() - start
    store.log_run("model", 1, 0)
    state["stats"] = {"cached build": seconds}
    if progress:
        print(f"[1/1] cached build {key[:12]} ({len(state['kernels'])} kernels, {store.root}) ... {seconds:.1f} s",
              file=sys.stderr, flush=True)
    return library, state


_HANDED = {}  # one digest handed to the next compile of the same unchanged file (see model_digest's ``hand_on``)


def _stamp(model):
    if not isinstance(model, (str, os.PathLike)) or str(model).startswith("zoo:"):
        return None
    st = os.stat(model)
    return os.path.abspath(model), st.st_size, st.st_mtime_ns, st.st_ino


def model_digest(store, model, hand_on: bool = False) -> str | None:
    """:func:`.cache.models.model_digest` of ``model``; None when the cache is off or the model cannot be read as
    given (the import then says what is wrong with it). ``hand_on``: the next call for the same unchanged file
    takes this digest instead of reading the file again (the CLI's recorded-build lookup, then its compile)."""
    if store is None:
        return None
    try:
        stamp = _stamp(model)
        digest = _HANDED.pop(stamp, None) if stamp else None
        digest = digest or models.model_digest(model)
        if hand_on and stamp:
            _HANDED.clear()
            _HANDED[stamp] = digest
        return digest
    except (OSError, TypeError, ValueError):
        return None


def whole_key(store, model, spec: targets.TargetSpec, logs, options: dict, digest: str | None = None) -> str | None:
    """The key of a whole build of ``model`` with ``options`` and the tuning logs' content; None when the cache
    is off or the model cannot be read as given (the import then says what is wrong with it)."""
    if store is None:
        return None
    try:
        return models.model_key(model, spec, dict(options, logs=logs_digest(logs, spec)), digest)
    except (OSError, TypeError, ValueError):
        return None


def log_files(logs, spec: targets.TargetSpec) -> list:
    """The tuning-log files :func:`logs_digest` reads for ``logs`` and ``spec``."""
    if logs is False or not spec.backend().applies_tuning_logs:
        return []
    from .tune.database import RECORDS, WORKLOADS

    return [s.path / name for s in _log_stores(logs, spec) for name in (WORKLOADS, RECORDS)]


def save(store, key: str, cm) -> None:
    """Store ``cm``'s whole build under ``key``: its library (linked now if not yet) and what it reports. A
    CUDA build that kept its kernels as source (no CUDA runtime to compile them with, said with a warning) is
    not stored: a compile where the runtime loads must make binaries, and the key does not tell the two apart."""
    if cm.build_info.get("cuda_code") == "source":
        return
    library = cm.library_file()
    state = {"source": cm.source, "inputs": [i.to_json() for i in cm.inputs],
             "outputs": [o.to_json() for o in cm.outputs], "pinned": cm.pinned, "layout": cm.layout,
             "precision": cm.precision, "build_info": cm.build_info, "tuning_logs": cm.tuning_logs,
             "kernels": cm.kernel_info["kernels"], "scheduled_by": cm.kernel_info["scheduled_by"],
             "stats": cm.stats, "quantization": cm.quantization}
    models.save(store, key, state, library)
    store.log_run("model", 0, 1)
    store.evict()  # the largest entry of a build, written after its kernels' evict


def remember(store, request: str | None, key: str, spec: targets.TargetSpec, logs) -> None:
    """Record that the compile request ``request`` (:func:`tvmfuse.cache.hits.request_key`) is answered by the
    whole build ``key``, for a compile that finds it without TVM."""
    from .cache import hits
    from .export import target_fields

    if not store.path(key).is_file():  # not stored (no room): nothing to answer with
        return
    backend = spec.backend()
    hits.remember(store, request, key, target_fields(spec), log_files(logs, spec), backend.build_warning(),
                  backend.toolchain())
