"""Loading, static shapes, constant folding and op checks of the ONNX front end."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import frontend, zoo
from tvmfuse.errors import ModelLoadError, ShapeError, UnsupportedOpError

from helpers import HOST, ort_run
from helpers import conv_relu, make_model


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found.*nope.onnx"):
        tvmfuse.compile(tmp_path / "nope.onnx", target=HOST)


def test_not_onnx(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 definitely not a protobuf \xff\xfe" * 10)
    with pytest.raises(ModelLoadError, match=r"bad.onnx is not an ONNX file \(binary data, 310 bytes\)"):
        tvmfuse.compile(bad, target=HOST)
    text = tmp_path / "text.onnx"
    text.write_text("hello, a text file\nnot a model\n")
    with pytest.raises(ModelLoadError, match=r"text.onnx is not an ONNX file \(a text file, 31 bytes\)"):
        tvmfuse.compile(text, target=HOST)


def test_truncated_and_empty_onnx_files_say_so(tmp_path):
    data = zoo.get("tiny_convnet").SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=rf"cut.onnx: truncated or corrupt ONNX file \({len(data) // 2:,} bytes\)"):
        tvmfuse.compile(cut, target=HOST)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"empty.onnx is empty \(0 bytes\)"):
        tvmfuse.compile(empty, target=HOST)


def test_directory_and_wrong_type(tmp_path):
    with pytest.raises(ModelLoadError, match="directory"):
        frontend.load_model(tmp_path)
    with pytest.raises(ModelLoadError, match="must be a path"):
        frontend.load_model(3.5)
    with pytest.raises(ModelLoadError, match="known models"):
        frontend.load_model("zoo:alexnet")


def test_unsupported_op_names_op_and_node():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
             helper.make_node("MyCustomOp", ["r"], ["y"], name="custom7", domain="com.example")]
    model = make_model(nodes, [("x", [1, 4])], [("y", [1, 4])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError) as e:
        tvmfuse.compile(model, target=HOST)
    assert "com.example.MyCustomOp" in str(e.value) and "custom7" in str(e.value)


def test_unsupported_default_domain_op_lists_nodes():
    # DeformConv: a CNN op of the default domain that TVM's importer has no converter for.
    nodes = [helper.make_node("DeformConv", ["x", "w", "off"], ["y"], name=f"dc{i}") for i in range(1)]
    inits = [numpy_helper.from_array(np.zeros((1, 1, 1, 1), "float32"), "w"),
             numpy_helper.from_array(np.zeros((1, 2, 4, 4), "float32"), "off")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    with pytest.raises(UnsupportedOpError, match="DeformConv.*'dc0'"):
        frontend.check_ops(model, "m.onnx")


def test_dynamic_dims_need_shapes():
    with pytest.raises(ShapeError) as e:
        tvmfuse.compile(conv_relu(batch="N"), target=HOST)
    # in Python's words, the model's own dims filled in (the CLI says --shape x:1,3,16,16: tests/test_cli.py)
    assert "'x'" in str(e.value) and "N" in str(e.value) and "shapes={'x': (1, 3, 16, 16)}" in str(e.value)


def test_shapes_errors():
    model = conv_relu(batch="N")
    with pytest.raises(ShapeError, match="unknown input.*'y'"):
        frontend.prepare(model, {"y": (1, 3, 16, 16)})
    with pytest.raises(ShapeError, match="rank 4"):
        frontend.prepare(model, {"x": (1, 3, 16)})
    with pytest.raises(ShapeError, match="dim 1 is fixed to 3"):
        frontend.prepare(model, {"x": (1, 4, 16, 16)})
    with pytest.raises(ShapeError, match="positive"):
        frontend.prepare(model, {"x": (0, 3, 16, 16)})


def test_shapes_fix_dynamic_batch():
    cm = tvmfuse.compile(conv_relu(batch="N"), target=HOST, shapes={"x": (2, 3, 16, 16)})
    assert cm.inputs[0].shape == (2, 3, 16, 16) and cm.outputs[0].shape == (2, 8, 16, 16)
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype("float32")
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(conv_relu(batch="N"), {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_fold_same_padding_chain():
    # EfficientNet's TF "SAME" padding arrives as a ConstantOfShape/Concat/Slice chain feeding Pad.
    model = zoo.get("efficientnet_lite0")
    ops = [n.op_type for n in model.graph.node]
    assert {"ConstantOfShape", "Slice", "Concat"} <= set(ops)
    folded, _ = frontend.fold_constants(frontend.load_model(model)[0])
    folded_ops = {n.op_type for n in folded.graph.node}
    assert not folded_ops & {"ConstantOfShape", "Slice", "Concat", "Cast", "Constant", "Transpose"}
    inits = {t.name for t in folded.graph.initializer}
    pads = [n for n in folded.graph.node if n.op_type == "Pad"]
    assert len(pads) == 5 and all(n.input[1] in inits for n in pads)
    # The zero pads then move into the stride-2 convs (TF SAME: more padding at the end).
    proto, *_ = frontend.prepare(model)
    assert not [n for n in proto.graph.node if n.op_type == "Pad"]
    conv_pads = [list(a.ints) for n in proto.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "pads"]
    assert [0, 0, 1, 1] in conv_pads and [1, 1, 2, 2] in conv_pads


def _pad_conv(pads, value=0.0, mode="constant", second_reader=False):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(pads, "int64"), "pads"),
             numpy_helper.from_array(np.array(value, "float32"), "value"),
             numpy_helper.from_array(rng.standard_normal((4, 3 + pads[1] + pads[5], 3, 3)).astype("float32"), "W")]
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode=mode),
             helper.make_node("Conv", ["p", "W"], ["y"], strides=[2, 2])]
    outputs = [("y", None)]
    if second_reader:
        nodes.append(helper.make_node("Relu", ["p"], ["z"]))
        outputs.append(("z", None))
    return make_model(nodes, [("x", [1, 3, 8, 8])], outputs, inits)


def test_fuse_pad_into_conv_matches_onnxruntime():
    model = _pad_conv([0, 0, 0, 0, 0, 0, 1, 1])
    fused, count = frontend.fuse_pad_into_conv(frontend.load_model(model)[0])
    assert count == 1 and [n.op_type for n in fused.graph.node] == ["Conv"]
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")}
    out = tvmfuse.compile(model, target=HOST).run(x)[0]
    np.testing.assert_allclose(out, ort_run(model, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"pads": [0, 1, 0, 0, 0, 0, 1, 1]},               # pads the channel axis
    {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "value": 1.0},  # not a zero pad
    {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "mode": "reflect"},
    {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "second_reader": True},
])
def test_fuse_pad_into_conv_leaves_what_it_must(kwargs):
    model = _pad_conv(**kwargs)
    _, count = frontend.fuse_pad_into_conv(frontend.load_model(model)[0])
    assert count == 0
    x = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype("float32")}
    for out, ref in zip(tvmfuse.compile(model, target=HOST).run(x), ort_run(model, x)):
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_fold_shape_of_static_tensor_and_keep_qdq():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"]),
             helper.make_node("Add", ["r", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.ones((2, 3), "int8"), "wq"),
             numpy_helper.from_array(np.array(0.5, "float32"), "ws")]
    model = make_model(nodes, [("x", [2, 3])], [("y", [2, 3])], inits)
    folded, count = frontend.fold_constants(model)
    ops = [n.op_type for n in folded.graph.node]
    assert count == 1 and "Shape" not in ops
    # Folding DequantizeLinear(int8 weight) would erase the QDQ structure the INT8 path needs.
    assert "DequantizeLinear" in ops


def test_fold_leaves_graph_outputs_and_dynamic_nodes():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])
    folded, count = frontend.fold_constants(model)
    assert count == 0 and [n.op_type for n in folded.graph.node] == ["Relu"]


def test_the_model_is_checked_once(monkeypatch):
    # frontend.load runs onnx.checker; TVM's importer would run it again (serializing the whole proto: 0.15 s of
    # ResNet-50's import) and only warn.
    calls = []
    real = onnx.checker.check_model
    monkeypatch.setattr(onnx.checker, "check_model", lambda *a, **k: calls.append(1) or real(*a, **k))
    frontend.import_model(conv_relu(batch=1))
    assert len(calls) == 1
