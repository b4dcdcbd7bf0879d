"""Every zoo model compiled by tvmfuse matches onnxruntime on the same input (rtol = atol = 1e-4).

The models written the way exporters write them (REAL_EXPORTS) run in both layouts on x86-host; the
x86-avx512 runs cover the blocked layout. ``bench/real_models.py --matrix`` checks every combination.
"""

import numpy as np
import pytest

import os

import tvmfuse
from tvmfuse import targets, zoo

from helpers import ort_run

MODELS = ["tiny_convnet", "mobilenet_v2", "resnet18", "resnet50", "efficientnet_lite0"]
# Compile seconds on 2 cores (Zen 4, x86-avx512, blocked): 14, 5, 4, 8, 3, 7, 4, 12.
REAL_EXPORTS = list(zoo.REAL_EXPORTS)


def _check(name, target, layout="blocked"):
    model = zoo.get(name)
    cm = tvmfuse.compile(model, target=target, shapes=zoo.default_shapes(name), layout=layout)
    x = {i.name: np.random.default_rng(7).standard_normal(i.shape).astype(i.dtype) for i in cm.inputs}
    ours, ref = cm.run(x), ort_run(model, x)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=zoo.tolerance(name), atol=zoo.tolerance(name))


# The models run again as an AVX2-only CPU (TVMFUSE_HOST_CPU, .ci/run's second pass): the classifiers but the
# largest, the channel shuffle and the LSTM. The others' rules and layouts are theirs (the largest are ResNet-50's
# and ResNeXt-50's convs, YOLOv8n's and UNet's resizes and concats, ConvNeXt's 7x7 depthwise convs and layer
# norms, which the schedules' own AVX2 tests cover), and the second pass has to stay within CI's time.
AS_ANOTHER_CPU = {"tiny_convnet", "mobilenet_v2", "resnet18", "efficientnet_lite0", "shufflenet_v2", "crnn"}


def _skip_as_another_cpu(name):
    if name not in AS_ANOTHER_CPU and os.environ.get(targets.HOST_CPU_ENV):
        pytest.skip(f"{name}: run once, on this CPU's own code ({targets.HOST_CPU_ENV} is set; AS_ANOTHER_CPU "
                    "says which models run again)")


@pytest.mark.parametrize("name", MODELS + REAL_EXPORTS)
def test_zoo_matches_onnxruntime_host(name):
    _skip_as_another_cpu(name)
    _check(name, "x86-host")


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_EXPORTS)
def test_real_exports_match_onnxruntime_host_nchw(name):
    _skip_as_another_cpu(name)
    _check(name, "x86-host", layout="nchw")


@pytest.mark.avx512
@pytest.mark.parametrize("name", MODELS + REAL_EXPORTS)
def test_zoo_matches_onnxruntime_avx512(name):
    host = targets.resolve("x86-host").backend()
    if host.vector_bits == 512 and host.vnni and name != "tiny_convnet":
        pytest.skip("x86-host is AVX-512 with VNNI here: test_zoo_matches_onnxruntime_host ran this model on the "
                    "same rules and layout (tiny_convnet runs x86-avx512's own code)")
    _check(name, "x86-avx512")


def test_every_zoo_model_is_checked():
    assert sorted(MODELS + REAL_EXPORTS) == zoo.names()
    assert set(zoo.LOOSER_BOUNDS) <= set(zoo.names())
    assert all(1e-4 < tol <= 1e-3 and why for tol, why in zoo.LOOSER_BOUNDS.values())


def test_zoo_name_compiles_without_shapes():
    """A built-in model with a -1 batch compiles at batch 1 by name; the same proto needs a shape."""
    assert tvmfuse.compile("zoo:crnn", target="x86-host").inputs[0].shape == (1, 3, 32, 128)
    with pytest.raises(tvmfuse.errors.ShapeError, match="input 'input' has dynamic dims"):
        tvmfuse.compile(zoo.get("crnn"), target="x86-host")
