"""A compile the cache already holds, answered without TVM (``tvmfuse.cache.hits``): the same library and
manifest as the normal path, and the normal path wherever anything the whole key depends on changed."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from helpers import HOST, conv_relu
from helpers.cli_run import cli_run

import tvmfuse
from tvmfuse import cli, targets
from tvmfuse.cache import hits, models, resolve
from tvmfuse.cached_build import model_digest
from tvmfuse.tune import database


def _manifest(path):
    data = json.loads(path.with_suffix(".json").read_text())
    return {k: v for k, v in data.items() if k not in ("created", "digest", "seal")}


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_relu(batch=1), path)
    return path


def test_a_recorded_build_is_exported_without_tvm_and_matches_the_normal_path(tmp_path, model):
    cache = tmp_path / "c"
    first = cli_run(["compile", str(model), "--target", HOST, "-o", str(tmp_path / "a.so"), "-q"], cache)
    assert "TVM True" in first
    again = cli_run(["compile", str(model), "--target", HOST, "-o", str(tmp_path / "b.so"), "-q"], cache)
    assert "TVM False" in again and "kernel cache: the whole build reused" in again
    assert (tmp_path / "a.so").read_bytes() == (tmp_path / "b.so").read_bytes()
    assert _manifest(tmp_path / "a.so") == _manifest(tmp_path / "b.so")
    x = {"x": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")}
    np.testing.assert_array_equal(tvmfuse.load(tmp_path / "a.so").run(x)[0], tvmfuse.load(tmp_path / "b.so").run(x)[0])
    # a CPU named in the environment, or other tuning logs, is another request: the normal path again
    other = cli_run(["compile", str(model), "--target", HOST, "-o", str(tmp_path / "c.so"), "-q", "--no-logs"], cache)
    assert "TVM True" in other


def test_a_recorded_quantized_build_is_exported_without_tvm(tmp_path, model):
    cache, args = tmp_path / "c", ["quantize", str(model), "--calib", "random:2", "--method", "minmax", "--target",
                                   HOST, "-q"]
    first = cli_run(args + ["-o", str(tmp_path / "a.so")], cache)
    again = cli_run(args + ["-o", str(tmp_path / "b.so")], cache)
    assert "TVM True" in first and "TVM False" in again and "INT8 partition(s)" in again
    assert (tmp_path / "a.so").read_bytes() == (tmp_path / "b.so").read_bytes()
    assert _manifest(tmp_path / "a.so") == _manifest(tmp_path / "b.so")
    other = cli_run(args[:-1] + ["--weight-bits", "8", "-q", "-o", str(tmp_path / "c.so")], cache)
    assert "TVM True" in other  # another weight width: another request


def test_a_request_is_answered_only_while_its_logs_and_build_are_unchanged(tmp_path, model):
    store, logs = resolve(tmp_path / "c"), tmp_path / "logs"
    logs.mkdir()
    tvmfuse.compile(str(model), HOST, logs=logs, cache=store)
    options = hits.request_options(None, None, "blocked", "fp32", True, logs)
    request = hits.request_key(model_digest(store, str(model)), HOST, options)
    record, state, library = hits.answer(store, request)
    assert state["kernels"] and library.size > 0 and record["log_files"]
    folder = database.LogStore(logs, targets.resolve(HOST)).path
    folder.mkdir(parents=True, exist_ok=True)
    (folder / database.RECORDS).write_text("")  # tuning logs appear: the record no longer answers
    assert hits.answer(store, request) is None
    (folder / database.RECORDS).unlink()
    assert hits.answer(store, request) is not None
    store.path(record["whole"]).unlink()  # the build evicted: no answer either
    assert hits.answer(store, request) is None


def test_the_request_key_follows_what_decides_the_whole_key(tmp_path, monkeypatch):
    options = hits.request_options({"x": (1, 3, 16, 16)}, None, "blocked", "fp32", True, "logs")
    assert options["logs"] == os.path.abspath("logs") and options["shapes"] == {"x": [1, 3, 16, 16]}
    key = hits.request_key("file abc", HOST, options)
    assert key == hits.request_key("file abc", HOST, dict(options))
    assert key != hits.request_key("file abd", HOST, options)
    assert key != hits.request_key("file abc", {"kind": "llvm", "mcpu": "znver3"}, options)
    assert hits.request_key("file abc", targets.resolve(HOST), options) is None
    monkeypatch.setenv("TVM_NUM_THREADS", "7")  # set by tvmfuse itself before TVM starts: not in the key
    assert hits.request_key("file abc", HOST, options) == key
    for name in hits.KEY_ENV:
        monkeypatch.setenv(name, "znver3")
        assert hits.request_key("file abc", HOST, options) != key
        monkeypatch.delenv(name)
    assert set(hits.KEY_ENV) == {targets.HOST_CPU_ENV, database.ENV}


def test_a_damaged_record_sends_the_compile_the_normal_way(tmp_path, model, capsys):
    cache = tmp_path / "c"
    tvmfuse.compile(str(model), HOST, cache=cache)
    store = resolve(cache)
    request = hits.request_key(model_digest(store, str(model)), HOST,
                               hits.request_options(None, None, "blocked", "fp32", True, None))
    store.path(request).write_bytes(store.path(request).read_bytes()[:-3])
    assert cli.main(["compile", str(model), "--target", HOST, "--cache-dir", str(cache), "-o",
                     str(tmp_path / "m.so"), "-q"]) == 0
    assert "damaged" in capsys.readouterr().err and models.load(store, hits.answer(store, request)[0]["whole"])
