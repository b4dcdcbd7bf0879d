"""Whole models on CUDA: every partition of every zoo model (and of every corpus model, when the corpus is
cached) is scheduled by a tvmfuse CUDA rule, for both CUDA targets, and nvcc builds the library; on a GPU
(marker ``gpu``) each zoo model matches onnxruntime."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tvmfuse
from tvmfuse import corpus, zoo

from helpers import ort_run

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

# Kernels outside every partition stay with dlight; a partition must be on a tvmfuse rule.
PARTITION_PREFIX = "tvmfuse_"


def _partition_rules(cm) -> dict:
    return {k: v for k, v in cm.manifest()["scheduled_by"].items() if k.startswith(PARTITION_PREFIX)}


def _check(cm) -> None:
    rules = _partition_rules(cm)
    assert rules, "no partition kernel"
    off = {k: v for k, v in rules.items() if not v.startswith("tvmfuse.cuda.")}
    assert not off, f"partitions not on a tvmfuse CUDA rule: {off}"
    assert cm.manifest()["cuda_code"] == "binary"


@pytest.mark.parametrize("target", ["cuda-sm80", "cuda-sm90"])
@pytest.mark.parametrize("name", zoo.names())
def test_zoo_partitions_on_tvmfuse_rules(name, target):
    _check(tvmfuse.compile(zoo.get(name), target=target, shapes=zoo.default_shapes(name)))


def _cached_corpus() -> list:
    cached = []
    for m in corpus.MODELS:
        path = corpus.local_path(m)
        if path is not None and path.exists():
            cached.append(pytest.param(m, id=m.name))
    return cached or [pytest.param(None, marks=pytest.mark.skip(reason="no corpus model cached (bench/real_models.py "
                                                                        "fetches them)"))]


@pytest.mark.parametrize("model", _cached_corpus())
def test_corpus_partitions_on_tvmfuse_rules(model):
    _check(tvmfuse.compile(str(corpus.local_path(model)), target="cuda-sm90", shapes={model.input: model.shape}))


@pytest.mark.gpu
@pytest.mark.parametrize("name", zoo.names())
def test_zoo_matches_onnxruntime_on_gpu(name):
    model = zoo.get(name)
    cm = tvmfuse.compile(model, target="cuda-sm90", shapes=zoo.default_shapes(name))
    rng = np.random.default_rng(0)
    x = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in cm.inputs}
    ours, ref = cm.run(x), ort_run(model, x)
    tol = zoo.tolerance(name)
    for a, b in zip(ours, ref):
        scale = float(np.abs(b).max()) or 1.0
        np.testing.assert_allclose(a / scale, b / scale, rtol=tol, atol=tol)
