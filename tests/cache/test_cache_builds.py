"""Kernels and whole builds from the cache: same outputs, same library, misses where anything that decides the
code changed, the Relax modules rebuilt on demand."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import HOST, conv_relu

import tvmfuse
from tvmfuse.cache import fingerprint
from tvmfuse.runtime import random_inputs

MODEL = "zoo:tiny_convnet"


def _run(cm):
    return cm.run(random_inputs(cm.inputs))[0]


def test_kernels_come_from_the_cache_and_give_the_same_library(tmp_path):
    first = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    assert first.cache_info["from_cache"] == 0 and first.cache_info["kernels"] > 3
    second = tvmfuse.compile(MODEL, HOST, cache=tmp_path, whole=False)
    assert second.cache_info == {"model": "miss", "kernels": first.cache_info["kernels"],
                                 "from_cache": first.cache_info["kernels"]}
    np.testing.assert_array_equal(_run(first), _run(second))
    assert first.library_bytes() == second.library_bytes()  # byte-identical .so
    uncached = tvmfuse.compile(MODEL, HOST, cache=False)
    assert uncached.cache_info["model"] == "off" and uncached.cache_info["from_cache"] == 0
    np.testing.assert_array_equal(_run(first), _run(uncached))


def test_a_whole_build_comes_back_with_its_manifest_and_its_relax_modules_on_demand(tmp_path):
    first = tvmfuse.compile(MODEL, HOST, cache=tmp_path)
    assert first.cache_info["model"] == "miss"
    again = tvmfuse.compile(MODEL, HOST, cache=tmp_path)
    assert again.cache_info["model"] == "hit" and set(again.stats) == {"cached build"}
    np.testing.assert_array_equal(_run(first), _run(again))
    a, b = first.export(tmp_path / "a.so"), again.export(tmp_path / "b.so")
    assert a.read_bytes() == b.read_bytes()
    ma, mb = first.manifest(), again.manifest()
    ma.pop("created"), mb.pop("created")
    assert ma == mb
    loaded = tvmfuse.load(b)
    np.testing.assert_array_equal(loaded.run(random_inputs(loaded.inputs))[0], _run(first))
    assert "lowered" not in again.__dict__
    assert sorted(k.name_hint for k, f in again.lowered.functions_items()
                  if f.__class__.__name__ == "PrimFunc") == ma["kernels"]  # rebuilt when asked
    assert again.partition_report().summary() == first.partition_report().summary()


def test_what_decides_the_code_misses_when_it_changes(tmp_path, monkeypatch):
    model, one = conv_relu(), {"x": (1, 3, 16, 16)}
    base = tvmfuse.compile(model, HOST, cache=tmp_path, shapes=one)
    n = base.cache_info["kernels"]
    assert tvmfuse.compile(model, HOST, cache=tmp_path, shapes=one).cache_info["model"] == "hit"
    assert tvmfuse.compile(model, HOST, cache=tmp_path, shapes={"x": (2, 3, 16, 16)}).cache_info["model"] == "miss"
    assert tvmfuse.compile(model, HOST, cache=tmp_path, shapes=one, layout="nchw").cache_info["model"] == "miss"
    other = conv_relu(seed=1)  # other weights, same kernels (weights are arguments)
    changed = tvmfuse.compile(other, HOST, cache=tmp_path, shapes=one)
    assert changed.cache_info == {"model": "miss", "kernels": n, "from_cache": n}
    monkeypatch.setattr(fingerprint, "versions", lambda: "tvmfuse 99; tvm 99")  # an upgrade
    upgraded = tvmfuse.compile(model, HOST, cache=tmp_path, shapes=one)
    assert upgraded.cache_info == {"model": "miss", "kernels": n, "from_cache": 0}


def test_a_damaged_whole_build_is_rebuilt_with_one_warning(tmp_path):
    tvmfuse.compile(MODEL, HOST, cache=tmp_path)
    for path in tmp_path.glob("*/*"):
        if path.stat().st_size > 100_000:  # the whole build (the library), not a kernel object
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 1
            path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="damaged"):
        cm = tvmfuse.compile(MODEL, HOST, cache=tmp_path)
    assert cm.cache_info["model"] == "miss" and cm.cache_info["from_cache"] == cm.cache_info["kernels"]
    assert tvmfuse.compile(MODEL, HOST, cache=tmp_path).cache_info["model"] == "hit"


def test_a_quantized_build_comes_back_whole_for_the_same_calibration_source(tmp_path):
    table, cache = tmp_path / "table.json", tmp_path / "c"
    first = tvmfuse.quantize(MODEL, "random:2", "minmax", HOST, table=table, cache=cache)  # writes the table
    assert first.cache_info["model"] == "miss"
    again = tvmfuse.quantize(MODEL, None, "minmax", HOST, table=table, cache=cache)
    second = tvmfuse.quantize(MODEL, None, "minmax", HOST, table=table, cache=cache)
    assert (again.cache_info["model"], second.cache_info["model"]) == ("miss", "hit")
    assert second.quantization == again.quantization and second.executable is None  # loaded when it runs
    np.testing.assert_array_equal(_run(first), _run(second))
    rng = np.random.default_rng(0)
    batches = [{"input": rng.standard_normal((1, 3, 32, 32)).astype("float32")} for _ in range(2)]
    data = [tvmfuse.quantize(MODEL, b, "minmax", HOST, cache=cache).cache_info["model"]
            for b in (batches, [dict(b) for b in batches], [batches[0]], iter(batches))]
    assert data == ["miss", "hit", "miss", "miss"]  # an iterator is not consumed for a key
    other = tvmfuse.quantize(MODEL, batches, "entropy", HOST, cache=cache)
    assert other.cache_info["model"] == "miss"
    bits = 8 if other.quantization["weight_bits"] == 7 else 7  # the other width than this target's default
    assert tvmfuse.quantize(MODEL, batches, "entropy", HOST, cache=cache, weight_bits=bits).cache_info["model"] == "miss"


def test_the_calibrating_build_uses_the_cache_given_and_no_other(tmp_path, monkeypatch):
    from tvmfuse.cache.store import Store

    monkeypatch.delenv("TVMFUSE_NO_CACHE", raising=False)
    monkeypatch.setenv("TVMFUSE_CACHE_DIR", str(tmp_path / "default"))
    batch = {"input": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype("float32")}
    tvmfuse.quantize(MODEL, batch, "minmax", HOST, cache=tmp_path / "given")
    kinds = [run["kind"] for run in Store(tmp_path / "given").runs()]
    assert kinds.count("kernels") == 2  # the FP32 build observing the data, then the INT8 build
    tvmfuse.quantize(MODEL, batch, "minmax", HOST, cache=False)
    assert not (tmp_path / "default").exists()


def test_calibrating_again_on_other_data_reuses_the_observing_builds_kernels(tmp_path):
    from tvmfuse.cache.store import Store

    rng = np.random.default_rng(2)
    first, second = ([{"input": rng.standard_normal((1, 3, 32, 32)).astype("float32")}] for _ in range(2))
    tvmfuse.quantize(MODEL, first, "minmax", HOST, cache=tmp_path)
    before = len(Store(tmp_path).runs())
    tvmfuse.quantize(MODEL, second, "minmax", HOST, cache=tmp_path)
    runs = Store(tmp_path).runs()[before:]
    observing = {kind: next(r for r in runs if r["kind"] == kind) for kind in ("lowered", "schedules", "kernels")}
    assert all(r["misses"] == 0 and r["hits"] > 0 for r in observing.values()), observing


def test_a_model_with_external_data_misses_when_only_its_data_file_changes(tmp_path):
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save_model(conv_relu(), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    one = {"x": (1, 3, 16, 16)}
    first = tvmfuse.compile(path, HOST, shapes=one, cache=tmp_path / "c")
    assert tvmfuse.compile(path, HOST, shapes=one, cache=tmp_path / "c").cache_info["model"] == "hit"
    data = bytearray((tmp_path / "weights.bin").read_bytes())
    data[:4] = np.float32(7.0).tobytes()  # the first weight, same size
    (tmp_path / "weights.bin").write_bytes(bytes(data))
    changed = tvmfuse.compile(path, HOST, shapes=one, cache=tmp_path / "c")
    assert changed.cache_info["model"] == "miss"
    assert not np.array_equal(_run(first), _run(changed))


def test_compare_arms_build_through_the_cache(tmp_path, monkeypatch):
    from tvmfuse.comparison.run import compare

    monkeypatch.delenv("TVMFUSE_NO_CACHE", raising=False)
    monkeypatch.setenv("TVMFUSE_CACHE_DIR", str(tmp_path / "cache"))
    rows = [compare(MODEL, [HOST], peers=[], budget=0.5, profile=False, output=tmp_path / f"r{i}").row(HOST)
            for i in range(2)]
    assert [r["build"]["cache"]["model"] for r in rows] == ["miss", "hit"]
    assert rows[1]["build"]["kernels"] == rows[0]["build"]["kernels"]  # its kernel table from the rebuilt modules
