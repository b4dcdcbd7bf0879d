"""Shared fixtures and hardware markers.

Markers (declared in pyproject.toml): ``gpu`` tests need an NVIDIA GPU, ``avx512`` tests run AVX-512 code;
both skip with a reason where the hardware is missing. Everything else passes on any x86-64 CPU.
``host_cpu`` tests follow the host's vector width or CPU features: ``.ci/run`` runs them a second time with
``TVMFUSE_HOST_CPU=znver3`` on an AVX-512 machine, so the AVX2 paths are run too. Shared builders and
references live in the ``helpers`` package (``tests/helpers/``), on ``sys.path`` through ``pythonpath`` in
pyproject.toml.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import HOST

from tvmfuse import cuda_driver, targets


# Test modules whose expectations or code paths follow the host's vector width or CPU features (x86 rules and
# their tiles, blocked layouts, INT8 kernels without VNNI, the host checks): ``host_cpu``-marked here, and run
# a second time as an AVX2-only CPU by .ci/run on an AVX-512 machine. A test in them marked ``any_cpu`` builds for
# CUDA only (its kernels run on the CPU, if at all, as generic LLVM code) and runs once.
HOST_CPU_MODULES = {
    "schedules/test_whole_vector_rows.py", "schedules/test_schedule_softmax.py", "schedules/test_padding_taps.py",
    "schedules/test_schedule_x86_configs.py", "schedules/test_schedule_x86_structure.py",
    "schedules/test_schedule_x86_int8.py", "schedules/test_schedule_x86_int8_tiles.py",
    "schedules/test_schedule_x86_int8_blocked.py", "schedules/test_schedule_concat.py",
    "schedules/test_int8_table.py", "schedules/test_int8_se.py", "schedules/test_winograd.py",
    "schedules/test_narrow_groups.py", "schedules/test_blocked_pool.py", "schedules/test_layout_transform.py",
    "schedules/test_fast_sigmoid.py", "schedules/test_resize_two_pass.py", "schedules/test_schedule_generic.py",
    "passes/test_plain_output.py", "passes/test_padded_blocks.py", "passes/test_blocked_layout.py",
    "passes/test_channel_shuffle.py", "passes/test_quantize_blocked.py", "passes/test_blocked_ops.py",
    "passes/test_fused_numerics.py", "passes/test_grouped_conv.py", "zoo/test_zoo_compile.py",
    "frontend/test_dynamic_quant.py", "frontend/test_integer_kernels.py", "frontend/test_qdq_import.py",
    "frontend/test_qdq_tables.py", "test_targets.py", "test_bench_map_sizes.py",
    "test_quantize_api.py", "test_quantize_cpus.py",
}


def pytest_configure(config):
    # The kernel cache stays out of the suite: a test would otherwise get a build (and skip the warnings it
    # checks for) because an earlier test compiled the same model. The cache's own tests name a folder.
    os.environ.setdefault("TVMFUSE_NO_CACHE", "1")


def pytest_collection_modifyitems(config, items):
    avx512 = targets.resolve("x86-avx512").backend().runs_on_this_cpu()
    reason = "needs a CPU with AVX-512 and VNNI to run x86-avx512 code"
    if os.environ.get(targets.HOST_CPU_ENV):
        reason += f" ({targets.HOST_CPU_ENV}={os.environ[targets.HOST_CPU_ENV]} takes this machine for a CPU without)"
    gpu = cuda_driver.cuda_available()
    tests = Path(__file__).parent
    for item in items:
        if item.path.relative_to(tests).as_posix() in HOST_CPU_MODULES and "any_cpu" not in item.keywords:
            item.add_marker(pytest.mark.host_cpu)
        if "avx512" in item.keywords and not avx512:
            item.add_marker(pytest.mark.skip(reason=reason))
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
