"""CUDA builds reuse the device code nvcc made of the same source (tvmfuse.cache.cuda_binaries): a second
compile runs no nvcc and gives the same library; another architecture, a damaged entry or no cache compile.
The same model compiled again is a whole build from the cache, answered without TVM from the CLI, while nvcc
is the same."""

from __future__ import annotations

import shutil

import pytest
from helpers.cli_run import cli_run

import tvmfuse
from tvmfuse import cuda_driver, targets
from tvmfuse.cache import cuda_binaries, cuda_kernels
from tvmfuse.cache.store import Store

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
MODEL = "zoo:tiny_convnet"


@pytest.fixture
def nvcc_runs(monkeypatch):
    """The CUDA sources compiled from here on: whole by TVM's own callback, or kernel by kernel."""
    cuda_binaries._install()
    real, by_kernel, runs = cuda_binaries._INSTALLED["compile"], cuda_kernels.compile, []
    monkeypatch.setitem(cuda_binaries._INSTALLED, "compile", lambda code: runs.append(code) or real(code))

    def kernels(code, *args):
        binary = by_kernel(code, *args)
        if binary is not None:
            runs.append(code)
        return binary

    monkeypatch.setattr(cuda_kernels, "compile", kernels)
    return runs


def test_the_same_source_is_compiled_once(tmp_path, nvcc_runs):
    first = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path / "cache", whole=False)
    second = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path / "cache", whole=False)
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
    tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path, whole=False)  # kernels only: nvcc's output
    with targets.resolve("cuda-sm90").tvm_target():
        path = Store(tmp_path).path(cuda_binaries.key(nvcc_runs[0]))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.warns(UserWarning, match="damaged"):
        cm = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path, whole=False)
    # made again, from the kernels' stored PTX (cuda_kernels): ptxas only
    assert len(nvcc_runs) == 2 and cm.cache_info["from_cache"] == cm.cache_info["kernels"]
    assert tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path, whole=False).cache_info["from_cache"] > 0
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


def test_a_whole_cuda_build_is_reused_while_nvcc_is_the_same(tmp_path, nvcc_runs, monkeypatch):
    first = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path)
    second = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path)
    assert (first.cache_info["model"], second.cache_info["model"]) == ("miss", "hit")
    assert second.library_bytes() == first.library_bytes() and len(nvcc_runs) == 1
    assert second.manifest()["cuda_code"] == "binary"
    second.export(tmp_path / "m.so")
    assert (tmp_path / "m.so").read_bytes() == first.library_bytes()
    monkeypatch.setattr(cuda_driver, "nvcc_version", lambda: "Cuda compilation tools, release 99.0")
    assert tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path).cache_info["model"] == "miss"


def test_a_recorded_cuda_build_is_exported_without_tvm_until_nvcc_changes(tmp_path):
    args = ["compile", MODEL, "--target", "cuda-sm90", "-q"]
    assert "TVM True" in cli_run(args + ["-o", str(tmp_path / "a.so")], tmp_path / "c")
    assert "TVM False" in cli_run(args + ["-o", str(tmp_path / "b.so")], tmp_path / "c")
    assert (tmp_path / "a.so").read_bytes() == (tmp_path / "b.so").read_bytes()
    # Another nvcc (here: another PTX register setting TVM's callback reads) is another build
    again = cli_run(args + ["-o", str(tmp_path / "c.so")], tmp_path / "c", TVM_CUDA_PTXAS_REG_LEVEL="5")
    assert "TVM True" in again


def test_a_build_that_kept_its_kernels_as_source_is_not_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_driver, "cuda_codegen_ready", lambda: False)
    with pytest.warns(UserWarning, match="kept as source"):
        first = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path)
    assert first.manifest()["cuda_code"] == "source"
    monkeypatch.undo()
    second = tvmfuse.compile(MODEL, target="cuda-sm90", cache=tmp_path)
    assert second.cache_info["model"] == "miss" and second.manifest()["cuda_code"] == "binary"
