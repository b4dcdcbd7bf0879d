"""Every zoo model compiled by tvmfuse matches onnxruntime on the same input (rtol = atol = 1e-4)."""

import numpy as np
import pytest

import tvmfuse
from tvmfuse import zoo

from helpers import ort_run

MODELS = ["tiny_convnet", "mobilenet_v2", "resnet18", "resnet50", "efficientnet_lite0"]


def _check(name, target):
    model = zoo.get(name)
    cm = tvmfuse.compile(model, target=target)
    x = {i.name: np.random.default_rng(7).standard_normal(i.shape).astype(i.dtype) for i in cm.inputs}
    ours, ref = cm.run(x), ort_run(model, x)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_zoo_matches_onnxruntime_host(name):
    _check(name, "x86-host")


@pytest.mark.avx512
@pytest.mark.parametrize("name", MODELS)
def test_zoo_matches_onnxruntime_avx512(name):
    _check(name, "x86-avx512")
