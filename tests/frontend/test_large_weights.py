"""Large weights in the front end: the checker and shape inference without their data (tvmfuse.frontend.skeleton),
constants converted to arrays only when read (tvmfuse.frontend.graph.Constants)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvmfuse.frontend import skeleton
from tvmfuse.frontend.graph import Constants
from tvmfuse.frontend.load import load_model


def _model(ir_version: int = 8, listed_as_inputs: bool = False) -> onnx.ModelProto:
    """Conv (a 64x32x3x3 weight: large) -> Reshape (a 2-element shape: small, its values needed) -> Gemm."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    dense = numpy_helper.from_array(rng.standard_normal((64 * 8 * 8, 10)).astype(np.float32), "d")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Gemm", ["r", "d"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])]
    if listed_as_inputs:  # as old exporters wrote them, the weights typed with no shape
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims) if t is shape else None)
                   for t in (weight, shape, dense)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              initializer=[weight, shape, dense])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ir_version)


def _shapes(graph: onnx.GraphProto) -> dict:
    return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in list(graph.value_info) +
            list(graph.output)}


@pytest.mark.parametrize("ir_version, listed", [(8, False), (3, True)])
def test_skeleton_leaves_out_large_weights_and_infers_what_the_whole_model_does(ir_version, listed):
    model = _model(ir_version, listed)
    bare = skeleton.skeleton(model)
    assert bare.ByteSize() < 2_000 < model.ByteSize()  # the two large weights' data is not in it
    assert [t.name for t in bare.graph.initializer] == ["shape"]  # the Reshape's shape kept: inference reads it
    # The large weights are inputs now; IR 3 listed every initializer as an input already (not twice)
    assert sorted(v.name for v in bare.graph.input) == sorted(["x", "w", "d"] + (["shape"] if listed else []))
    # what ONNX infers on the whole model whose weights are initializers only (where an IR 3 input lists a weight
    # without a shape, ONNX takes the input's type and knows less: the skeleton types it by the weight)
    expected = _shapes(onnx.shape_inference.infer_shapes(_model()).graph)
    assert expected == {"c": [1, 64, 8, 8], "r": [1, 4096], "y": [1, 10]}
    inferred = skeleton.infer_shapes(model)
    assert inferred is model and _shapes(model.graph) == expected
    assert len(model.graph.initializer) == 3 and model.graph.initializer[0].raw_data  # the weights untouched
    skeleton.check_model(model)


def test_a_model_without_large_weights_is_its_own_skeleton():
    model = _model()
    del model.graph.initializer[2]
    del model.graph.initializer[0]
    assert skeleton.skeleton(model) is model


def test_float_constants_shape_inference_reads_are_kept_and_longer_float_vectors_left_out():
    """A Resize's float scales stay initializers (inference reads them); a batch-norm's 100 floats are inputs."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    stats = [numpy_helper.from_array(np.full(100, v, np.float32), n) for n, v in
             (("g", 1), ("b", 0), ("m", 0), ("v", 1))]
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["n"]),
             helper.make_node("Resize", ["n", "", "scales"], ["y"], mode="nearest")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 100, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[scales] + stats)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    bare = skeleton.skeleton(model)
    assert [t.name for t in bare.graph.initializer] == ["scales"]
    assert sorted(v.name for v in bare.graph.input) == ["b", "g", "m", "v", "x"]
    assert _shapes(skeleton.infer_shapes(model).graph)["y"] == [1, 100, 8, 8]


def test_the_checker_still_refuses_a_broken_graph_with_large_weights(tmp_path):
    model = _model()
    model.graph.node[2].input[0] = "missing"  # read but never produced
    path = tmp_path / "broken.onnx"
    onnx.save(model, path)
    with pytest.raises(Exception, match="is not a valid ONNX model: .*missing"):
        load_model(str(path))


def test_constants_convert_an_initializer_only_when_it_is_read():
    model = _model()
    consts = Constants(model.graph.initializer)
    assert len(consts) == 3 and "w" in consts and "nope" not in consts and consts._arrays == {}
    assert consts["shape"].tolist() == [1, -1] and list(consts._arrays) == ["shape"]
    consts["new"] = np.zeros(2)
    consts.update({"shape": np.array([4])})  # a folded value replaces the initializer's
    assert sorted(consts) == ["d", "new", "shape", "w"] and consts["shape"].tolist() == [4]
    del consts["w"]
    assert "w" not in consts and len(consts) == 3 and consts.get("w") is None
    with pytest.raises(KeyError):
        consts["w"]
