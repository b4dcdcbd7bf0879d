"""CUDA targets build on a GPU-less machine (nvcc only); running them needs a GPU."""

import re
import shutil

import numpy as np
import pytest

import tvmfuse

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _global_kernels(cm) -> set[str]:
    source = cm.executable.mod.imports[0].imports[0].inspect_source()
    return set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))


@pytest.fixture(scope="module")
def cuda_sm90():
    return tvmfuse.compile("zoo:tiny_convnet", target="cuda-sm90")


def test_cuda_export_has_a_kernel_per_fused_function(cuda_sm90, tmp_path):
    lib = cuda_sm90.export(tmp_path / "tiny_cuda.so")
    assert lib.stat().st_size > 0
    kernels = _global_kernels(cuda_sm90)
    functions = cuda_sm90.manifest()["kernels"]
    # Partitions are tvmfuse kernels; everything else is fused by TVM's default path.
    assert any(f.startswith("tvmfuse_conv2d") for f in functions)
    assert any(f.startswith("tvmfuse_depthwise_conv2d") for f in functions)
    missing = [f for f in functions if f"{f}_kernel" not in kernels]
    assert not missing, f"no __global__ kernel for {missing}"


def test_cuda_sm80_builds():
    cm = tvmfuse.compile("zoo:tiny_convnet", target="cuda-sm80")
    assert _global_kernels(cm)


@pytest.mark.gpu
def test_cuda_runs_on_gpu(cuda_sm90, tmp_path):
    from conftest import ort_run
    from tvmfuse import zoo

    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")}
    out = tvmfuse.load(cuda_sm90.export(tmp_path / "gpu.so")).run(x)[0]
    np.testing.assert_allclose(out, ort_run(zoo.get("tiny_convnet"), x)[0], rtol=1e-4, atol=1e-4)
