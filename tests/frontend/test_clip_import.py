"""Clip with constant bounds imported straight as ``R.clip`` / ``R.nn.relu`` (``frontend/clip.py``): the module
after the canonical passes is the one TVM's converter and ``CanonicalizeClip`` make, and the rest falls back."""

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper

from tvmfuse import frontend
from tvmfuse.frontend import clip
from tvmfuse.passes.pipeline import canonicalize_passes
from tvmfuse.passes.utils import called_ops

from helpers import make_model


def _clip_model(lo, hi, before=None, opset=17, bounds_as_nodes=False):
    """x -> [before] -> Clip(lo, hi) -> Conv 1x1 (so the clip is an activation a partition could take)."""
    nodes, inits, names = [], [], []
    last = "x"
    if before:
        nodes.append(helper.make_node(before, ["x"], ["b"]))
        last = "b"
    for name, value in (("lo", lo), ("hi", hi)):
        if value is None:
            names.append("")
            continue
        arr = np.array(value, dtype=np.float32)
        if bounds_as_nodes:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name + "_v")))
        else:
            inits.append(numpy_helper.from_array(arr, name))
        names.append(name)
    while names and names[-1] == "":
        names.pop()
    nodes.append(helper.make_node("Clip", [last, *names], ["c"]))
    w = np.random.default_rng(0).standard_normal((4, 4, 1, 1)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, "w"))
    nodes.append(helper.make_node("Conv", ["c", "w"], ["y"]))
    return make_model(nodes, [("x", [1, 4, 5, 5])], [("y", None)], inits, opset=opset)


def _canonical(model, monkeypatch, direct: bool):
    if not direct:
        from tvm.relax.frontend.onnx import onnx_frontend

        monkeypatch.setattr(clip, "converter", lambda: onnx_frontend.Clip)
    with tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(canonicalize_passes())(frontend.import_model(model).mod)


@pytest.mark.parametrize("lo, hi, before", [
    (0.0, 6.0, None),  # relu6
    (-1.5, 2.25, None),
    (0.0, None, None),  # a relu
    (-3.0, None, None),
    (None, 6.0, "Relu"),  # an upper bound alone: TVM's converter, and the rewrite merges it with the relu
    (float("nan"), 6.0, None),  # a NaN bound: no bound, as TVM's converter says
    (0.0, float("inf"), None),
    (2.0, 1.0, None),  # lower above upper: ONNX's output is the upper bound
    (0.0, -1.0, None),
])
def test_the_module_is_the_one_the_rewrite_makes(lo, hi, before, monkeypatch):
    model = _clip_model(lo, hi, before)
    direct = _canonical(model, monkeypatch, True)
    monkeypatch.undo()
    tvm.ir.assert_structural_equal(direct, _canonical(model, monkeypatch, False))


def test_bounds_from_constant_nodes_and_zoo_models_import_as_before(monkeypatch):
    for model in (_clip_model(0.0, 6.0, bounds_as_nodes=True), "zoo:mobilenet_v2", "zoo:efficientnet_lite0"):
        direct = _canonical(model, monkeypatch, True)
        monkeypatch.undo()
        tvm.ir.assert_structural_equal(direct, _canonical(model, monkeypatch, False))


def test_the_direct_form_makes_no_kernels_and_the_fallback_does(monkeypatch):
    made = []
    real = tvm.relax.BlockBuilder.emit_te
    monkeypatch.setattr(tvm.relax.BlockBuilder, "emit_te",
                        lambda self, *a, **k: made.append(a[0]) or real(self, *a, **k))
    mod = frontend.import_model(_clip_model(0.0, 6.0)).mod
    assert made == [] and "relax.clip" in called_ops(mod)
    frontend.import_model(_clip_model(None, 6.0))  # an upper bound alone: TVM's two-kernel form
    assert len(made) == 1


def test_clip_before_opset_11_takes_attributes_as_before(monkeypatch):
    nodes = [helper.make_node("Clip", ["x"], ["y"], min=0.0, max=6.0)]
    model = make_model(nodes, [("x", [1, 4, 5, 5])], [("y", None)], opset=6)
    direct = _canonical(model, monkeypatch, True)
    monkeypatch.undo()
    tvm.ir.assert_structural_equal(direct, _canonical(model, monkeypatch, False))


@pytest.mark.parametrize("lo, hi", [(-1.5, 2.25), (2.0, 1.0), (0.0, -1.0), (0.0, None)])
def test_the_numbers_are_onnxruntimes(lo, hi):
    import tvmfuse
    from helpers import ort_run

    model = _clip_model(lo, hi)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 4, 5, 5)).astype(np.float32) * 3}
    got = tvmfuse.compile(model, "x86-host", cache=False).run(feeds)[0]
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)
