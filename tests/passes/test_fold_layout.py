"""FoldConstantLayouts: reshapes and transposes of constants are folded in numpy, so TVM's FoldConstant builds
nothing with LLVM for them (a Paddle export's per-conv bias reshapes cost ~70 ms each), and the model's
outputs are unchanged."""

from __future__ import annotations

import importlib

import numpy as np
import tvm
from onnx import helper, numpy_helper

import tvmfuse
from helpers import make_model, ort_run
from tvmfuse import frontend, targets
from tvmfuse.passes.fold_layout import FoldConstantLayouts
from tvmfuse.passes.pipeline import run_graph_passes


def _paddle_like():
    """Convs whose bias is an initializer reshaped to [1, C, 1, 1] by a Reshape node (as Paddle exports), a MatMul
    on a transposed constant, and an Unsqueeze/Squeeze pair on a constant scale."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, (cin, cout) in enumerate([(3, 8), (8, 8), (8, 4)]):
        inits += [numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype("float32"), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(cout).astype("float32"), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Reshape", [f"b{i}", "bias_shape"], [f"rb{i}"]),
                  helper.make_node("Add", [f"c{i}", f"rb{i}"], [f"a{i}"]), helper.make_node("Relu", [f"a{i}"], [f"r{i}"])]
        x = f"r{i}"
    inits += [numpy_helper.from_array(np.array([1, -1, 1, 1], np.int64), "bias_shape"),
              numpy_helper.from_array((rng.standard_normal((10, 4 * 6 * 6)) * 0.1).astype("float32"), "m"),
              numpy_helper.from_array(np.array([2.0], np.float32), "s"),
              numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    nodes += [helper.make_node("Flatten", [x], ["f"]), helper.make_node("Transpose", ["m"], ["mt"], perm=[1, 0]),
              helper.make_node("MatMul", ["f", "mt"], ["mm"]), helper.make_node("Unsqueeze", ["s", "axis0"], ["s2"]),
              helper.make_node("Squeeze", ["s2", "axis0"], ["s1"]), helper.make_node("Mul", ["mm", "s1"], ["y"])]
    return make_model(nodes, [("x", [1, 3, 6, 6])], [("y", None)], inits)


def test_no_llvm_build_while_canonicalizing_and_the_same_outputs(monkeypatch):
    build = importlib.import_module("tvm.tirx.build")
    calls = []
    original = build.codegen_build
    monkeypatch.setattr(build, "codegen_build", lambda *a, **k: calls.append(1) or original(*a, **k))
    spec = targets.resolve("x86-host")
    model = _paddle_like()
    run_graph_passes(frontend.import_model(model).mod, spec, spec.tvm_target())
    assert calls == []  # the reshapes were folded without building anything
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 6, 6)).astype("float32")}
    np.testing.assert_allclose(tvmfuse.compile(model, target="x86-host").run(x)[0], ort_run(model, x)[0],
                               rtol=1e-5, atol=1e-5)


def test_every_layout_op_of_a_constant_is_folded_exactly():
    from tvm import relax

    value = np.arange(24, dtype="float32").reshape(2, 3, 4)
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        c = relax.const(value)
        outs = [bb.emit(relax.op.reshape(c, (4, 6))), bb.emit(relax.op.permute_dims(c, [2, 0, 1])),
                bb.emit(relax.op.permute_dims(c)), bb.emit(relax.op.expand_dims(c, 1)),
                bb.emit(relax.op.squeeze(relax.op.expand_dims(c, 0), [0])), bb.emit(relax.op.flatten(c))]
        bb.emit_func_output(relax.Tuple(outs))
    mod = FoldConstantLayouts(relax.transform.Normalize()(bb.get()))
    fields = mod["main"].body.body.fields
    bindings = {b.var: b.value for block in mod["main"].body.blocks for b in block.bindings}
    got = [bindings.get(f, f) for f in fields]
    assert all(isinstance(g, tvm.ir.expr.Constant) for g in got), got
    want = [value.reshape(4, 6), value.transpose(2, 0, 1), value.transpose(2, 1, 0), value[:, None],
            value, value.reshape(-1)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.value.numpy(), w)


def _gathers(indices):
    """Rows of an activation picked by Gather with constant indices (a recurrence spelt out per step reads its
    time steps so): TVM's importer checks each index for being negative with shape and integer ops."""
    nodes, inits, outs = [helper.make_node("Relu", ["x"], ["r"])], [], []
    for i, index in enumerate(indices):
        inits.append(numpy_helper.from_array(np.array(index, np.int64), f"i{i}"))
        nodes += [helper.make_node("Gather", ["r", f"i{i}"], [f"g{i}"], axis=0),
                  helper.make_node("Unsqueeze", [f"g{i}", "axis0"], [f"u{i}"])]
        outs.append(f"u{i}")
    inits.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=0))
    return make_model(nodes, [("x", [5, 3])], [("y", None)], inits)


