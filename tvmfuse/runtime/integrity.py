"""Integrity of exported libraries: the manifest seals the library it was written with, and itself.

A shared library damaged in copying (truncated, a flipped bit) crashes the process that maps it (SIGBUS,
SIGSEGV) or silently computes something else, and a manifest whose input shape was edited makes the Relax VM
fail deep inside with a traceback. So :func:`tvmfuse.export.export_library` writes, since manifest
``format_version`` 2::

    "library": {"size": 233080, "sha256": "<hex>"},   # of the .so file as written
    "digest": "sha256:<hex>"                           # see manifest_digest

and :func:`read_checked_manifest` (what :func:`tvmfuse.load` calls) checks both *before* anything native is
loaded. ``digest`` is the SHA-256 of the canonical JSON (sorted keys, no spaces, ASCII) of the manifest
without its ``digest`` field; since that JSON includes the library's sha256, editing either file is
detected. This guards against accidents (a damaged copy, a hand edit, a library replaced without its
manifest), not against an attacker: anyone who can write the files can recompute the digest.

Manifests of ``format_version`` 1 (tvmfuse before the checks) have neither field. They are still loaded, with
a warning that nothing was checked: refusing them would break every library exported before, and their
structure is still validated. A version-2 manifest that lacks the fields is refused (they were removed).

Nothing here imports TVM: the checks run in a runtime-only process too (``TVM_USE_RUNTIME_LIB=1``).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError

MANIFEST_FORMAT = "tvmfuse-manifest"
MANIFEST_VERSION = 2  # 2: "library" (size, sha256) and "digest"; 1: neither (loaded unchecked, with a warning)
SEALED_SINCE = 2
_CHUNK = 1 << 20  # hashing reads 1 MiB at a time: a 50 MB library hashes in well under a second
_MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KiB; anything this large is not one


def file_sha256(path: str | os.PathLike) -> tuple[int, str]:
    """``(size in bytes, sha256 hex)`` of a file, read in chunks (never the whole file in memory)."""
    digest = hashlib.sha256()
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


def canonical_json(obj) -> bytes:
    """The JSON text the digest is computed over: sorted keys, no whitespace, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def manifest_digest(manifest: dict) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of ``manifest`` without its ``digest`` field."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def seal_manifest(manifest: dict, library: str | os.PathLike) -> dict:
    """A copy of ``manifest`` with the ``library`` entry (size, sha256 of the file) and the ``digest``.

    The copy is what JSON reads back (tuples become lists, keys strings), so the digest the loader
    recomputes from the file is the one computed here.
    """
    size, sha = file_sha256(library)
    sealed = json.loads(json.dumps(manifest))
    sealed.pop("digest", None)
    sealed["format_version"] = MANIFEST_VERSION
    sealed["library"] = {"size": size, "sha256": sha}
    sealed["digest"] = manifest_digest(sealed)
    return sealed


