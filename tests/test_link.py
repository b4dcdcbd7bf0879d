"""Linking exported libraries (``tvmfuse/link.py``): gold where it links, the default linker where not,
empty source files left out; the library runs as TVM's own export does."""

import numpy as np
import pytest

from tvmfuse import link


@pytest.fixture
def calls(monkeypatch):
    """The (objects, options) of every ``tvm.support.cc.create_shared`` call; a call with gold raises while
    ``calls.refuse_gold`` is set."""
    from tvm.support import cc

    class Calls(list):
        refuse_gold = False

    made = Calls()

    def fake(output, objects, options=None, **kwargs):
        made.append((list(objects), list(options or [])))
        if made.refuse_gold and "-fuse-ld=gold" in (options or []):
            raise RuntimeError("Compilation error:\nld.gold: internal error")

    monkeypatch.setattr(cc, "create_shared", fake)
    monkeypatch.setitem(link._GOLD, "works", True)
    return made


def test_gold_used_and_blank_sources_dropped(calls, tmp_path):
    blank, code, obj = tmp_path / "lib1.c", tmp_path / "lib2.c", tmp_path / "lib0.o"
    blank.write_text("\n")
    code.write_text("int f(void) { return 1; }\n")
    obj.write_bytes(b"\x7fELF")
    link.create_shared(str(tmp_path / "m.so"), [str(obj), str(blank), str(code)], ["-I/x"])
    assert calls == [([str(obj), str(code)], ["-I/x"] + link.GOLD_OPTIONS)]


def test_a_link_gold_refuses_is_done_again_by_the_default_linker(calls, tmp_path):
    calls.refuse_gold = True
    link.create_shared(str(tmp_path / "m.so"), ["a.o"], None)
    link.create_shared(str(tmp_path / "m.so"), ["b.o"], None)
    # the process keeps to the default linker
    assert calls == [(["a.o"], link.GOLD_OPTIONS), (["a.o"], link.LINK_OPTIONS), (["b.o"], link.LINK_OPTIONS)]
    assert link._GOLD["works"] is False


def test_linked_library_runs_as_tvms_export(tiny_compiled, tmp_path):
    import tvm

    from tvmfuse.runtime import random_inputs

    ours, theirs = tmp_path / "ours.so", tmp_path / "theirs.so"
    link.export_library(tiny_compiled.executable, str(ours))
    tiny_compiled.executable.export_library(str(theirs))
    inputs = random_inputs(tiny_compiled.inputs, seed=3)
    outputs = []
    for path in (ours, theirs):
        vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
        outputs.append(vm["main"](*[tvm.runtime.tensor(inputs[i.name]) for i in tiny_compiled.inputs]).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_the_same_executable_links_to_the_same_bytes_wherever_it_goes(tiny_compiled, tmp_path):
    (tmp_path / "sub").mkdir()
    first, second = tmp_path / "a.so", tmp_path / "sub" / "b.so"
    for path in (first, second):
        link.export_library(tiny_compiled.executable, str(path))
    assert first.read_bytes() == second.read_bytes()


def test_the_library_has_no_build_id_to_hash_its_weights_for(tiny_compiled, tmp_path):
    link.export_library(tiny_compiled.executable, str(tmp_path / "m.so"))
    data = (tmp_path / "m.so").read_bytes()
    assert data[:4] == b"\x7fELF" and b".note.gnu.build-id" not in data
