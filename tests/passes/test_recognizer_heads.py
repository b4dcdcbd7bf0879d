"""Recognizer heads (dense + Softmax over thousands of classes). PadDenseColumns: a head with 18,385 classes runs
on whole-vector column blocks (weight and bias padded, the extra columns sliced off) and still equals
onnxruntime; counts with a vector-wide block stay. Softmax on x86 is the vectorizable fast_softmax."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import tvmfuse
from helpers import HOST, make_model, ort_run, recognizer_head
from tvmfuse.passes.pad_dense import needs_padding

RNG = np.random.default_rng(5)


def _head(m, k, n, bias=True):
    return recognizer_head((m, k), n, RNG, bias)


def _dense_widths(cm) -> list[int]:
    return [int(fn.params[1].ty.shape[1]) for name, (fn, _) in cm.record.kernels.items()
            if name.startswith("tvmfuse_dense")]


@pytest.mark.parametrize("bias", [True, False])
def test_a_head_without_small_divisors_is_padded_and_exact(bias):
    model = _head(40, 120, 18385, bias)
    x = {"x": RNG.standard_normal((40, 120)).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    got, want = cm.run(x)[0], ort_run(model, x)[0]
    assert got.shape == want.shape == (40, 18385)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert _dense_widths(cm) == [18400]
    ops = [fn.body.blocks[0].bindings[-1].value.op.name for fn, _ in cm.record.kernels.values()]
    assert ops == ["relax.add"]  # the bias stays inside the dense kernel; without one, PadSoftmaxRows's -inf


def test_counts_with_a_vector_wide_block_are_left_alone():
    assert not needs_padding(1000) and not needs_padding(360) and not needs_padding(7)
    assert needs_padding(18385) and needs_padding(3677) and needs_padding(97)
    assert not needs_padding(6625)  # 25-column blocks: one whole vector and more
    model = _head(1, 64, 1000)
    cm = tvmfuse.compile(model, target=HOST)
    assert _dense_widths(cm) == [1000]


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax_runs_the_vectorizable_fast_softmax_within_its_stated_error(axis):
    """x86 legalizes Softmax with schedules/computes/softmax.py (fast_exp: at most 4.1e-6 relative error)."""
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [("x", [3, 7, 40])], [("y", None)])
    x = {"x": (RNG.standard_normal((3, 7, 40)) * 8).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    got, want = cm.run(x)[0], ort_run(model, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert any(gv.name_hint.startswith("softmax") for gv in cm.lowered.functions)