def _regular_file(path: Path, what: str) -> os.stat_result:
    """``os.stat`` of ``path``; ModelLoadError when it is missing or not a regular file (directory, FIFO...)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ModelLoadError(f"{what} not found: {path}") from None
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ModelLoadError(f"{path}: {what} is {kind}, not a file written by export")
    return st


def _short(value, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: a damaged file can hold a huge value."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _not_manifest(mpath: Path, why: str) -> ModelLoadError:
    return ModelLoadError(f"{mpath}: not a tvmfuse manifest ({why})")


def _check_tensors(mpath: Path, manifest: dict, key: str) -> None:
    entries = manifest.get(key)
    if not isinstance(entries, list):
        raise _not_manifest(mpath, f"{key!r} must be a list")
    for i, d in enumerate(entries):
        where = f"{key}[{i}]"
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            raise _not_manifest(mpath, f"{where} must be an object with a string 'name'")
        shape, dtype = d.get("shape"), d.get("dtype")
        lowest = 1 if key == "inputs" else -1  # -1: an output dim only known at run time
        if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= lowest
                                                  for x in shape):
            raise _not_manifest(mpath, f"{where} ({_short(d['name'])}): 'shape' must be a list of ints >= {lowest}, "
                                       f"got {_short(shape)}")
        try:
            if not isinstance(dtype, str):
                raise TypeError
            np.dtype(dtype)
        except TypeError:
            raise _not_manifest(mpath, f"{where} ({_short(d['name'])}): 'dtype' {_short(dtype)} is not a numpy "
                                       "dtype") from None


def _check_structure(mpath: Path, manifest: dict) -> None:
    """What LoadedModel reads must have the types it expects (a damaged v1 manifest has no digest to catch it)."""
    _check_tensors(mpath, manifest, "inputs")
    _check_tensors(mpath, manifest, "outputs")
    for key, kind, name in (("target", dict, "an object"), ("cpu_flags", list, "a list"),
                            ("device", str, "a string")):
        if key in manifest and not isinstance(manifest[key], kind):
            raise _not_manifest(mpath, f"{key!r} must be {name}, got {type(manifest[key]).__name__}")
    if not all(isinstance(f, str) for f in manifest.get("cpu_flags", [])):
        raise _not_manifest(mpath, "'cpu_flags' must be a list of strings")
    if not isinstance(manifest.get("target", {}).get("config", {}), dict):
        raise _not_manifest(mpath, "'target.config' must be an object")


def _check_seal(path: Path, mpath: Path, manifest: dict, st: os.stat_result) -> None:
    digest, library = manifest.get("digest"), manifest.get("library")
    if not isinstance(digest, str) or not isinstance(library, dict):
        raise ModelLoadError(f"{mpath}: edited after export: its 'digest' or 'library' entry is missing "
                             f"(format_version {manifest['format_version']} manifests have both); re-export the model")
    if manifest_digest(manifest) != digest:
        raise ModelLoadError(f"{mpath}: edited after export: its content does not match the digest export wrote "
                             "(re-export the model, or restore the manifest)")
    size, sha = library.get("size"), library.get("sha256")
    if st.st_size != size:
        raise ModelLoadError(f"{path}: size does not match its manifest ({st.st_size} bytes, {size} expected: "
                             "truncated, damaged or replaced after export)")
    if file_sha256(path)[1] != sha:
        raise ModelLoadError(f"{path}: sha256 does not match its manifest (damaged or replaced after export)")


def read_checked_manifest(path: str | os.PathLike, manifest_file: str | os.PathLike) -> dict:
    """The manifest of the library ``path``, checked against it; raise ModelLoadError (one line) otherwise.

    Checks, in order, all before the library is mapped: the library is a regular file; the manifest is a
    regular file of at most 16 MiB, UTF-8 JSON, an object with ``format`` ``"tvmfuse-manifest"`` and an
    integer ``format_version`` not newer than this tvmfuse's; for version >= 2 the ``digest`` matches the
    manifest's content, then the library's size, then its sha256 match the ``library`` entry (for version
    1: a warning, nothing to compare); the inputs, outputs, target, cpu_flags and device have the types the
    loader reads.
    """
    path, mpath = Path(path), Path(manifest_file)
    st = _regular_file(path, "compiled model")
    if not mpath.exists() and not mpath.is_symlink():
        raise ModelLoadError(f"{path}: manifest {mpath.name} is missing beside it (written by export)")
    mst = _regular_file(mpath, "manifest")
    if mst.st_size > _MAX_MANIFEST_BYTES:
        raise _not_manifest(mpath, f"{mst.st_size} bytes, too large for a manifest")
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ModelLoadError(f"{mpath}: cannot read manifest ({e.strerror})") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _not_manifest(mpath, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None
    if not isinstance(manifest, dict):
        raise _not_manifest(mpath, f"a JSON object is expected, got {type(manifest).__name__}")
    if manifest.get("format") != MANIFEST_FORMAT:
        raise _not_manifest(mpath, f"format is {_short(manifest.get('format'))}, expected {MANIFEST_FORMAT!r}")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _not_manifest(mpath, f"format_version {_short(version)} is not a version number")
    if version > MANIFEST_VERSION:
        raise ModelLoadError(f"{mpath}: manifest format_version {version} was written by a newer tvmfuse (this one "
                             f"reads up to {MANIFEST_VERSION}); upgrade tvmfuse or re-export with this one")
    if version >= SEALED_SINCE:
        _check_seal(path, mpath, manifest, st)
    else:
        warnings.warn(f"{mpath}: manifest format_version {version} records no checksum, so {path.name} is loaded "
                      "unchecked; re-export the model to add one", stacklevel=4)
    _check_structure(mpath, manifest)
    return manifest
