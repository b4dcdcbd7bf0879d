"""Where a link writes its temporary files (``tvmfuse/scratch.py``): a RAM-backed folder only when it has room
and the memory to spare, the user's ``TMPDIR`` kept; cgroup limits read from v1 and v2 files."""

import os

import pytest

from tvmfuse import link, scratch
from tvmfuse.library_file import LibraryFile

GIB = 1 << 30


@pytest.fixture
def ram(tmp_path, monkeypatch):
    """A stand-in RAM folder with 8 GiB of memory available and no TMPDIR."""
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(scratch, "RAM_FOLDER", str(folder))
    monkeypatch.setattr(scratch, "available_memory", lambda: 8 * GIB)
    monkeypatch.delenv("TMPDIR", raising=False)
    return folder


def test_the_ram_folder_is_taken_when_it_suits(ram):
    assert scratch.folder(100 << 20) == str(ram)


def test_not_taken_when_too_large_for_the_memory_or_the_folder(ram, monkeypatch):
    assert scratch.folder(2 * GIB) == str(ram)
    assert scratch.folder(2 * GIB + 1) is None  # more than a quarter of the memory available
    free = os.statvfs(ram).f_bavail * os.statvfs(ram).f_frsize
    monkeypatch.setattr(scratch, "available_memory", lambda: 8 * free)
    assert scratch.folder(free) is None  # no room left for the margin


def test_not_taken_under_tmpdir_or_without_the_folder_or_meminfo(ram, monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert scratch.folder(1) is None
    monkeypatch.delenv("TMPDIR")
    monkeypatch.setattr(scratch, "available_memory", lambda: None)
    assert scratch.folder(1) is None
    monkeypatch.setattr(scratch, "available_memory", lambda: 8 * GIB)
    monkeypatch.setattr(scratch, "RAM_FOLDER", str(tmp_path / "missing"))
    assert scratch.folder(1) is None


def _cgroups(tmp_path, table: str, files: dict):
    (tmp_path / "cgroup").write_text(table)
    for name, text in files.items():
        path = tmp_path / "fs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "fs"), str(tmp_path / "cgroup")


@pytest.mark.parametrize("table,files,room", [
    ("0::/user/a\n", {"user/a/memory.max": "1000\n", "user/a/memory.current": "400\n"}, 600),
    ("0::/user/a\n", {"user/a/memory.max": "max\n", "user/a/memory.current": "400\n"}, None),
    ("0::/\n", {"memory.max": "1000\n", "memory.current": "1200\n"}, 0),  # over the limit: no room
    ("4:memory:/job/7\n0::/\n", {"memory/job/7/memory.limit_in_bytes": "5000\n",
                                 "memory/job/7/memory.usage_in_bytes": "1000\n"}, 4000),
    ("4:memory:/job/7\n", {"memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
                           "memory/memory.usage_in_bytes": "1000\n"}, None),
    ("4:memory:/job/7\n", {"memory/memory.limit_in_bytes": "3000\n",  # a container: its group at the root
                           "memory/memory.usage_in_bytes": "1000\n"}, 2000),
    ("1:cpu:/\n", {}, None),
])
def test_cgroup_room(tmp_path, table, files, room):
    assert scratch._cgroup_room(*_cgroups(tmp_path, table, files)) == room


def test_available_memory_is_at_most_meminfo():
    available = scratch.available_memory()
    assert available is not None and 0 < available <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _seen_folders(monkeypatch):
    seen = []
    real = link.export_in

    def spy(module, path, folder, pack):
        seen.append((folder, path))
        return real(module, path, folder, pack)

    monkeypatch.setattr(link, "export_in", spy)
    return seen


def test_a_link_writes_in_the_ram_folder_and_leaves_nothing_there(ram, tiny_compiled, monkeypatch, tmp_path):
    seen = _seen_folders(monkeypatch)
    library = LibraryFile.link(tiny_compiled.executable)
    link.export_library(tiny_compiled.executable, str(tmp_path / "m.so"))
    assert [os.path.dirname(folder) for folder, _ in seen] == [str(ram)] * 2
    assert seen[0][1].startswith(seen[0][0]) and seen[1][1] == str(tmp_path / "m.so")
    assert list(ram.iterdir()) == []  # its objects and library removed; the library held open
    assert library.read_bytes() == (tmp_path / "m.so").read_bytes()


def test_a_link_without_room_writes_in_the_default_folder(ram, tiny_compiled, monkeypatch, tmp_path):
    import tempfile

    default = tmp_path / "tmp"
    default.mkdir()
    monkeypatch.setattr(scratch, "available_memory", lambda: 1)
    monkeypatch.setattr(tempfile, "tempdir", str(default))
    seen = _seen_folders(monkeypatch)
    on_disk = LibraryFile.link(tiny_compiled.executable)
    assert [os.path.dirname(folder) for folder, _ in seen] == [str(default)]
    monkeypatch.setattr(scratch, "available_memory", lambda: 8 * GIB)
    assert LibraryFile.link(tiny_compiled.executable).read_bytes() == on_disk.read_bytes()


def test_a_run_loads_its_copy_from_the_ram_folder(ram, tiny_compiled, monkeypatch):
    import shutil

    import numpy as np
    import tvm

    from tvmfuse.runtime import random_inputs

    made = []
    real = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda path, **kw: (made.append(str(path)), real(path, **kw)))
    module = LibraryFile.link(tiny_compiled.executable).load()
    assert [os.path.dirname(path) for path in made] == [str(ram)] * 2 and list(ram.iterdir()) == []  # link, load
    inputs = random_inputs(tiny_compiled.inputs, seed=1)
    vm = tvm.relax.VirtualMachine(module, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(inputs[i.name]) for i in tiny_compiled.inputs]).numpy()
    np.testing.assert_array_equal(got, tiny_compiled.run(inputs)[0])


def test_a_link_or_load_the_ram_folder_cannot_hold_is_done_in_the_default_one(ram, tiny_compiled, monkeypatch,
                                                                             tmp_path):
    import errno
    import tempfile

    from tvmfuse import blob_object

    default = tmp_path / "tmp"
    default.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(default))
    real_write, real_send = blob_object.write, LibraryFile.send
    refused = []

    def full(path):  # another process filled the RAM folder after it was chosen
        if str(path).startswith(str(ram)):
            refused.append(path)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(blob_object, "write", lambda path, *a: full(path) or real_write(path, *a))
    library = LibraryFile.link(tiny_compiled.executable)
    assert len(refused) == 1 and list(ram.iterdir()) == []
    monkeypatch.setattr(blob_object, "write", real_write)
    assert library.read_bytes() == LibraryFile.link(tiny_compiled.executable).read_bytes()

    def send(self, fd):
        full(os.readlink(f"/proc/self/fd/{fd}"))
        return real_send(self, fd)

    monkeypatch.setattr(LibraryFile, "send", send)
    assert library.load() is not None and len(refused) == 2 and list(ram.iterdir()) == []
    assert list(default.iterdir()) == []