def test_the_index_checks_of_constant_gathers_fold_without_llvm(monkeypatch):
    build = importlib.import_module("tvm.tirx.build")
    calls = []
    original = build.codegen_build
    monkeypatch.setattr(build, "codegen_build", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = _gathers([0, 3, -1, -5, 2])  # negative indices count from the end
    spec = targets.resolve("x86-host")
    mod = run_graph_passes(frontend.import_model(model).mod, spec, spec.tvm_target(), partition=False)
    assert calls == []
    text = mod["main"].script()
    assert "R.shape_of" not in text and "R.where" not in text and "R.less" not in text
    x = {"x": np.random.default_rng(2).standard_normal((5, 3)).astype("float32")}
    np.testing.assert_array_equal(tvmfuse.compile(model, target="x86-host").run(x)[0], ort_run(model, x)[0])


def test_integer_ops_of_constants_fold_exactly_and_float_ones_are_left_to_tvm():
    from tvm import relax

    a, b = np.array([3, -7, 9], np.int64), np.array([2, 5, -4], np.int64)
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        ca, cb = relax.const(a), relax.const(b)
        less = bb.emit(relax.op.less(ca, cb))
        outs = [bb.emit(relax.op.add(ca, cb)), bb.emit(relax.op.subtract(ca, cb)), bb.emit(relax.op.multiply(ca, cb)),
                less, bb.emit(relax.op.where(less, ca, cb)),
                bb.emit(relax.op.take(ca, relax.const(np.array(-1, np.int64)), axis=0, mode="wrap")),
                bb.emit(relax.op.add(relax.const(np.float32(0.1)), relax.const(np.float32(0.2))))]
        bb.emit_func_output(relax.Tuple(outs))
    mod = FoldConstantLayouts(relax.transform.Normalize()(bb.get()))
    bindings = {bd.var: bd.value for block in mod["main"].body.blocks for bd in block.bindings}
    got = [bindings.get(f, f) for f in mod["main"].body.body.fields]
    want = [a + b, a - b, a * b, a < b, np.where(a < b, a, b), np.array(9)]
    for g, w in zip(got[:-1], want):
        assert isinstance(g, tvm.ir.expr.Constant)
        np.testing.assert_array_equal(g.value.numpy(), w)
    assert not isinstance(got[-1], tvm.ir.expr.Constant)  # float arithmetic rounds as TVM does: FoldConstant's


def test_a_kernel_whose_fused_name_is_longer_than_a_file_name_builds(tmp_path):
    """40 Gather/Unsqueeze pairs fused into one Concat kernel: a symbol of some 1,000 characters, which the
    build once used as the object's file name (ENAMETOOLONG)."""
    model = _gathers([i % 5 for i in range(40)])
    cm = tvmfuse.compile(model, target="x86-host", cache=tmp_path / "cache")
    assert max(len(name) for name in cm.kernel_info["kernels"]) > 255
    x = {"x": np.random.default_rng(3).standard_normal((5, 3)).astype("float32")}
    np.testing.assert_array_equal(cm.run(x)[0], ort_run(model, x)[0])
