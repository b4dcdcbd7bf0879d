"""tvmfuse's FoldConstant: the module TVM's FoldConstant returns, without legalizing calls that cannot fold."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvmfuse import frontend, targets
from tvmfuse.passes import pipeline
from tvmfuse.passes.fold_constant import FoldConstant

from helpers import HOST


def _both(mod):
    with tvm.target.Target("llvm"), tvm.transform.PassContext(opt_level=3):
        return relax.transform.FoldConstant()(mod), FoldConstant(mod)


def _module(body_builder) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body_builder(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def test_nothing_to_fold_is_left_as_tvm_leaves_it_without_legalizing(monkeypatch):
    def body(bb, x):
        y = bb.emit(relax.op.nn.relu(x))
        bb.emit(relax.op.exp(x))  # unused: removed, as TVM's pass removes it
        return relax.op.add(y, relax.const(np.ones((2, 3), "float32")))

    mod = _module(body)
    expected, _ = _both(mod)
    legalized = []
    real = relax.transform.FoldConstant
    monkeypatch.setattr(relax.transform, "FoldConstant", lambda: legalized.append(1) or real())
    with tvm.transform.PassContext(opt_level=3):
        got = FoldConstant(mod)
    assert not legalized
    assert tvm_ffi.structural_equal(expected, got)
    assert "exp" not in got.script()


def test_a_variable_bound_to_a_constant_is_substituted():
    c = relax.const(np.full((2, 3), 2.0, "float32"))

    def body(bb, x):
        bound = bb.emit(c)
        return relax.op.multiply(x, bound)

    expected, got = _both(_module(body))
    assert tvm_ffi.structural_equal(expected, got)
    call = got["main"].body.blocks[0].bindings[-1].value
    assert isinstance(call.args[1], tvm.ir.expr.Constant)


def test_calls_on_constants_are_folded_by_tvm():
    a = relax.const(np.arange(6, dtype="float32").reshape(2, 3))

    def body(bb, x):
        folded = bb.emit(relax.op.add(a, a))
        return relax.op.add(x, relax.op.exp(folded))

    expected, got = _both(_module(body))
    assert tvm_ffi.structural_equal(expected, got)
    assert "R.exp" not in got.script()


def test_broadcast_and_reshape_of_a_constant_fold_in_numpy(monkeypatch):
    """What TVM's ONNX Min/Max of a tensor and a constant write: folded without building a kernel, to the
    constants TVM's pass gives."""
    zero = relax.const(np.float32(0.5))

    def body(bb, x):
        wide = bb.emit(relax.op.broadcast_to(zero, (2, 3)))
        flat = bb.emit(relax.op.reshape(wide, (3, 2)))
        return relax.op.add(x, relax.op.reshape(flat, (2, 3)))

    mod = _module(body)
    expected, _ = _both(mod)
    built = []
    real = relax.transform.FoldConstant
    monkeypatch.setattr(relax.transform, "FoldConstant", lambda: built.append(1) or real())
    with tvm.target.Target("llvm"), tvm.transform.PassContext(opt_level=3):
        got = FoldConstant(mod)
    assert not built
    assert tvm_ffi.structural_equal(expected, got)


def test_a_like_op_goes_to_tvm_which_folds_it_for_any_input():
    expected, got = _both(_module(lambda bb, x: relax.op.add(x, relax.op.zeros_like(x))))
    assert tvm_ffi.structural_equal(expected, got)
    assert "zeros_like" not in got.script()


@pytest.mark.parametrize("model", ["zoo:mobilenet_v2", "zoo:crnn", "zoo:tiny_convnet"])
def test_the_canonical_passes_give_tvms_module_on_the_zoo(model):
    """At both places of the canonical passes, on a graph with nothing to fold (MobileNetV2) and one whose
    LSTM has constant subexpressions (the CRNN)."""
    spec = targets.resolve(HOST)
    mod = frontend.import_model(model).mod
    checked = 0
    with spec.tvm_target(), tvm.transform.PassContext(opt_level=3):
        for p in pipeline.canonicalize_passes(spec, {}, True, False):
            if p.info.name == "tvmfuse.FoldConstant":
                assert tvm_ffi.structural_equal(relax.transform.FoldConstant()(mod), FoldConstant(mod))
                checked += 1
            mod = p(mod)
    assert checked == 2
