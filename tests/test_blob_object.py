"""The object holding a library's packed modules (``tvmfuse/blob_object.py``): written directly, it defines the
same symbol with the same bytes, binding, type, size and section flags as TVM's LLVM-emitted one, and the
linker and TVM's loader take it (``tests/test_link.py`` runs a library linked with it)."""

import struct

import pytest

from tvmfuse import blob_object, link

pytestmark = pytest.mark.skipif(not blob_object.supported(), reason="writes ELF x86-64 objects: not this host")


def _elf(path) -> dict:
    """An ELF64 relocatable object read back: its sections' (type, flags, bytes) by name, its symbols'
    (bind, type, section name, value, size) by name, and the ELF header's type and machine."""
    data = open(path, "rb").read()
    assert data[:6] == b"\x7fELF\x02\x01"
    e_type, machine = struct.unpack_from("<HH", data, 16)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def body(h):
        return data[h[4]:h[4] + h[5]] if h[1] != 8 else b""  # SHT_NOBITS has no bytes

    def name(table: bytes, at: int) -> str:
        return table[at:table.index(b"\0", at)].decode()

    shstr = body(headers[shstrndx])
    sections = {name(shstr, h[0]): (h[1], h[2], body(h)) for h in headers}
    symbols = {}
    for h in headers:
        if h[1] == 2:  # SHT_SYMTAB
            strtab = body(headers[h[6]])
            raw = body(h)
            for at in range(0, len(raw), 24):
                st_name, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", raw, at)
                if st_name and info & 0xF != 4:  # STT_FILE: the source's name, which ours leaves out
                    where = name(shstr, headers[shndx][0]) if 0 < shndx < len(headers) else shndx
                    symbols[name(strtab, st_name)] = (info >> 4, info & 0xF, where, value, size)
    return {"header": (e_type, machine), "sections": sections, "symbols": symbols}


def test_the_object_is_the_one_llvm_emits(tiny_compiled, tmp_path):
    import json

    from tvm.runtime import _ffi_api

    module = tiny_compiled.executable.mod
    ours = blob_object.pack_imports(module, False, "", str(tmp_path))
    theirs = str(tmp_path / "llvm.o")
    triple = json.dumps({"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu"})
    _ffi_api.ModulePackImportsToLLVM(module, False, triple, "").write_to_file(theirs)
    a, b = _elf(ours), _elf(theirs)
    assert a["header"] == b["header"] == (1, 62)  # relocatable, x86-64
    symbol = _ffi_api.ModuleImportsBlobName()
    assert a["symbols"] == b["symbols"]
    assert a["symbols"][symbol][:3] == (1, 1, ".rodata")  # global object in .rodata
    blob = a["sections"][".rodata"][2]
    assert blob == b["sections"][".rodata"][2] and len(blob) == a["symbols"][symbol][4] > 1000
    for section in (".rodata", ".note.GNU-stack"):  # read-only data; a stack that is not executable
        assert a["sections"][section][:2] == b["sections"][section][:2]


def test_any_buffer_is_written_as_is(tmp_path):
    import numpy as np

    data = np.arange(1001, dtype=np.uint8)
    blob_object.write(str(tmp_path / "b.o"), "some_symbol", data)
    got = _elf(tmp_path / "b.o")
    assert got["sections"][".rodata"][2] == data.tobytes()
    assert got["symbols"] == {"some_symbol": (1, 1, ".rodata", 0, 1001)}


def test_a_system_library_is_packed_by_tvm(tiny_compiled, tmp_path, monkeypatch):
    def refuse(*args):
        raise AssertionError("a system library's blob is TVM's to pack")

    monkeypatch.setattr(blob_object, "write", refuse)
    path = blob_object.pack_imports(tiny_compiled.executable.mod, True, "m_", str(tmp_path))
    assert path.endswith("m_devc.o") and _elf(path)["header"] == (1, 62)


def test_export_uses_it_only_where_supported(tiny_compiled, tmp_path, monkeypatch):
    seen = []
    real = type(tiny_compiled.executable.mod).export_library

    def spy(self, path, **kwargs):
        seen.append(kwargs.get("fpack_imports"))
        return real(self, path, **kwargs)

    monkeypatch.setattr(type(tiny_compiled.executable.mod), "export_library", spy)
    link.export_library(tiny_compiled.executable, str(tmp_path / "a.so"))
    monkeypatch.setattr(blob_object, "supported", lambda: False)
    link.export_library(tiny_compiled.executable, str(tmp_path / "b.so"))
    assert [getattr(hook, "func", hook) for hook in seen] == [blob_object.pack_imports, None]
    assert (tmp_path / "a.so").stat().st_size > 0 and (tmp_path / "b.so").stat().st_size > 0
