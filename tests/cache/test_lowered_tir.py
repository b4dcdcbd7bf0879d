"""CUDA kernels through TVM's TIR pipeline reused one by one (tvmfuse.cache.lowered_tir): a second compile runs
the pipeline on no kernel and builds TVM's library byte for byte, with every kernel in one device module."""

from __future__ import annotations

import shutil

import pytest

import tvmfuse
from tvmfuse.cache import lowered_tir

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
MODEL, TARGET = "zoo:tiny_convnet", "cuda-sm90"


def _device_modules(cm) -> int:
    def walk(mod):
        return sum((i.kind == "cuda") + walk(i) for i in mod.imports)

    return walk(cm.executable.mod)


def test_a_second_compile_runs_the_pipeline_on_no_kernel(tmp_path, monkeypatch):
    real, runs = lowered_tir._run, []

    def spy(kernels, missing, inner, attrs):
        runs.append(sorted(gv.name_hint for gv, _ in missing))
        return real(kernels, missing, inner, attrs)

    monkeypatch.setattr(lowered_tir, "_run", spy)
    first = tvmfuse.compile(MODEL, target=TARGET, cache=tmp_path, whole=False)
    assert len(runs) == 1 and len(runs[0]) == first.cache_info["kernels"]
    second = tvmfuse.compile(MODEL, target=TARGET, cache=tmp_path, whole=False)
    plain = tvmfuse.compile(MODEL, target=TARGET, cache=False)
    assert len(runs) == 1  # every kernel's lowered TIR from the cache
    # a stored kernel's target is the build's again (TVM's JSON drops its host): one device module, TVM's bytes
    assert _device_modules(second) == _device_modules(plain) == 1
    assert second.library_bytes() == first.library_bytes() == plain.library_bytes()


def test_a_module_of_one_kernel_is_not_cached():
    """TVM's AnnotateEntryFunc makes a module's only function its entry: such a result is not any kernel's."""
    import tvm
    from tvm import tirx

    func = tirx.PrimFunc([], tirx.Evaluate(0))
    mod = tvm.IRModule({tvm.ir.GlobalVar("k"): func})
    assert lowered_tir._cached(mod, None, object(), "default") is None
