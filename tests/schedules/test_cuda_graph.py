"""CUDA graphs: a CUDA library (static shapes, as every tvmfuse library) captures its kernel launches on the first run and replays them
(TVM's RewriteCUDAGraph), on by default, with an opt-out; the manifest says which. Built and checked here; the
outputs with and without are compared on a GPU (marker ``gpu``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tvmfuse
from helpers import conv_relu
from tvmfuse import cli

CAPTURE = "vm.builtin.cuda_graph.run_or_capture"


def _main_script(cm) -> str:
    return cm.lowered["main"].script()


@pytest.fixture(scope="module")
def with_graph():
    return tvmfuse.compile("zoo:tiny_convnet", target="cuda-sm90")


@pytest.fixture(scope="module")
def without_graph():
    return tvmfuse.compile("zoo:tiny_convnet", target="cuda-sm90", cuda_graph=False)


def test_a_static_cuda_model_captures_its_launches_by_default(with_graph, tmp_path):
    assert CAPTURE in _main_script(with_graph)
    assert with_graph.build_info["cuda_graph"] is True
    manifest = json.loads(with_graph.export(tmp_path / "g.so").with_suffix(".json").read_text())
    assert manifest["cuda_graph"] is True


def test_the_opt_out_launches_kernel_by_kernel(without_graph, with_graph):
    assert CAPTURE not in _main_script(without_graph) and without_graph.build_info["cuda_graph"] is False
    # the same kernels either way: only how they are launched differs
    assert with_graph.manifest()["kernels"] == without_graph.manifest()["kernels"]


def test_cpu_targets_have_no_graph_entry():
    cm = tvmfuse.compile(conv_relu(batch=1), target="x86-host")
    assert "cuda_graph" not in cm.manifest()


def test_cuda_graph_must_be_a_bool():
    with pytest.raises(tvmfuse.errors.InputError, match="cuda_graph must be True or False, got 'no'"):
        tvmfuse.compile(conv_relu(batch=1), target="cuda-sm90", cuda_graph="no")


def test_the_cli_opt_out(tmp_path, capsys):
    out = tmp_path / "plain.so"
    assert cli.main(["compile", "zoo:tiny_convnet", "--target", "cuda-sm90", "-o", str(out), "-q",
                     "--no-cuda-graph"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["cuda_graph"] is False
    assert "one by one on every run (no CUDA graph)" in capsys.readouterr().out


@pytest.mark.gpu
def test_outputs_are_identical_with_and_without_a_graph(with_graph, without_graph):
    x = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype("float32") for i in with_graph.inputs}
    for _ in range(3):  # the first run captures, the next ones replay
        a, b = with_graph.run(x), without_graph.run(x)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)


def test_quantize_has_the_opt_out_too(tmp_path):
    """An INT8 library is profiled kernel by kernel (bench/profile.py --int8) only without a graph."""
    out = tmp_path / "q.so"
    assert cli.main(["quantize", "zoo:tiny_convnet", "--target", "cuda-sm90", "--calib", "random:1",
                     "--method", "minmax", "-o", str(out), "-q", "--no-cuda-graph"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["cuda_graph"] is False
    with pytest.warns(UserWarning, match="random batches"):
        graph = tvmfuse.quantize("zoo:tiny_convnet", calib="random:1", method="minmax", target="cuda-sm90")
    assert CAPTURE in _main_script(graph) and graph.manifest()["cuda_graph"] is True
