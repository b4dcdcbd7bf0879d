"""bench/compile_cache.py: the one-layer change it times (#53's bar), in a flat graph and in an If's branches."""

import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import compile_cache  # noqa: E402


def _relus(count: int, prefix: str = ""):
    nodes = [helper.make_node("Relu", [f"{prefix}x{i}" if i else "x"], [f"{prefix}x{i + 1}"]) for i in range(count)]
    return nodes, f"{prefix}x{count}"


def _model(nodes, out: str, extra_inputs=()):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]), *extra_inputs]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kinds(model):
    return [[n.op_type for n in g.node] for g in compile_cache._graphs(model.graph)]


def test_the_middle_relu_of_a_flat_graph_becomes_a_leaky_relu(tmp_path):
    nodes, out = _relus(3)
    changed = onnx.load(compile_cache._one_layer_changed(_model(nodes, out), tmp_path / "m.onnx"))
    assert _kinds(changed) == [["Relu", "LeakyRelu", "Relu"]]


def test_layers_in_an_ifs_branches_change_in_each_branch(tmp_path):
    # Silero VAD's shape: the layers live in the branches of an If on a pinned input; whichever branch the
    # import keeps must hold the changed layer
    branches = []
    for side in ("then", "else"):
        nodes, out = _relus(3, prefix=side)
        nodes[0].input[0] = "x"
        branches.append(helper.make_graph(nodes, side, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                                            [1, 4])]))
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branches[0], else_branch=branches[1])
    changed = onnx.load(compile_cache._one_layer_changed(_model([node], "y", [cond]), tmp_path / "m.onnx"))
    assert _kinds(changed) == [["If"], ["Relu", "LeakyRelu", "Relu"], ["Relu", "LeakyRelu", "Relu"]]


def test_a_model_with_nothing_to_change_says_so(tmp_path):
    model = _model([helper.make_node("Identity", ["x"], ["y"])], "y")
    with pytest.raises(RuntimeError, match="no activation or Add"):
        compile_cache._one_layer_changed(model, tmp_path / "m.onnx")


def _row(model, first, one_layer, again=0.1, identical=True):
    return {"model": model, "first": first, "one_layer": one_layer, "again": again, "identical": identical,
            "one_layer_identical": True}


def test_the_summary_counts_the_rows_against_53s_bars():
    rows = [_row("a", 10.0, 2.0), _row("b", 10.0, 3.0), _row("c", 4.0, 2.0, again=1.2),
            _row("d", 20.0, 9.0, again=1.5, identical=False), {"model": "e", "error": "boom"}]
    line = compile_cache.summary(rows)
    # 20% and 30% within, 50% and 45% not; c's second compile is over 1.0 s and 10% of its first, d's 1.5 s is
    # within 10% of 20 s
    assert line == ("one layer within 30% of the first compile: 2 of 4 (median 37.5%); second compile at most 1.50 s "
                    "(1 over the bar: c); slowest first compile 20.00 s (d); outputs identical: 3 of 4; 1 failed")
    assert compile_cache.summary([{"model": "e", "error": "boom"}]) == "no model measured (1 failed)"
