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
