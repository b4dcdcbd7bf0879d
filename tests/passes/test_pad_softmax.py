"""PadSoftmaxRows: a Softmax over a dense's columns runs over rows padded to whole vectors (zero weight
columns, a -inf bias), the padding sliced off after it; the row kernel stores the kept columns in whole
vectors up to the last partial one. Equal to onnxruntime; left alone where the logits have another reader,
the row is narrow or already whole vectors, and in INT8 graphs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

import tvmfuse
from tvmfuse import frontend
from tvmfuse.passes.pad_softmax import PadSoftmaxRows
from tvmfuse.passes.pipeline import canonicalize_passes
from tvmfuse.passes.utils import bindings_of, const_array
from tvmfuse.schedules.computes.softmax import softmax
from tvmfuse.schedules.x86 import softmax as softmax_rule
from tvmfuse.schedules.x86 import templates
from tvmfuse.passes.kernel_names import kind

from helpers import HOST, ort_run, recognizer_head

RNG = np.random.default_rng(11)


def _head(n, rows=40, k=48, bias=True, three_d=True, logits_out=False):
    """x[1, rows, k] (or [rows, k]) @ W[k, n] (+ B) -> Softmax(-1), as recognizer heads are exported."""
    shape = [1, rows, k] if three_d else [rows, k]
    model = recognizer_head(shape, n, RNG, bias, logits_out)
    return model, {"x": RNG.standard_normal(shape).astype("float32")}


def _softmax_widths(cm) -> list[int]:
    """The row width of every Softmax kernel's input."""
    return [int(f.params[0].shape[-1])
            for gv, f in cm.lowered.functions_items() if "softmax" in gv.name_hint]


@pytest.mark.parametrize("n, bias, three_d", [(6906, True, True), (6625, False, True), (18385, True, False),
                                              (97, True, True)])
def test_a_head_softmax_runs_over_whole_vectors_and_equals_onnxruntime(n, bias, three_d):
    """6906 and 18385 are padded by PadDenseColumns too (their slice moves after the Softmax); 6625 keeps its
    dense (25-column blocks) and gets the padding here."""
    model, x = _head(n, bias=bias, three_d=three_d)
    cm = tvmfuse.compile(model, target=HOST)
    got, want = cm.run(x)[0], ort_run(model, x)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert _softmax_widths(cm) == [-(-n // 16) * 16]
    main = cm.lowered["main"].script()
    called = [gv.name_hint for gv, f in cm.lowered.functions_items()
              if isinstance(f, tvm.tirx.PrimFunc) and re.search(rf"\b{gv.name_hint}\(", main)]
    # it writes the output: no copy
    assert sorted(map(kind, called)) == ["fused_softmax_strided_slice", "tvmfuse_dense"]


@pytest.mark.parametrize("n", [6912, 1000, 40])
def test_whole_vector_and_narrow_rows_are_left_alone(n):
    """1000 takes 8-lane vectors: its dense and tuning records stay; 40 is too narrow to pay."""
    model, x = _head(n)
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-7)
    assert _softmax_widths(cm) == [n]


def test_logits_with_another_reader_are_left_alone():
    model, x = _head(6625, logits_out=True)
    cm = tvmfuse.compile(model, target=HOST)
    for got, want in zip(cm.run(x), ort_run(model, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _softmax_widths(cm) == [6625]


def _canonical(model, int8):
    mod = frontend.import_model(model).mod
    return tvm.transform.Sequential(canonicalize_passes(int8=int8))(mod)


def test_int8_graphs_keep_their_rows_and_float_graphs_get_the_minus_inf_bias():
    """An INT8 dense's bias is quantized to int32 codes, where -inf has none, and calibration would see it."""
    model, _ = _head(6625)
    assert "PadSoftmaxRows" not in [p.info.name for p in canonicalize_passes(int8=True)]
    assert "PadSoftmaxRows" in [p.info.name for p in canonicalize_passes()]
    biases = [c for c in _constants(_canonical(model, int8=False)) if c.ndim == 1]
    assert any(b.shape == (6640,) and np.isneginf(b[6625:]).all() and np.isfinite(b[:6625]).all() for b in biases)
    assert not any(np.isinf(c).any() for c in _constants(_canonical(model, int8=True)))


def _constants(mod):
    return [const_array(arg) for b in bindings_of(mod["main"]) for arg in getattr(b.value, "args", ())
            if const_array(arg) is not None]


def test_the_pass_keeps_the_softmax_axis_and_the_output_shape():
    model, _ = _head(6906)
    mod = _canonical(model, int8=False)
    assert [int(d) for d in mod["main"].ret_ty.shape] == [1, 40, 6906]
    again = PadSoftmaxRows(mod)  # a second run finds the padded row whole and changes nothing
    tvm.ir.assert_structural_equal(again, mod)


def test_the_row_kernel_stores_a_sliced_output_in_whole_vectors():
    """Softmax over 6912 columns with a slice to 6906 inlined into its output: the output loop's whole steps
    are a vectorized loop of their own (431 of 16 lanes), the last partial step scalar."""
    lanes = 16
    x = te.placeholder((4, 6912), name="x")
    y = softmax(x, annotations=templates.marks("softmax"))
    sliced = te.compute((4, 6906), lambda i, j: y[i, j], name="T_strided_slice")
    sch = s_tir.Schedule(te.create_prim_func([x, sliced]))
    assert softmax_rule.schedule(sch, lanes)
    script = sch.mod["main"].script()
    step = r"for \w+ in range\((\d+)\):\n\s+for \w+ in T.vectorized\(16\):\n\s+with T.sblock\(\"(\w+)\""
    whole = re.findall(step, script)
    assert ("432", "T_fast_exp") in whole  # the exponentials
    assert ("431", "softmax_norm_i1_00") in whole  # the kept output's whole steps, a loop of their own
    lib = tvm.compile(sch.mod, target="llvm")
    data = (RNG.standard_normal((4, 6912)) * 4).astype("float32")
    out = tvm.runtime.tensor(np.zeros((4, 6906), "float32"))
    lib["main"](tvm.runtime.tensor(data), out)
    e = np.exp(data - data.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), (e / e.sum(axis=1, keepdims=True))[:, :6906], rtol=1e-5, atol=1e-8)


def test_a_quantized_head_keeps_its_rows():
    """Calibration and QuantizeGraph run without the pass: the INT8 dense's bias has no code for -inf."""
    model, x = _head(6906)
    calib = [{"x": RNG.standard_normal((1, 40, 48)).astype("float32")} for _ in range(2)]
    cm = tvmfuse.quantize(model, calib=calib, method="minmax", target=HOST)
    assert _softmax_widths(cm) == [6906]
    got, want = cm.run(x)[0], ort_run(model, x)[0]
    assert np.isfinite(got).all() and np.abs(got.sum(-1) - 1).max() < 1e-5
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.9
