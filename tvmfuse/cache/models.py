"""Whole builds in the store: the same model compiled the same way again skips import, passes and build.

The key is the model's content (its serialized ONNX, external data included, after loading), every option that
changes the build (target with its CPU, shapes, pinned inputs, layout, precision, CUDA graph capture, the tuning
logs' content, a calibration table's content), the versions of the code (:mod:`.fingerprint`) and the backend's
toolchain (CUDA: nvcc's version and settings). The entry is the linked library (CUDA's with its device code
packed in) and what a :class:`tvmfuse.api.CompiledModel` says about it (inputs, outputs, kernels and who
scheduled them, tuning-log use); the Relax modules are not stored, a model from the store rebuilds them when
asked (kernels from the kernel cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
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


def model_digest(model) -> str:
    """What identifies a model's content without loading it: a file's bytes and those of the files its tensors
    keep their data in, a built-in model's name (its graph is tvmfuse's code, which the versions cover), a
    ModelProto's serialization."""
    onnx = sys.modules.get("onnx")  # not imported: not a ModelProto (its import is 0.5 s of a cached compile)
    if onnx is not None and isinstance(model, onnx.ModelProto):
        return "proto " + hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    if isinstance(model, str) and model.startswith("zoo:"):
        return model
    path = Path(model)
    data = path.read_bytes()
    files = []
    if b"location" in data:  # external data names its file under the key "location"; else none is read
        import onnx
        from onnx.external_data_helper import _get_all_tensors, uses_external_data

        proto = onnx.load_model_from_string(data)
        for tensor in _get_all_tensors(proto):
            if uses_external_data(tensor):
                files += [path.parent / e.value for e in tensor.external_data if e.key == "location"]
    return "file " + hashlib.sha256(data).hexdigest() + " " + digest_files(sorted(set(files)))


def model_key(model, spec, options: dict, digest: str | None = None) -> str:
    """The key of a build of ``model`` (path, ``zoo:NAME`` or ModelProto; ``digest``: its
    :func:`model_digest`, when known) for ``spec`` with ``options`` (JSON-able); a file that cannot be read
    raises OSError (the caller lets the import say so)."""
    material = {"format": FORMAT, "versions": fingerprint.versions(), "target": spec.to_json(),
                "tvm_target": str(spec.tvm_target()), "options": options, "model": digest or model_digest(model)}
    toolchain = spec.backend().toolchain()
    if toolchain:  # nvcc's version for CUDA (CPU targets' keys stay as they were)
        material["toolchain"] = toolchain
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def save(store: Store, key: str, state: dict, library) -> None:
    """Store ``state`` (:data:`STATE`) and ``library`` (a :class:`tvmfuse.library_file.LibraryFile`)."""
    head = json.dumps({k: state[k] for k in STATE}, default=str).encode()
    store.put(key, struct.pack("<Q", len(head)) + head, library)


def load(store: Store, key: str):
    """(state, library: a :class:`tvmfuse.library_file.LibraryFile`) stored under ``key``, or None."""
    from ..library_file import LibraryFile

    found = store.open(key)
    if found is None:
        return None
    fd, offset, size = found
    try:
        (n,) = struct.unpack("<Q", os.pread(fd, 8, offset).ljust(8, b"\xff"))
        if n > size - 8:
            return None
        state = json.loads(os.pread(fd, n, offset + 8))
        if not isinstance(state, dict) or set(state) != set(STATE):
            return None
        return state, LibraryFile.part_of(fd, offset + 8 + n, size - 8 - n)
    except ValueError:
        return None
    finally:
        os.close(fd)
