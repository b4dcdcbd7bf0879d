"""Lowered kernels from the cache: a second compile lowers no partition, keys its kernels' schedules and objects
from the lowering's keys without serializing them, and builds the same library; an entry that does not parse
is lowered again."""

from __future__ import annotations

import numpy as np
import tvm
from helpers import HOST

import tvmfuse
from tvmfuse.cache import lowered
from tvmfuse.cache.store import Store
from tvmfuse.passes import lower
from tvmfuse.runtime import random_inputs

MODEL = "zoo:tiny_convnet"


def _count_lowering(monkeypatch) -> list:
    calls, real = [], lower.make_kernel

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(lower, "make_kernel", counting)
    return calls


def test_a_second_compile_lowers_nothing_and_builds_the_same_library(tmp_path, monkeypatch):
    calls = _count_lowering(monkeypatch)
    first = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    made = len(calls)
    second = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    assert made > 3 and len(calls) == made  # nothing lowered the second time
    logged = [r for r in Store(tmp_path).runs() if r["kind"] == "lowered"]
    assert [(r["hits"], r["misses"]) for r in logged] == [(0, made), (made, 0)]
    assert first.library_bytes() == second.library_bytes()
    assert first.kernel_info == second.kernel_info
    x = random_inputs(first.inputs)
    uncached = tvmfuse.compile(MODEL, HOST, cache=False)
    np.testing.assert_array_equal(second.run(x)[0], uncached.run(x)[0])


def test_the_later_keys_chain_from_the_lowering(tmp_path, monkeypatch):
    """The second compile serializes the partition functions for their keys, and none of tvmfuse's kernels:
    their schedules' and objects' keys chain from the lowering's."""
    tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    serialized, real = [], tvm.ir.save_json

    def recording(node):
        serialized.append(node)
        return real(node)

    monkeypatch.setattr(tvm.ir, "save_json", recording)
    cm = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    assert cm.cache_info["from_cache"] == cm.cache_info["kernels"]
    ours = [n for n in serialized if isinstance(n, tvm.tirx.PrimFunc) and n.attrs and "tvmfuse.partition" in n.attrs]
    assert ours == [] and any(isinstance(n, tvm.relax.Function) for n in serialized)


def test_an_entry_that_does_not_parse_is_lowered_again(tmp_path, monkeypatch):
    tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    store = Store(tmp_path)
    keys, real = [], lowered.lowered_key

    def recording(*args):
        keys.append(real(*args))
        return keys[-1]

    monkeypatch.setattr(lowered, "lowered_key", recording)
    cm = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    for key in keys:
        store.put(key, b'{"func": "not TVM JSON", "layout": {}}')
    calls = _count_lowering(monkeypatch)
    again = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    assert len(calls) == len(set(keys)) > 0
    x = random_inputs(cm.inputs)
    np.testing.assert_array_equal(again.run(x)[0], cm.run(x)[0])


def test_an_nchw_kernel_and_a_blocked_one_have_other_keys():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 4, 4), "float32"))
    with bb.function("f", [x]):
        bb.emit_func_output(bb.emit(relax.op.nn.relu(x)))
    fn = bb.get()["f"]
    target = tvmfuse.targets.resolve(HOST).tvm_target()
    keys = {lowered.lowered_key(fn, target, blocks) for blocks in (None, {}, {0: 8}, {0: 16})}
    assert len(keys) == 4


def test_a_changed_layer_leaves_the_other_partitions_keys_alone(tmp_path):
    """The graph's values are numbered in order (``lv24``), so a change renames every variable after it: the keys
    ignore the names, and a model with one activation changed reuses every other kernel."""
    from tvmfuse import zoo

    model = zoo.get("mobilenet_v2")
    first = tvmfuse.compile(model, HOST, cache=tmp_path, whole=False)
    relus = [n for n in model.graph.node if n.op_type in ("Clip", "Relu")]
    node = relus[len(relus) // 2]
    node.op_type = "LeakyRelu"
    del node.input[1:]
    changed = tvmfuse.compile(model, HOST, cache=tmp_path, whole=False)
    logged = [r for r in Store(tmp_path).runs() if r["kind"] == "lowered"][-1]
    assert logged["misses"] <= 2 and logged["hits"] >= 40, logged
    assert changed.cache_info["from_cache"] >= first.cache_info["kernels"] - 2, changed.cache_info
