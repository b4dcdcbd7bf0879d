"""Softmax on x86 (schedules/computes/softmax.py + schedules/x86/softmax.py): one row per parallel task, each
exponential computed once and each row scaled by one reciprocal; close to float64 numpy and to
onnxruntime; what the rule leaves to the generic schedule."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper
from tvm import te, topi
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.computes.softmax import softmax
from tvmfuse.schedules.x86 import softmax as rule

from helpers import HOST, make_model, ort_run

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32
RTOL = 1e-5  # fast_exp: at most 4.1e-6 relative error, then one sum and one reciprocal


def _scheduled(shape, axis=-1, before=None):
    x = te.placeholder(shape, name="x")
    y = before(x) if before is not None else x
    func = te.create_prim_func([x, softmax(y, axis)])
    sch = rule.scheduled(func, LANES)
    return sch, sch is not None


def _run(func, x):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros_like(x))]
    lib["main"](*args)
    return args[-1].numpy()


def _reference(x, axis=-1):
    x = x.astype("float64")
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _loops(sch, name):
    return [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(name))]


@pytest.mark.parametrize("shape", [(40, 6912), (8, 470), (2, 3, 80), (64, 8), (5, 97)])
def test_rows_match_float64_numpy(shape):
    sch, applied = _scheduled(shape)
    assert applied
    x = (np.random.default_rng(0).standard_normal(shape) * 8).astype("float32")
    np.testing.assert_allclose(_run(sch.mod["main"], x), _reference(x), rtol=RTOL, atol=1e-9)


def test_one_parallel_row_loop_holds_every_pass():
    sch, _ = _scheduled((40, 6912))
    rows = [_loops(sch, name)[0] for name in ("softmax_max", "T_fast_exp", "softmax_sum", "softmax_norm")]
    assert all(loop.same_as(rows[0]) for loop in rows)
    assert rows[0].kind == ForKind.PARALLEL and int(rows[0].extent) == 40
    for name in ("T_fast_exp", "softmax_norm", "softmax_max_rf", "softmax_sum_rf_update"):
        inner = _loops(sch, name)[-1]
        assert inner.kind == ForKind.VECTORIZED and int(inner.extent) == LANES, name
    # each vector of exponentials is added to the sum's partials in the loop that stores it (no pass of its own)
    assert _loops(sch, "softmax_sum_rf_update")[-2].same_as(_loops(sch, "T_fast_exp")[-2])


def test_each_exponential_is_computed_once_and_rows_multiply_by_a_reciprocal():
    sch, _ = _scheduled((40, 6912))
    assert sch.mod["main"].script().count("T.reinterpret") == 1  # fast_exp's 2**n: in T_fast_exp alone
    assert isinstance(sch.get(sch.get_sblock("softmax_norm")).body.value, tvm.tirx.Mul)


def test_a_row_no_vector_divides_uses_its_largest_divisor():
    sch, _ = _scheduled((8, 470))  # 470 = 2 x 5 x 47: 10 lanes of AVX-512's 16, 5 of AVX2's 8
    assert int(_loops(sch, "softmax_norm")[-1].extent) == max(d for d in range(1, LANES + 1) if 470 % d == 0)
    sch, _ = _scheduled((5, 97))  # prime: nothing vectorized, still one row per task
    assert ForKind.VECTORIZED not in [loop.kind for loop in _loops(sch, "softmax_norm")]


def test_small_softmax_stays_on_one_core():
    sch, _ = _scheduled((4, 16))
    assert ForKind.PARALLEL not in [loop.kind for loop in _loops(sch, "softmax_norm")]


def test_a_scale_before_it_is_inlined():
    sch, applied = _scheduled((12, 64), before=lambda x: topi.multiply(x, 0.125))
    assert applied and "T_multiply" not in sch.mod["main"].script()
    x = np.random.default_rng(1).standard_normal((12, 64)).astype("float32")
    np.testing.assert_allclose(_run(sch.mod["main"], x), _reference(x * 0.125), rtol=RTOL, atol=1e-9)


def test_other_axes_and_other_kernels_are_left_alone():
    assert not _scheduled((6, 32, 4), axis=1)[1]
    assert not _scheduled((1000,))[1]  # one row: the generic schedule splits it over the cores
    x = te.placeholder((8, 64), name="x")
    assert rule.scheduled(te.create_prim_func([x, topi.nn.fast_softmax(x, axis=-1)]), LANES) is None  # topi's


@pytest.mark.parametrize("axis", [-1, 1])
def test_compiled_softmax_matches_onnxruntime(axis):
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [("x", [4, 16, 96])], [("y", None)])
    x = {"x": (np.random.default_rng(2).standard_normal((4, 16, 96)) * 8).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=RTOL, atol=1e-7)
    (func,) = [f for gv, f in cm.lowered.functions.items() if gv.name_hint.startswith("softmax")]
    text = func.script()
    assert "T.parallel(" in text and "T.vectorized(" in text
    # The last axis gets this rule (64 parallel rows); axis 1 the generic schedule: max, sum and output apart.
    assert text.count("T.parallel(") == (1 if axis == -1 else 3)
