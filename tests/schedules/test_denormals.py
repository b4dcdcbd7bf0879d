"""x86 kernels flush denormals while they run (schedules/x86/denormals.py): on the calling thread and on
every task of the pool, with the caller's floating-point mode put back after, and a model's results as before
for everything but denormals."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import s_tir, te, tirx

import tvmfuse
from tvmfuse.schedules.x86 import denormals, stack_tiles

from helpers import HOST, make_model
from helpers.blocked import conv_model

TINY = np.float32(1e-20)  # TINY * TINY = 1e-40: a denormal float32
DENORMAL = np.float32(1e-39)


def _functions(ll: str) -> dict[str, str]:
    """LLVM IR function name -> its body."""
    found = {}
    for part in ll.split("\ndefine ")[1:]:
        name = re.search(r"@([\w.$]+)\(", part).group(1)
        found[name] = part.split("\n}\n")[0]
    return found


def _flushes(body: str) -> bool:
    """Saves MXCSR, loads it with the flush bits, and loads the saved word back before returning."""
    store, loads = body.find("llvm.x86.sse.stmxcsr"), [m.start() for m in re.finditer("llvm.x86.sse.ldmxcsr", body)]
    return 0 <= store < min(loads, default=-1) and len(loads) >= 2 and "or i32" in body


@pytest.fixture(scope="module")
def conv():
    """A conv big enough to run on every thread of the pool, compiled for this CPU."""
    model, feeds = conv_model(32, 32, 64, 1, act="Relu")
    return tvmfuse.compile(model, target=HOST), feeds


def test_every_kernel_flushes_on_the_calling_thread_and_on_each_task_of_the_pool(conv):
    cm, _ = conv
    functions = _functions(cm.kernel_source("ll"))
    bodies = {n: b for n, b in functions.items() if n.endswith("_compute_")}  # each kernel's own code
    tasks = {n: b for n, b in functions.items() if n.startswith("__tvm_parallel_lambda")}
    assert len(bodies) >= 2 and tasks, sorted(functions)
    assert all(_flushes(b) for b in bodies.values()), [n for n, b in bodies.items() if not _flushes(b)]
    assert all(_flushes(b) for b in tasks.values()), [n for n, b in tasks.items() if not _flushes(b)]


def test_the_manifest_says_so(conv, tmp_path):
    cm, _ = conv
    assert cm.manifest()["denormals"] == "flushed"
    cm.export(tmp_path / "m.so")
    assert json.loads((tmp_path / "m.json").read_text())["denormals"] == "flushed"


def _scaled_conv(weight: float):
    """x[1, 32, 64, 64] -> 1x1 Conv with every weight ``weight``, no bias."""
    w = np.full((32, 32, 1, 1), weight, "float32")
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[1, 1])]
    return make_model(nodes, [("x", [1, 32, 64, 64])], [("y", None)], [numpy_helper.from_array(w, "W")])


@pytest.mark.parametrize("x, weight, what", [(TINY, TINY, "denormal products (FTZ)"),
                                            (DENORMAL, 1.0, "denormal inputs (DAZ)")])
def test_denormals_are_zero_on_every_thread_and_the_caller_keeps_its_mode(x, weight, what):
    cm = tvmfuse.compile(_scaled_conv(weight), target=HOST)
    feed = {"x": np.full((1, 32, 64, 64), x, "float32")}
    ieee = np.float32(x) * np.float32(weight)  # numpy on this thread: IEEE denormals
    assert 0 < abs(ieee) < np.finfo(np.float32).tiny, what
    (y,) = cm.run(feed)
    assert not np.any(np.asarray(y)), f"{what}: {np.count_nonzero(np.asarray(y))} outputs not flushed"
    # the calling thread's MXCSR is back: numpy still makes denormals after the run
    assert np.float32(x) * np.float32(weight) == ieee


def test_normal_results_are_the_same_as_without_flushing(conv, monkeypatch):
    cm, feeds = conv
    monkeypatch.setattr(denormals, "FlushDenormals", lambda: tvm.transform.Sequential([]))
    plain = tvmfuse.compile(conv_model(32, 32, 64, 1, act="Relu")[0], target=HOST, cache=False)
    assert "ldmxcsr" not in plain.kernel_source("asm")
    (got,), (ref,) = cm.run(feeds), plain.run(feeds)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def _kernel(extent: int) -> tirx.PrimFunc:
    a = te.placeholder((extent, 64), name="a")
    b = te.compute((extent, 64), lambda i, j: a[i, j] * 2.0, name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    i, _ = sch.get_loops(sch.get_sblock("b"))
    sch.parallel(i)
    return sch.mod["main"]


@pytest.mark.parametrize("extent", [1, 4])
def test_the_x86_pipeline_flushes_with_one_or_many_tasks(extent):
    # a one-iteration parallel loop gets no launch point of its own: lowering drops the loop, and a launch point
    # around no parallel loop fails to build
    built = tvm.tirx.build(_kernel(extent), target="llvm", pipeline=stack_tiles.register())
    a = tvm.runtime.tensor(np.full((extent, 64), DENORMAL, "float32"))
    b = tvm.runtime.tensor(np.ones((extent, 64), "float32"))
    built(a, b)
    assert not np.any(b.numpy()) and DENORMAL * np.float32(2.0) != 0
    functions = _functions(built.inspect_source("ll"))
    assert sum(n.startswith("__tvm_parallel_lambda") and _flushes(b) for n, b in functions.items()) == (extent > 1)


def test_a_kernel_that_flushes_is_left_as_it_is():
    once = denormals.flush_denormals(_kernel(4))
    assert denormals.flush_denormals(once).same_as(once)
