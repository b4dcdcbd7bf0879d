"""What real exports need from the front end, each as a small hand-built repro of a failure seen on a real model.

- PaddleOCR's classifier declares its batch dim as ``-1`` (rapidocr's ch_ppocr_mobile_v2.0_cls_mobile.onnx):
  it was read as a fixed size.
- PP-OCR recognizers compute a Reshape target through two levels of ``Shape -> Cast -> Slice -> Concat``:
  TVM's importer needs it constant ("Reshape requires the input new shape to be Shape").
- TVM's converters return wrong numbers for some attribute forms; ``frontend/normalize.py`` rewrites them
  or refuses them by name (the ONNX node suite covers the rest).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse import frontend
from tvmfuse.errors import ShapeError, UnsupportedOpError

from helpers import HOST, make_model, ort_run


def _match(model, shapes=None, target=HOST, layout="blocked", tol=1e-4):
    cm = tvmfuse.compile(model, target=target, shapes=shapes, layout=layout)
    x = {i.name: np.random.default_rng(3).standard_normal(i.shape).astype(i.dtype) for i in cm.inputs}
    ours, ref = cm.run(x), ort_run(_static(model, {i.name: i.shape for i in cm.inputs}), x)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    return cm


def _static(model, shapes):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    frontend.fix_input_shapes(m, shapes)
    return m


def _conv_model(batch_dim):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    graph.input[0].type.tensor_type.shape.dim[0].Clear()
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch_dim  # as Paddle writes it: -1 (or 0)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


@pytest.mark.parametrize("batch_dim", [-1, 0])
def test_minus_one_and_zero_dims_are_dynamic(batch_dim):
    model = _conv_model(batch_dim)
    hint = r"shapes=\{'x': \(1, 3, 8, 8\)\}"
    with pytest.raises(ShapeError, match=rf"input 'x' has dynamic dims \['{batch_dim}'\].*{hint}"):
        tvmfuse.compile(model, target=HOST)
    cm = _match(model, {"x": (1, 3, 8, 8)})
    assert cm.inputs[0].shape == (1, 3, 8, 8)
    assert all(d > 0 for d in cm.manifest()["inputs"][0]["shape"])  # no library that refuses every input
    assert _match(model, {"x": (2, 3, 8, 8)}).inputs[0].shape == (2, 3, 8, 8)


def _shape_chain(src, tag):
    """Shape(src) -> Cast(float) -> Slice[0:2] -> Cast(int64) -> Concat([-1]), as paddle2onnx writes it."""
    return [helper.make_node("Shape", [src], [f"{tag}_s"]),
            helper.make_node("Cast", [f"{tag}_s"], [f"{tag}_c"], to=TensorProto.FLOAT),
            helper.make_node("Slice", [f"{tag}_c", "zero", "two"], [f"{tag}_sl"]),
            helper.make_node("Cast", [f"{tag}_sl"], [f"{tag}_ci"], to=TensorProto.INT64),
            helper.make_node("Concat", [f"{tag}_ci", "minus1"], [f"{tag}_shape"], axis=0)]


def test_reshape_target_through_two_shape_chains():
    """The second chain reads the first Reshape's output: its shape is known only after a first fold round."""
    nodes = _shape_chain("x", "a") + [helper.make_node("Reshape", ["x", "a_shape"], ["r1"]),
                                      helper.make_node("Relu", ["r1"], ["r1r"])]
    nodes += _shape_chain("r1r", "b") + [helper.make_node("Reshape", ["r1r", "b_shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("zero", 0), ("two", 2), ("minus1", -1))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    proto, *_ = frontend.prepare(model, {"x": (1, 3, 4, 4)})
    assert [n.op_type for n in proto.graph.node] == ["Reshape", "Relu", "Reshape"]
    assert _match(model, {"x": (1, 3, 4, 4)}).outputs[0].shape == (1, 3, 16)


def test_fold_reaches_a_fixed_point_with_constant_node_weights():
    """Constant nodes (Paddle's weights) feeding ConstantOfShape/Range/Expand/Unsqueeze chains all fold."""
    c = lambda n, v: helper.make_node("Constant", [], [n], value=numpy_helper.from_array(np.asarray(v), n))  # noqa: E731
    nodes = [c("w", np.ones((2, 3, 1, 1), np.float32)), c("one", np.array([1], np.int64)),
             helper.make_node("Conv", ["x", "w"], ["cv"]),
             helper.make_node("Shape", ["cv"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["ch"], axis=0),                 # [2]
             helper.make_node("ConstantOfShape", ["ch"], ["ones"], value=numpy_helper.from_array(np.array([1], np.int64))),
             helper.make_node("Range", ["zero_s", "two_s", "one_s"], ["rng"]),
             helper.make_node("Unsqueeze", ["rng", "ax"], ["rng2"]),                     # [[0, 1]]
             helper.make_node("Expand", ["rng2", "ones"], ["ex"]),                        # broadcast
             helper.make_node("Squeeze", ["ex", "ax"], ["sq"]),
             helper.make_node("Cast", ["sq"], ["sqf"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["sqf", "shape4"], ["bias"]),
             helper.make_node("Add", ["cv", "bias"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("zero_s", 0), ("two_s", 2), ("one_s", 1), ("ax", [0]), ("shape4", [1, 2, 1, 1]))]
    model = make_model(nodes, [("x", [1, 3, 4, 4])], [("y", None)], inits, opset=13)
    proto, *_ = frontend.prepare(model)
    assert [n.op_type for n in proto.graph.node] == ["Conv", "Add"]
    _match(model)


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_axis_semantics_per_opset(opset):
    """Opset < 13 Softmax flattens to 2-D at ``axis``; 13+ normalizes one axis. Both on NCHW, axis 1."""
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", [1, 3, 4, 5])], [("y", None)],
                       opset=opset)
    _match(model)


def test_conv_transpose_output_shape_becomes_pads():
    """output_shape larger than the natural size: pads go negative, so output_padding takes the rest."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((1, 2, 3, 3)).astype("float32"), "W")
    node = helper.make_node("ConvTranspose", ["x", "W"], ["y"], strides=[3, 2], output_shape=[10, 8])
    model = make_model([node], [("x", [1, 1, 3, 3])], [("y", None)], [w])
    assert _match(model).outputs[0].shape == (1, 2, 10, 8)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("kernel,stride,size,group", [(2, 1, 9, 1), (3, 2, 10, 1), (4, 2, 9, 1), (5, 1, 8, 8)],
                         ids=["k2s1", "k3s2", "k4s2", "dw-k5"])
def test_conv_auto_pad_becomes_the_convs_own_padding(mode, kernel, stride, size, group):
    """PP-OCRv6's detector stem: SAME_UPPER 2x2 convs. TVM's importer pads them with a separate kernel."""
    rng = np.random.default_rng(kernel)
    w = numpy_helper.from_array(rng.standard_normal((8, 8 // group, kernel, kernel)).astype("float32"), "W")
    node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                            auto_pad=mode, group=group)
    model = make_model([node], [("x", [1, 8, size, size])], [("y", None)], [w])
    proto = frontend.prepare(model)[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in proto.graph.node[0].attribute}
    per_axis = max(0, (-(-size // stride) - 1) * stride + kernel - size)
    assert "auto_pad" not in attrs and sum(attrs["pads"]) == 2 * per_axis
    cm = _match(model)
    assert cm.outputs[0].shape == (1, 8, -(-size // stride), -(-size // stride))
    assert not [gv for gv, _ in cm.lowered.functions_items() if gv.name_hint.startswith("pad")]


@pytest.mark.parametrize("layout", ["blocked", "nchw"])
def test_depthwise_conv_transpose_with_output_padding(layout):
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((8, 1, 3, 3)).astype("float32"), "W")
    b = numpy_helper.from_array(rng.standard_normal(8).astype("float32"), "B")
    node = helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                            output_padding=[1, 1], group=8)
    model = make_model([node, helper.make_node("Relu", ["y"], ["z"])], [("x", [1, 8, 6, 6])], [("z", None)], [w, b])
    assert _match(model, layout=layout).outputs[0].shape == (1, 8, 12, 12)


def test_spelt_out_layer_norm_and_erf_gelu_match():
    """LayerNorm as the PyTorch legacy exporter writes it, then GELU through Erf."""
    rng = np.random.default_rng(4)
    f = lambda n, v: numpy_helper.from_array(np.asarray(v, np.float32), n)  # noqa: E731
    inits = [f("two", 2.0), f("eps", 1e-5), f("g", rng.uniform(0.5, 1.5, 16)), f("b", rng.standard_normal(16)),
             f("sqrt2", np.sqrt(2.0)), f("one", 1.0), f("half", 0.5),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]), helper.make_node("ReduceMean", ["d2", "axes"], ["v"]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["ln"]),
             helper.make_node("Div", ["ln", "sqrt2"], ["q"]), helper.make_node("Erf", ["q"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["ln", "e1"], ["le"]),
             helper.make_node("Mul", ["le", "half"], ["y"])]
    _match(make_model(nodes, [("x", [1, 10, 16])], [("y", None)], inits, opset=18))


def test_integer_pow_exponent_on_float_base():
    exp = numpy_helper.from_array(np.array(3, np.int64), "p")
    model = make_model([helper.make_node("Pow", ["x", "p"], ["y"])], [("x", [2, 5])], [("y", None)], [exp], opset=15)
    _match(model)


@pytest.mark.parametrize("attrs, sizes, why", [
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 1, 4], "align_corners.*1 pixel"),
    ({"mode": "linear", "antialias": 1}, [1, 1, 2, 2], "antialias"),
])
def test_resize_forms_tvm_gets_wrong_are_refused_by_name(attrs, sizes, why):
    s = numpy_helper.from_array(np.array(sizes, np.int64), "sizes")
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up7", **attrs)
    model = make_model([node], [("x", [1, 1, 4, 4])], [("y", None)], [s], opset=19)
    with pytest.raises(UnsupportedOpError, match=rf"Resize node 'up7': .*{why}"):
        tvmfuse.compile(model, target=HOST)


def test_resize_by_inexact_scale_is_refused_by_name():
    s = numpy_helper.from_array(np.array([1, 1, 0.6, 0.6], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="down", mode="linear")
    model = make_model([node], [("x", [1, 1, 4, 4])], [("y", None)], [s], opset=13)
    with pytest.raises(UnsupportedOpError, match="Resize node 'down': scale 0.6 on axis 2 maps 4 pixels to 2.4"):
        tvmfuse.compile(model, target=HOST)


@pytest.mark.parametrize("mode, coord", [("nearest", "asymmetric"), ("linear", "half_pixel"),
                                         ("linear", "align_corners"), ("linear", "pytorch_half_pixel")])
def test_resize_upsampling_as_exporters_write_it(mode, coord):
    """torch's F.interpolate x2 (scales) and to a size (sizes), nearest and bilinear, on conv outputs."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype("float32"), "W")
    s = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    sz = numpy_helper.from_array(np.array([1, 4, 19, 21], np.int64), "sizes")
    extra = {"nearest_mode": "floor"} if mode == "nearest" else {}
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["u"], mode=mode, coordinate_transformation_mode=coord,
                              **extra),
             helper.make_node("Resize", ["u", "", "", "sizes"], ["y"], mode=mode,
                              coordinate_transformation_mode=coord, **extra)]
    _match(make_model(nodes, [("x", [1, 4, 7, 9])], [("y", None)], [w, s, sz], opset=13))
