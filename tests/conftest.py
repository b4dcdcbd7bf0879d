"""Shared fixtures and hardware markers.

Markers (declared in pyproject.toml): ``gpu`` tests need an NVIDIA GPU, ``avx512`` tests run AVX-512 code;
both skip with a reason where the hardware is missing. Everything else passes on any x86-64 CPU. Shared
builders and references live in the ``helpers`` package (``tests/helpers/``), on ``sys.path`` through
``pythonpath`` in pyproject.toml.
"""

from __future__ import annotations

import pytest
from helpers import HOST

from tvmfuse import targets


def pytest_collection_modifyitems(config, items):
    avx512 = targets.host_can_run(targets.resolve("x86-avx512"))
    gpu = targets.cuda_available()
    for item in items:
        if "avx512" in item.keywords and not avx512:
            item.add_marker(pytest.mark.skip(reason="needs a CPU with AVX-512 and VNNI to run x86-avx512 code"))
        if "gpu" in item.keywords and not gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))


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
