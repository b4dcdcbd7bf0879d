"""A bilinear resize of plain NCHW runs in two passes on x86 (``schedules/computes/resize.py``): the rows once per input
row, kept as a stage of their own, then the columns with whole-vector loads. Equal to onnxruntime for each
coordinate mode, up and down, whole and fractional ratios, alone and fused with a consumer; other resizes keep
TVM's compute."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse.schedules.computes import resize
from tvmfuse.schedules.x86 import generic

from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(3)


def _resize(src, dst, coord, mode="linear", then_add=False):
    sizes = numpy_helper.from_array(np.array([1, 3, *dst], np.int64), "sizes")
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["r" if then_add else "y"], mode=mode,
                              coordinate_transformation_mode=coord)]
    inits = [sizes]
    if then_add:
        inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "h"))
        nodes.append(helper.make_node("Add", ["r", "h"], ["y"]))
    model = make_model(nodes, [("x", [1, 3, *src])], [("y", None)], inits, opset=13)
    return model, {"x": RNG.standard_normal((1, 3, *src)).astype("float32")}


def _two_pass(cm) -> bool:
    return any(isinstance(f, tvm.tirx.PrimFunc) and f'"{resize.ROWS}"' in f.script()
               for _, f in cm.lowered.functions_items())


def _tvms(model, monkeypatch):
    """``model`` compiled with TVM's own resize."""
    with monkeypatch.context() as m:
        m.setattr(resize, "fits", lambda call: False)
        cm = tvmfuse.compile(model, target=HOST)
    assert not _two_pass(cm)
    return cm


@pytest.mark.parametrize("coord", resize.MODES)
@pytest.mark.parametrize("src, dst", [((20, 20), (160, 160)), ((7, 9), (19, 21)), ((32, 24), (12, 16))])
def test_two_pass_bilinear_is_tvms_resize_to_the_bit(coord, src, dst, monkeypatch):
    """The same expression per output as TVM's resize, so the same floats; both differ from onnxruntime's
    formula by up to 1.0e-5 here (align_corners 20 -> 160)."""
    model, x = _resize(src, dst, coord)
    cm = tvmfuse.compile(model, target=HOST)
    assert _two_pass(cm)
    got = cm.run(x)[0]
    np.testing.assert_array_equal(got, _tvms(model, monkeypatch).run(x)[0])
    np.testing.assert_allclose(got, ort_run(model, x)[0], rtol=1e-5, atol=2e-5)


def test_a_consumer_fused_into_the_resize_keeps_the_rows_stage(monkeypatch):
    model, x = _resize((10, 12), (40, 48), "half_pixel", then_add=True)
    cm = tvmfuse.compile(model, target=HOST)
    assert _two_pass(cm)
    np.testing.assert_array_equal(cm.run(x)[0], _tvms(model, monkeypatch).run(x)[0])


def test_nearest_keeps_tvms_resize():
    model, x = _resize((10, 12), (20, 24), "asymmetric", mode="nearest")
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=0, atol=0)
    assert not _two_pass(cm)


def test_the_generic_schedule_keeps_a_marked_stage():
    """Inlined, the rows would be recomputed for every output row: four gathers per output again."""
    data = tvm.te.placeholder((1, 4, 10, 12), name="x")
    func = tvm.te.create_prim_func([data, resize.resize_bilinear(data, 40, 48, "half_pixel")])
    sch = tvm.s_tir.Schedule(func)
    assert generic.schedule(sch, 16)
    script = sch.mod["main"].script()
    assert f'T.sblock("{resize.ROWS}")' in script and "T.vectorized(16)" in script
