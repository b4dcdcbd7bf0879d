"""The object file holding a library's packed modules, written directly instead of through LLVM.

TVM's export serializes the modules a library imports (a Relax VM executable: its bytecode and every weight)
into one blob and makes an object file defining it as a global symbol, by building an LLVM module with the
blob as a constant array and emitting it. For a model with large weights that costs more than the blob itself:
ResNet-50's 128 MB took 0.62 s to pack through LLVM and 0.15-0.32 s to write, where serializing it takes 0.47
and writing its bytes once 0.1 (Zen 4, 2 cores). The object needed is trivial, one read-only section and one
symbol, so on x86-64 Linux it is written here as an ELF file whose bytes are the same section, symbol and
flags LLVM's has; elsewhere TVM's packing is used.
"""

from __future__ import annotations

import os
import platform
import struct
import sys

# ELF constants (System V ABI, x86-64 supplement)
_ET_REL, _EM_X86_64 = 1, 62
_SHT_PROGBITS, _SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3
_SHF_ALLOC = 0x2
_STB_GLOBAL, _STT_OBJECT = 1, 1
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_SECTIONS = ("", ".rodata", ".note.GNU-stack", ".symtab", ".strtab", ".shstrtab")


def supported() -> bool:
    """Whether this host links ELF x86-64 objects (what :func:`write` makes)."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def _names(names) -> tuple[bytes, dict[str, int]]:
    table, offsets = b"\0", {"": 0}
    for name in names:
        if name:
            offsets[name] = len(table)
            table += name.encode() + b"\0"
    return table, offsets


def _pad(offset: int, align: int) -> int:
    return -offset % align


def write(path: str, symbol: str, blob) -> None:
    """Write a relocatable ELF x86-64 object to ``path`` defining ``symbol``, a global read-only object whose
    bytes are ``blob`` (any buffer: written without a copy)."""
    view = memoryview(blob).cast("B")
    size = view.nbytes
    shstrtab, shnames = _names(_SECTIONS)
    strtab, symnames = _names([symbol])
    symtab = _SYM.pack(0, 0, 0, 0, 0, 0) + _SYM.pack(symnames[symbol], (_STB_GLOBAL << 4) | _STT_OBJECT, 0,
                                                       _SECTIONS.index(".rodata"), 0, size)
    # layout: header, .rodata, .symtab (8-aligned), .strtab, .shstrtab, section headers (8-aligned)
    rodata_at = _EHDR.size
    symtab_at = rodata_at + size + _pad(rodata_at + size, 8)
    strtab_at = symtab_at + len(symtab)
    shstrtab_at = strtab_at + len(strtab)
    headers_at = shstrtab_at + len(shstrtab) + _pad(shstrtab_at + len(shstrtab), 8)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little endian, version 1, System V
    header = _EHDR.pack(ident, _ET_REL, _EM_X86_64, 1, 0, 0, headers_at, 0, _EHDR.size, 0, 0, _SHDR.size,
                        len(_SECTIONS), _SECTIONS.index(".shstrtab"))
    sections = [
        _SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        _SHDR.pack(shnames[".rodata"], _SHT_PROGBITS, _SHF_ALLOC, 0, rodata_at, size, 0, 0, 1, 0),
        _SHDR.pack(shnames[".note.GNU-stack"], _SHT_PROGBITS, 0, 0, symtab_at, 0, 0, 0, 1, 0),
        # link: the string table of the names; info: the index of the first global symbol
        _SHDR.pack(shnames[".symtab"], _SHT_SYMTAB, 0, 0, symtab_at, len(symtab), _SECTIONS.index(".strtab"),
                   1, 8, _SYM.size),
        _SHDR.pack(shnames[".strtab"], _SHT_STRTAB, 0, 0, strtab_at, len(strtab), 0, 0, 1, 0),
        _SHDR.pack(shnames[".shstrtab"], _SHT_STRTAB, 0, 0, shstrtab_at, len(shstrtab), 0, 0, 1, 0),
    ]
    with open(path, "wb") as f:
        f.write(header)
        f.write(view)
        f.write(bytes(_pad(rodata_at + size, 8)))
        f.write(symtab + strtab + shstrtab + bytes(headers_at - shstrtab_at - len(shstrtab)))
        f.write(b"".join(sections))
    assert os.path.getsize(path) == headers_at + len(sections) * _SHDR.size


def packed(module):
    """``module``'s imports serialized into one blob (a uint8 numpy array over TVM's tensor), what
    :func:`pack_imports` writes; None for a module that imports nothing (TVM's export packs nothing then)."""
    import numpy as np
    from tvm.runtime import _ffi_api

    return np.from_dlpack(_ffi_api.ModulePackImportsToTensor(module)) if module.imports else None


def pack_imports(module, is_system_lib: bool, prefix: str, workspace_dir: str, blob=None) -> str:
    """TVM's ``fpack_imports`` hook: the object defining ``module``'s packed imports (``blob``: their
    :func:`packed` form, when made before), written by :func:`write` (the caller passes it only where
    :func:`supported`); a system library's, whose symbol TVM names and registers differently, is packed by TVM."""
    import json

    from tvm.runtime import _ffi_api

    path = os.path.join(workspace_dir, f"{prefix}devc.o")
    if is_system_lib or prefix:
        triple = json.dumps({"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu"})
        _ffi_api.ModulePackImportsToLLVM(module, is_system_lib, triple, prefix).write_to_file(path)
        return path
    write(path, _ffi_api.ModuleImportsBlobName(), packed(module) if blob is None else blob)
    return path
