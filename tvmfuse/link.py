"""Linking an executable into a shared library: TVM's export with the system compiler, made cheaper.

TVM's ``export_library`` writes each module to an object and links them with ``g++ -shared``. Three costs of
that link are avoidable: GNU ld copied ResNet-50's 128 MB library in 0.40-0.56 s where gold took 0.27-0.29
(same objects, Zen 4, 2 cores), and the host module of a Relax VM with no host functions is an empty C file
that ``g++`` compiles anyway. gold is used where it is installed; a link it fails is done again with the
compiler's default linker, which the process then keeps to. gold names the library's base version after the
output path (a temporary folder's), so each link would differ; a fixed soname makes it name that instead, and
the same objects link to the same bytes (the kernel cache's byte-identical libraries). A library loaded by its
path, as TVM loads one, is never taken for another with the same soname. The library carries no GNU build ID:
the compiler has the linker hash the whole output for one, 0.17 s of ResNet-50's 0.27 s link (its 128 MB of
weights; SHA-1, gold, Zen 4), and nothing reads it (no separate debug files are made). The object holding the
executable (its weights included) is written by :mod:`tvmfuse.blob_object`, not emitted through LLVM.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile

from . import blob_object, scratch

_GOLD = {"works": shutil.which("ld.gold") is not None}
LINK_OPTIONS = ["-Wl,--build-id=none"]  # GNU ld and gold both take it
GOLD_OPTIONS = ["-fuse-ld=gold", "-Wl,-soname,tvmfuse_model.so"] + LINK_OPTIONS


def export_library(module, path: str) -> None:
    """``module.export_library(path)`` (a ``tvm.relax.VMExecutable`` or runtime module) with :func:`create_shared`,
    its temporary objects in :func:`tvmfuse.scratch.folder`."""
    in_workspace(module, lambda folder, pack: export_in(module, path, folder, pack))


def in_workspace(module, link_in):
    """``link_in(folder, pack)``'s result: ``folder`` a temporary folder for the objects of ``module``'s link
    (:func:`export_in`), RAM-backed where it holds them and the library (:mod:`tvmfuse.scratch`), ``pack`` the
    ``fpack_imports`` hook (the executable's packed imports, serialized first: their size decides the folder;
    None where TVM packs them). A link that fails in the RAM folder (filled by another process since it was
    chosen) is done again in the default one, which reports its own failure."""
    pack, size = None, 0
    if blob_object.supported():
        blob = blob_object.packed(getattr(module, "mod", module))
        pack = functools.partial(blob_object.pack_imports, blob=blob)
        size = 0 if blob is None else 2 * blob.nbytes  # the object, then the library that holds it
    for folder in scratch.folders(size):
        try:
            with tempfile.TemporaryDirectory(prefix="tvmfuse-link-", dir=folder) as work:
                return link_in(work, pack)
        except (OSError, RuntimeError):  # RuntimeError: the linker's, from TVM
            if folder is None:
                raise


def export_in(module, path: str, folder: str, pack) -> None:
    """``module`` linked to ``path``, its objects written in ``folder`` (see :func:`in_workspace`)."""
    from tvm.support import cc

    # what TVM's export reads from an fcompile: the library suffix, and the target triple (without which it packs
    # the imported modules as C source instead of an LLVM object)
    create_shared.output_format = cc.create_shared.output_format
    create_shared.get_target_triple = cc.create_shared.get_target_triple
    module.export_library(path, fcompile=create_shared, fpack_imports=pack, workspace_dir=folder)


def create_shared(output: str, objects, options=None, **kwargs) -> None:
    """``tvm.support.cc.create_shared`` of ``objects`` without empty source files, with gold where it links."""
    from tvm.support import cc

    objects = [objects] if isinstance(objects, str) else list(objects)
    objects = [o for o in objects if not (o.endswith((".c", ".cc")) and _blank(o))]
    if _GOLD["works"]:
        try:
            return cc.create_shared(output, objects, list(options or []) + GOLD_OPTIONS, **kwargs)
        except RuntimeError:  # the default linker's error is the one to report, if it fails too
            _GOLD["works"] = False
    return cc.create_shared(output, objects, list(options or []) + LINK_OPTIONS, **kwargs)


def _blank(path: str) -> bool:
    with open(path, "rb") as f:
        return not f.read(4096).strip() and os.path.getsize(path) <= 4096
