"""Whole builds in the store: the same model compiled the same way again skips import, passes and build.

The key is the model's content (its serialized ONNX, external data included, after loading), every option
that changes the build (target with its CPU, shapes, pinned inputs, layout, precision, CUDA graph capture,
the tuning logs' content, a calibration table's content), and the versions of the code (:mod:`.fingerprint`).
The entry is the linked library and what a :class:`tvmfuse.api.CompiledModel` says about it (inputs,
outputs, kernels and who scheduled them, tuning-log use); the Relax modules are not stored, a model from
the store rebuilds them when asked (kernels from the kernel cache).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

from . import fingerprint
from .store import Store

FORMAT = "model-build-1"
STATE = ("source", "inputs", "outputs", "pinned", "layout", "precision", "build_info", "tuning_logs", "kernels",
         "scheduled_by", "stats", "quantization")


def digest_files(paths) -> str:
    """sha256 over the names and contents of the files that exist among ``paths``."""
    h = hashlib.sha256()
    for path in paths:
        path = Path(path)
        h.update(str(path).encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"<missing>")
    return h.hexdigest()


def model_key(proto, spec, options: dict) -> str:
    """The key of a build of ``proto`` (a loaded ModelProto) for ``spec`` with ``options`` (JSON-able)."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": FORMAT, "versions": fingerprint.versions(), "target": spec.to_json(),
                         "tvm_target": str(spec.tvm_target()), "options": options},
                        sort_keys=True, default=str).encode())
    h.update(proto.SerializeToString(deterministic=True))
    return h.hexdigest()


def save(store: Store, key: str, state: dict, library: bytes) -> None:
    head = json.dumps({k: state[k] for k in STATE}, default=str).encode()
    store.put(key, struct.pack("<Q", len(head)) + head + library)


def load(store: Store, key: str) -> tuple[dict, bytes] | None:
    """(state, library bytes) stored under ``key``, or None."""
    payload = store.get(key)
    if payload is None or len(payload) < 8:
        return None
    (n,) = struct.unpack("<Q", payload[:8])
    try:
        state = json.loads(payload[8:8 + n])
    except ValueError:
        return None
    if not isinstance(state, dict) or set(state) != set(STATE):
        return None
    return state, payload[8 + n:]
