"""Whole models on CUDA: every partition of every zoo model is scheduled by a tvmfuse CUDA rule for both
CUDA targets (nvcc builds the sm90 libraries), and of every corpus model when the corpus is cached; on a GPU
(marker ``gpu``) each zoo model matches onnxruntime."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import tvmfuse
from tvmfuse import corpus, zoo

from helpers import ort_run
from helpers.cuda_source import SM80_MODELS, guarded_partial_sums, zoo_builds

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

# Kernels outside every partition stay with dlight; a partition must be on a tvmfuse rule.
PARTITION_PREFIX = "tvmfuse_"


def _check(scheduled_by: dict) -> None:
    rules = {k: v for k, v in scheduled_by.items() if k.startswith(PARTITION_PREFIX)}
    assert rules, "no partition kernel"
    off = {k: v for k, v in rules.items() if not v.startswith("tvmfuse.cuda.")}
    assert not off, f"partitions not on a tvmfuse CUDA rule: {off}"


def _scheduled_by(model, target: str, shapes, precision: str = "fp32") -> dict:
    """Who schedules each kernel, from the Relax pipeline alone (what compile runs before nvcc)."""
    import tvm

    from tvmfuse import frontend, targets
    from tvmfuse.export import kernel_schedulers
    from tvmfuse.passes.pipeline import relax_pipeline, run_graph_passes

    spec = targets.resolve(target)
    tvm_target = spec.tvm_target()
    mod = run_graph_passes(frontend.import_model(model, shapes).mod, spec, tvm_target, precision=precision)
    with tvm_target, tvm.transform.PassContext(opt_level=3):
        return kernel_schedulers(relax_pipeline(spec, tvm_target)(mod))


def test_guarded_partial_sum_is_detected():
    head = 'extern "C" __global__ void __launch_bounds__(128) k_kernel(float* p) {\n'
    bad = head + ("  if (((int)threadIdx.x) < 24) {\n    acc_rf_ptr[0] = 0x0p+0f/*0.000000e+00*/;\n  }\n"
                  "  red_buf0_ptr[0] = acc_rf_ptr[0];\n")
    fine = head + ("  if (((int)threadIdx.y) < 5) {\n    acc_rf_ptr[0] = 0x0p+0f/*0.000000e+00*/;\n  }\n"
                   "  in_thread_ptr[0] = 0x0p+0f;\n  red_buf0_ptr[0] = in_thread_ptr[0];\n")
    assert guarded_partial_sums(bad) == ["k_kernel"] and guarded_partial_sums(fine) == []


@pytest.mark.parametrize("name", zoo_builds())
def test_zoo_builds_for_sm90_with_partitions_on_tvmfuse_rules(name):
    cm = tvmfuse.compile(zoo.get(name), target="cuda-sm90", shapes=zoo.default_shapes(name))
    _check(cm.manifest()["scheduled_by"])
    assert cm.manifest()["cuda_code"] == "binary"  # nvcc built every kernel
    assert guarded_partial_sums(cm.executable.mod.imports[0].imports[0].inspect_source()) == []


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", SM80_MODELS)
def test_zoo_partitions_on_tvmfuse_rules_for_sm80(name, precision):
    # The same rules with the A100's SM count (tile and grid choices differ); nvcc is exercised on sm90 above.
    _check(_scheduled_by(zoo.get(name), "cuda-sm80", zoo.default_shapes(name), precision))


@pytest.mark.parametrize("name", zoo.names())
def test_fp16_zoo_partitions_on_tvmfuse_rules(name):
    """fp16 kernels (float16 operands, float32 accumulators) take the same rules; nvcc builds them in
    tests/test_precision.py."""
    _check(_scheduled_by(zoo.get(name), "cuda-sm90", zoo.default_shapes(name), precision="fp16"))


def _cached_corpus() -> list:
    cached = [pytest.param(m, id=m.name) for m in corpus.MODELS if corpus.local_path(m).exists()]
    return cached or [pytest.param(None, marks=pytest.mark.skip(reason="no corpus model cached (bench/real_models.py "
                                                                        "fetches them)"))]


@pytest.mark.slow  # 40 cases, 95 s on 2 cores; run only where the corpus is cached, so CI's time would hang on that
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("model", _cached_corpus())
def test_corpus_partitions_on_tvmfuse_rules(model, precision):
    _check(_scheduled_by(str(corpus.prepared(model)), "cuda-sm90", model.shapes, precision))


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
