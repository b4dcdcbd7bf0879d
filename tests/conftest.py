"""Shared fixtures and hardware markers.

Markers (declared in pyproject.toml): ``gpu`` tests need an NVIDIA GPU, ``avx512`` tests run AVX-512 code;
both skip with a reason where the hardware is missing. Everything else passes on any x86-64 CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from tvmfuse import targets

# Tests that run compiled code use the host's own target: CI machines may lack AVX-512.
HOST = "x86-host"


def pytest_collection_modifyitems(config, items):
    avx512 = targets.host_can_run(targets.resolve("x86-avx512"))
    gpu = targets.cuda_available()
    for item in items:
        if "avx512" in item.keywords and not avx512:
            item.add_marker(pytest.mark.skip(reason="needs a CPU with AVX-512 and VNNI to run x86-avx512 code"))
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))


def ort_run(model, inputs: dict) -> list[np.ndarray]:
    """Reference outputs from onnxruntime's CPU provider."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


@pytest.fixture(scope="session")
def tiny_compiled():
    """zoo:tiny_convnet compiled once for the host."""
    import tvmfuse

    return tvmfuse.compile("zoo:tiny_convnet", target=HOST)


@pytest.fixture(scope="session")
def tiny_exported(tiny_compiled, tmp_path_factory):
    """zoo:tiny_convnet exported to a .so (with its manifest) in a temp dir."""
    path = tmp_path_factory.mktemp("export") / "tiny.so"
    tiny_compiled.export(path)
    return path
