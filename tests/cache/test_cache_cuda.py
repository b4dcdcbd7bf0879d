"""CUDA builds reuse the device code nvcc made of the same source (tvmfuse.cache.cuda_binaries): a second
compile runs no nvcc and gives the same library; another architecture, a damaged entry or no cache compile."""

from __future__ import annotations

import shutil

import pytest

import tvmfuse
from tvmfuse import targets
from tvmfuse.cache import cuda_binaries
from tvmfuse.cache.store import Store

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
MODEL = "zoo:tiny_convnet"


@pytest.fixture
def nvcc_runs(monkeypatch):
    """The CUDA sources TVM's own callback (nvcc) compiles from here on."""
    cuda_binaries._install()
    real, runs = cuda_binaries._INSTALLED["compile"], []
    monkeypatch.setitem(cuda_binaries._INSTALLED, "compile", lambda code: runs.append(code) or real(code))
    return runs


def test_the_same_source_is_compiled_once(tmp_path, nvcc_runs):
    first = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path / "cache")
    second = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path / "cache")
    assert len(nvcc_runs) == 1
    assert first.cache_info["from_cache"] == 0 < first.cache_info["kernels"]
    assert second.cache_info["from_cache"] == second.cache_info["kernels"] == first.cache_info["kernels"]
    assert first.manifest()["cuda_code"] == second.manifest()["cuda_code"] == "binary"
    first.export(tmp_path / "a.so")
    second.export(tmp_path / "b.so")
    assert (tmp_path / "a.so").read_bytes() == (tmp_path / "b.so").read_bytes()
    tvmfuse.compile(MODEL, target="cuda-sm80", cache=tmp_path / "cache")  # another architecture: another key
    tvmfuse.compile(MODEL, target="cuda-sm90", cache=False)
    assert len(nvcc_runs) == 3


def test_a_damaged_entry_is_compiled_again_with_a_warning(tmp_path, nvcc_runs):
    tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path)
    with targets.resolve("cuda-sm90").tvm_target():
        path = Store(tmp_path).path(cuda_binaries.key(nvcc_runs[0]))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.warns(UserWarning, match="damaged"):
        cm = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path)
    assert len(nvcc_runs) == 2 and cm.cache_info["from_cache"] == 0
    assert tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path).cache_info["from_cache"] > 0
    assert len(nvcc_runs) == 2


def test_the_key_follows_the_compiler_settings(monkeypatch):
    code = 'extern "C" __global__ void k() {}'
    with targets.resolve("cuda-sm90").tvm_target():
        plain = cuda_binaries.key(code)
        monkeypatch.setenv("TVM_CUDA_PTXAS_EXTRA_OPTS", "-O1")
        assert cuda_binaries.key(code) != plain
        monkeypatch.delenv("TVM_CUDA_PTXAS_EXTRA_OPTS")
        assert cuda_binaries.key(code) == plain != cuda_binaries.key(code + "\n")
    with targets.resolve("cuda-sm80").tvm_target():
        assert cuda_binaries.key(code) != plain
