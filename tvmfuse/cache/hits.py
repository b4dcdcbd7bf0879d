"""A compile the cache already holds, answered without importing TVM: ``tvmfuse compile`` of a model built before.

``import tvm`` took 0.8 s of the 1.0 s a ``tvmfuse compile`` of a cached MobileNetV2 took (Zen 4): the whole
build's key (:func:`.models.model_key`) asks TVM for the target's CPU name, its canonical string and LLVM's
version, and the export's manifest asks the backend which device runs the library. So each compile that builds
or finds a whole build also records, under a **request key** made only of what decides those (the arguments as
given, the model's content, the installed tvmfuse, TVM and tvm-ffi, this machine's CPU and cores, the variables
that pick the CPU and the tuning logs), the whole build's key, the tuning-log files it digested with their
digest, the target's part of the manifest and the backend's toolchain (nvcc's version, for CUDA). The next
compile of the same request looks that record up first: where the logs still digest the same and the store still
holds the build, the library is exported from it with no TVM in the process; anything else (no record, changed
logs, a damaged entry) takes the normal path, which records again. A record holds no code: a wrong one can only
send a compile the normal way or name a build that the whole key's own checksum vouches for.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

from .. import cuda_driver
from . import fingerprint, models
from .store import Store

FORMAT = "request-1"
# The variables the whole key depends on: the CPU x86-host builds for (targets.HOST_CPU_ENV), the logs folder
# (tune.database.ENV). Others, such as the thread settings tvmfuse sets itself before TVM starts, do not.
KEY_ENV = ("TVMFUSE_HOST_CPU", "TVMFUSE_TUNING_LOGS")


def _installed(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _cpu() -> str:
    """The first CPU's identity lines of /proc/cpuinfo (what LLVM's host detection reads through CPUID)."""
    try:
        text = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return "-"
    keep = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags")
    return "\n".join(line for line in text.splitlines() if line.split(":")[0].strip() in keep)


def request_key(model_digest: str, target, options: dict) -> str | None:
    """The key of a compile request: ``target`` as given (a name or a dict; None for a TargetSpec, which has
    no stable form), ``options`` the compile's other arguments (JSON-able, the logs folder made absolute)."""
    from ..targets import TargetSpec, _cores
    from ..version import __version__

    if isinstance(target, TargetSpec) or not isinstance(target, (str, dict)):
        return None
    env = {k: os.environ.get(k) for k in KEY_ENV}
    return hashlib.sha256(json.dumps({
        "format": FORMAT, "model": model_digest, "target": target, "options": options,
        "tvmfuse": [__version__, fingerprint.source_digest(), str(Path(__file__).resolve().parents[1])],
        "tvm": _installed("apache-tvm"), "tvm_ffi": _installed("apache-tvm-ffi"), "cpu": _cpu(), "cores": _cores(),
        "env": env}, sort_keys=True, default=str).encode()).hexdigest()


def request_options(shapes, consts_digest, layout, precision, cuda_graph, logs) -> dict:
    """The compile arguments a request key takes, in one form whether they came from the CLI or the API."""
    if logs is not None and logs is not False:
        logs = os.path.abspath(os.fspath(logs))
    shapes = {str(k): [int(d) for d in v] for k, v in (shapes or {}).items()}
    return {"shapes": shapes, "consts": consts_digest, "layout": layout, "precision": precision,
            "cuda_graph": bool(cuda_graph), "logs": logs}


def quantize_options(options: dict, source: str, method: str, percentile: float, weight_bits) -> dict:
    """:func:`request_options` of a quantize request (``precision`` ``"int8"``), with its calibration source
    (``cached_build.quantize_digest``), method, percentile and weight width as asked (None: the target's)."""
    return dict(options, calibration=source, method=method, percentile=float(percentile), weight_bits=weight_bits)


def remember(store: Store, request: str | None, whole: str, target_fields: dict, log_files, warning: str | None,
             toolchain: str = ""):
    """Record that ``request`` is answered by the whole build ``whole`` (``log_files``: the tuning-log files
    its key digested; ``target_fields``: the target's part of its manifest; ``warning``: what the target said
    at compile time, said again on a hit; ``toolchain``: the backend's, which its key took: nvcc's, the only
    one a backend names, checked again on every answer)."""
    if request is None:
        return
    files = [str(f) for f in log_files]
    record = json.dumps({"format": FORMAT, "whole": whole, "log_files": files, "logs": models.digest_files(files),
                         "target_fields": target_fields, "warning": warning, "toolchain": toolchain},
                        sort_keys=True).encode()
    if store.get(request) != record:  # every cached compile remembers: write only what changed
        store.put(request, record)


def answer(store: Store, request: str | None):
    """(record, state, library) for ``request`` when its record and its whole build are in ``store`` and the
    tuning logs are unchanged; None otherwise."""
    if request is None:
        return None
    raw = store.get(request)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    if models.digest_files(record["log_files"]) != record["logs"]:
        return None
    if record.get("toolchain") and record["toolchain"] != cuda_driver.toolchain():  # another nvcc: other code
        return None
    found = models.load(store, record["whole"])
    if found is None:
        return None
    state, library = found
    store.log_run("model", 1, 0)
    return record, state, library


def export_answer(store: Store, request: str | None, output):
    """Export the build answering ``request`` to ``output`` (a ``.so`` path) without TVM: (path, record,
    state), or None when the request is not answered (nothing written)."""
    import warnings

    from ..export import build_fields, export_library, manifest_of

    got = answer(store, request)
    if got is None:
        return None
    record, state, library = got
    extra = build_fields({"kernels": state["kernels"], "scheduled_by": state["scheduled_by"]}, state["layout"],
                         state["precision"], state["tuning_logs"], state["build_info"], state["quantization"],
                         state["pinned"])
    if record["warning"]:
        from ..targets import ForeignTargetWarning

        warnings.warn(record["warning"], ForeignTargetWarning, stacklevel=2)
    manifest = manifest_of(record["target_fields"], state["inputs"], state["outputs"], state["source"], extra)
    return export_library(library, output, manifest), record, state
