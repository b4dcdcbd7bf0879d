"""The linked library held as a name-less open file: its bytes, kernel copies into the cache and the export,
a stored build read back as a part of its entry, nothing left on disk by a link or a load."""

from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import pytest
from helpers import HOST

import tvmfuse
from tvmfuse.cache import models
from tvmfuse.cache.store import Store
from tvmfuse.library_file import CHUNK, LibraryFile
from tvmfuse.runtime import random_inputs

DATA = bytes(range(256)) * (CHUNK // 256 * 2 + 3)  # more than two chunks, not a whole number of them


def test_bytes_round_trip_through_a_file_that_has_no_name():
    library = LibraryFile.from_bytes(DATA)
    assert os.fstat(library.fd).st_nlink == 0  # nothing for a killed process to leave behind
    assert library.size == len(DATA) and library.read_bytes() == DATA
    assert b"".join(library.chunks()) == DATA


def test_a_part_of_an_open_file_keeps_its_own_descriptor(tmp_path):
    path = tmp_path / "entry"
    path.write_bytes(b"head" + DATA + b"tail")
    fd = os.open(path, os.O_RDONLY)
    part = LibraryFile.part_of(fd, 4, len(DATA))
    os.close(fd)
    path.unlink()  # an evicted or replaced entry: the part still reads what was there
    assert part.read_bytes() == DATA
    part.write(tmp_path / "copy.so")
    assert (tmp_path / "copy.so").read_bytes() == DATA


def test_a_store_entry_takes_a_library_part_and_checks_it_like_bytes(tmp_path):
    store = Store(tmp_path / "c")
    key = "ab" * 32
    store.put(key, b"head", LibraryFile.from_bytes(DATA), b"tail")
    assert store.get(key) == b"head" + DATA + b"tail"
    data = bytearray(store.path(key).read_bytes())
    data[-len(DATA) // 2] ^= 1  # one bit in the library
    store.path(key).write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.open(key) is None
    assert len(caught) == 1 and "damaged" in str(caught[0].message)


def test_a_stored_build_reads_back_its_state_and_library(tmp_path):
    store = Store(tmp_path / "c")
    state = {k: [k] for k in models.STATE}
    models.save(store, "cd" * 32, state, LibraryFile.from_bytes(DATA))
    got_state, library = models.load(store, "cd" * 32)
    assert got_state == state and library.read_bytes() == DATA
    store.path("cd" * 32).write_bytes(store.path("cd" * 32).read_bytes()[:-1])
    with pytest.warns(UserWarning, match="damaged"):
        assert models.load(store, "cd" * 32) is None


def _leftovers() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(("tvmfuse-link-", "tvmfuse-load-",
                                                                           "tvmfuse-lib-"))}


def test_run_export_and_the_cache_share_one_link_and_leave_no_files(tmp_path):
    before = _leftovers()
    cm = tvmfuse.compile("zoo:tiny_convnet", HOST, cache=tmp_path / "c")
    library = cm.library_file()
    assert cm.library_file() is library and os.fstat(library.fd).st_nlink == 0
    out = cm.run(random_inputs(cm.inputs))[0]
    exported = cm.export(tmp_path / "m.so")
    assert exported.read_bytes() == library.read_bytes() == cm.library_bytes()
    again = tvmfuse.compile("zoo:tiny_convnet", HOST, cache=tmp_path / "c")
    assert again.cache_info["model"] == "hit" and again.library_bytes() == library.read_bytes()
    np.testing.assert_array_equal(again.run(random_inputs(again.inputs))[0], out)
    assert _leftovers() == before
