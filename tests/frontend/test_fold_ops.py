"""Constant folding's evaluation (tvmfuse.frontend.fold): Constant nodes read from their attribute, other ops
through their ONNX reference class, empty optional inputs and outputs kept in place."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvmfuse.frontend import fold

OPSETS = [helper.make_opsetid("", 17)]


@pytest.mark.parametrize("attrs, expected", [
    ({"value": numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))},
     np.arange(6, dtype=np.float32).reshape(2, 3)),
    ({"value_float": 0.5}, np.array(0.5, np.float32)),
    ({"value_floats": [1.0, 2.5]}, np.array([1.0, 2.5], np.float32)),
    ({"value_int": 7}, np.array(7, np.int64)),
    ({"value_ints": [1, -1]}, np.array([1, -1], np.int64)),
    ({"value_string": "abc"}, np.array("abc")),  # not read directly: the reference evaluates it
])
def test_constant_values_are_what_the_reference_computes(attrs, expected):
    node = helper.make_node("Constant", [], ["c"], **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("c", TensorProto.UNDEFINED, None)])
    reference = ReferenceEvaluator(helper.make_model(graph, opset_imports=OPSETS)).run(None, {})[0]
    got = (fold._constant(node) or fold._evaluate(node, [], OPSETS))[0]
    assert got.dtype == np.asarray(reference).dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    assert (fold._constant(node) is None) == ("value_string" in attrs)


def test_ops_evaluated_with_empty_optional_inputs_and_outputs_in_place():
    x = np.arange(10, dtype=np.float32)
    # Slice(data, starts, ends, axes="", steps): an empty name for an optional input in the middle
    sliced = fold._evaluate(helper.make_node("Slice", ["x", "s", "e", "", "st"], ["y"]),
                            [x, np.array([1]), np.array([9]), None, np.array([2])], OPSETS)
    np.testing.assert_array_equal(sliced[0], x[1:9:2])
    # Split with its first output unnamed: the second output's value goes to the second name
    split = fold._evaluate(helper.make_node("Split", ["x", "n"], ["", "b"]), [x, np.array([4, 6])], OPSETS)
    assert split[0] is None and split[1].tolist() == x[4:].tolist()
    assert fold._evaluate(helper.make_node("NoSuchOp", ["x"], ["y"]), [x], OPSETS) is None


def test_a_model_of_constants_and_shape_ops_folds_to_initializers():
    nodes = [helper.make_node("Constant", [], ["shape"], value_ints=[2, -1]),
             helper.make_node("Constant", [], ["k"], value_float=2.0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Mul", ["r", "k"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])])
    folded, count = fold.fold_constants(helper.make_model(graph, opset_imports=OPSETS))
    assert count == 2 and [n.op_type for n in folded.graph.node] == ["Reshape", "Mul"]
    values = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    assert values["shape"].tolist() == [2, -1] and values["k"].dtype == np.float32
    onnx.checker.check_model(folded)
