"""onnxruntime's own float operators (``com.microsoft``: what its graph optimizer writes) compile and match
onnxruntime: a model saved by onnxruntime's optimizer, and each operator with its options on its own."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from helpers import make_model, ort_run
from tvmfuse.errors import UnsupportedOpError

RNG = np.random.default_rng(0)
MS = "com.microsoft"


def _init(name, shape, scale=0.3):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype("float32"), name)


def _ms_model(nodes, inputs, inits=()):
    model = make_model(nodes, inputs, [("y", None)], list(inits))
    model.opset_import.append(helper.make_opsetid(MS, 1))
    return model


def _check(model, shapes: dict, tol: float = 1e-4):
    cm = tvmfuse.compile(model, target="x86-host")
    x = {k: RNG.standard_normal(v).astype("float32") for k, v in shapes.items()}
    for got, want in zip(cm.run(x), ort_run(model, x)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return cm


def test_a_model_saved_by_onnxruntimes_optimizer(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W3"], ["c3"]), helper.make_node("Sigmoid", ["c3"], ["s3"]),
             helper.make_node("Reshape", ["s3", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "M1"], ["m1"]),
             helper.make_node("Add", ["m1", "MB"], ["mb"]), helper.make_node("Div", ["mb", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["mb", "e1"], ["g0"]), helper.make_node("Mul", ["g0", "half"], ["y"])]
    inits = [_init("W1", (8, 4, 3, 3)), _init("B1", (8,)), _init("W3", (4, 8, 1, 1)),
             numpy_helper.from_array(np.array([1, 144], np.int64), "shape"), _init("M1", (144, 32)), _init("MB", (32,)),
             numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    plain = make_model(nodes, [("x", [1, 4, 6, 6])], [("y", None)], inits)
    onnx.save(plain, tmp_path / "plain.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "plain.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(tmp_path / "optimized.onnx")
    written = {n.op_type for n in optimized.graph.node if n.domain == MS}
    assert {"FusedConv", "Gelu"} <= written, written
    cm = tvmfuse.compile(optimized, target="x86-host")
    x = {"x": RNG.standard_normal((1, 4, 6, 6)).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], ort_run(plain, x)[0], rtol=1e-4, atol=1e-4)
    partitions = [k for k in cm.manifest()["scheduled_by"] if k.startswith("tvmfuse_")]
    assert any("relu" in k for k in partitions) and any("sigmoid" in k for k in partitions), partitions


@pytest.mark.parametrize("activation,params", [("Relu", []), ("LeakyRelu", [0.2]), ("Clip", [0.0, 6.0]),
                                               ("HardSigmoid", [0.3, 0.4]), ("Tanh", []), ("", [])])
@pytest.mark.parametrize("with_sum", [False, True])
def test_fused_conv(activation, params, with_sum):
    attrs = {"pads": [1, 1, 1, 1], "strides": [1, 1]}
    if activation:
        attrs["activation"] = activation
    if params:
        attrs["activation_params"] = params
    inputs = ["x", "W", "B"] + (["z"] if with_sum else [])
    model = _ms_model([helper.make_node("FusedConv", inputs, ["y"], domain=MS, **attrs)],
                      [("x", [1, 4, 8, 8])] + ([("z", [1, 6, 8, 8])] if with_sum else []),
                      [_init("W", (6, 4, 3, 3)), _init("B", (6,))])
    _check(model, {"x": (1, 4, 8, 8), **({"z": (1, 6, 8, 8)} if with_sum else {})})


@pytest.mark.parametrize("op,bias,attrs", [("Gelu", False, {}), ("BiasGelu", True, {}), ("FastGelu", False, {}),
                                            ("FastGelu", True, {}), ("QuickGelu", False, {"alpha": 1.5})])
def test_gelu_forms(op, bias, attrs):
    model = _ms_model([helper.make_node(op, ["x"] + (["b"] if bias else []), ["y"], domain=MS, **attrs)],
                      [("x", [2, 16])], [_init("b", (16,))] if bias else [])
    _check(model, {"x": (2, 16)})


@pytest.mark.parametrize("trans_a,trans_b,alpha", [(0, 0, 1.0), (1, 0, 0.5), (0, 1, 2.0), (1, 1, 1.0)])
def test_fused_matmul(trans_a, trans_b, alpha):
    a_shape = (2, 8, 5) if trans_a else (2, 5, 8)
    b_shape = (2, 3, 8) if trans_b else (2, 8, 3)
    model = _ms_model([helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, transA=trans_a, transB=trans_b,
                                        alpha=alpha)], [("a", list(a_shape)), ("b", list(b_shape))])
    _check(model, {"a": a_shape, "b": b_shape})


def test_other_contrib_ops_are_refused_by_name():
    model = _ms_model([helper.make_node("EmbedLayerNormalization", ["ids", "", "w", "p", "", "g", "bt"], ["y"],
                                        domain=MS)],
                      [("ids", [1, 4])], [_init("w", (10, 8)), _init("p", (4, 8)), _init("g", (8,)), _init("bt", (8,))])
    with pytest.raises(UnsupportedOpError, match=r"unsupported ONNX op: com\.microsoft\.EmbedLayerNormalization"):
        tvmfuse.compile(model, target="x86-host")


def _norm_model(op: str, opset: int, beta: bool, bias: bool, sum_out: bool):
    skip, simplified = op.startswith("Skip"), "Simplified" in op
    inputs, inits = ["x"] + (["s"] if skip else []) + ["g"], [_init("g", (16,), 1.0)]
    if beta and not simplified:
        inputs.append("bt")
        inits.append(_init("bt", (16,)))
    if bias and skip:
        inputs += [""] * (0 if simplified or beta else 1) + ["bs"]
        inits.append(_init("bs", (16,)))
    outputs = ["y"] + (["", "", "sum"] if sum_out else [])
    node = helper.make_node(op, inputs, outputs, domain="" if op == "SimplifiedLayerNormalization" else MS,
                            epsilon=1e-3)
    tail = [helper.make_node("Add", ["sum", "y"], ["z"])] if sum_out else [helper.make_node("Identity", ["y"], ["z"])]
    model = make_model([node] + tail, [("x", [1, 6, 16])] + ([("s", [1, 6, 16])] if skip else []), [("z", None)],
                       inits, opset=opset)
    model.opset_import.append(helper.make_opsetid(MS, 1))
    return model


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SimplifiedLayerNormalization",
                                "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("opset,beta,bias,sum_out", [(17, True, True, False), (13, True, False, True),
                                                     (18, False, True, True), (13, False, False, False)])
def test_layer_norm_forms(op, opset, beta, bias, sum_out):
    if sum_out and not op.startswith("Skip"):
        pytest.skip("only the skip forms have the sum as an output")
    model = _norm_model(op, opset, beta, bias, sum_out)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    _check(model, shapes)


def test_the_layer_norm_statistics_outputs_are_refused():
    model = _ms_model([helper.make_node("SkipLayerNormalization", ["x", "x", "g"], ["y", "mean"], domain=MS)],
                      [("x", [1, 4, 8])], [_init("g", (8,))])
    with pytest.raises(UnsupportedOpError, match=r"SkipLayerNormalization node 'y': its mean / inverse-std outputs"):
        tvmfuse.compile(model, target="x86-host")


def test_a_model_saved_by_the_transformers_optimizer(tmp_path):
    """``onnxruntime.transformers.optimizer`` on two residual MatMul + LayerNorm blocks: SkipLayerNormalization
    with the MatMul's bias folded in; compiled with the LayerNorm as one op, and matching onnxruntime."""
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    inits = [_init("W", (32, 32)), _init("b", (32,)), _init("g", (32,), 1.0), _init("be", (32,)),
             _init("W2", (32, 32)), _init("g2", (32,), 1.0), _init("be2", (32,))]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["mb"]),
             helper.make_node("Add", ["mb", "x"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "be"], ["ln"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["ln", "W2"], ["m2"]), helper.make_node("Add", ["m2", "ln"], ["s2"]),
             helper.make_node("LayerNormalization", ["s2", "g2", "be2"], ["y"], axis=-1, epsilon=1e-5)]
    src, dst = tmp_path / "block.onnx", tmp_path / "optimized.onnx"
    onnx.save(make_model(nodes, [("x", [1, 8, 32])], [("y", [1, 8, 32])], inits), src)
    optimized = optimizer.optimize_model(str(src), model_type="bert", num_heads=4, hidden_size=32, opt_level=0)
    optimized.save_model_to_file(str(dst))
    model = onnx.load(dst)
    assert [n.op_type for n in model.graph.node if n.domain == MS] == ["SkipLayerNormalization"] * 2
    cm = _check(model, {"x": (1, 8, 32)})
    assert cm.mod.script().count("R.nn.layer_norm(") == 2


def _attention(mask: bool, sizes=None, bias: bool = True, **attrs):
    """``Attention`` over ``x [2, 6, 32]`` with 4 heads (what the transformers optimizer writes for BERT's
    self-attention), optionally with the raw ``[2, 6]`` mask."""
    out = sum(sizes or [32] * 3)
    inits = [_init("W", (32, out), 0.2)] + ([_init("b", (out,), 0.1)] if bias else [])
    inputs = ["x", "W", "b" if bias else ""] + (["m"] if mask else [])
    node = helper.make_node("Attention", inputs, ["y"], domain=MS, num_heads=4,
                            **({"qkv_hidden_sizes": sizes} if sizes else {}), **attrs)
    graph = helper.make_graph([node], "attention", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 6, 32])]
                              + ([helper.make_tensor_value_info("m", onnx.TensorProto.INT32, [2, 6])] if mask else []),
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=9)


@pytest.mark.parametrize("mask,sizes,bias,attrs", [
    (False, None, True, {}), (True, None, True, {}), (True, [32, 32, 16], True, {"mask_filter_value": -1e4}),
    (False, None, False, {"scale": 0.3})], ids=["plain", "masked", "qkv-sizes", "scaled-no-bias"])
def test_attention(mask, sizes, bias, attrs):
    model = _attention(mask, sizes, bias, **attrs)
    x = {"x": RNG.standard_normal((2, 6, 32)).astype("float32")}
    if mask:
        x["m"] = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)  # the first row's last two padded
    cm = tvmfuse.compile(model, target="x86-host")
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-5)


def test_attention_forms_it_does_not_spell_are_refused():
    with pytest.raises(UnsupportedOpError, match=r"Attention node 'y': unidirectional is not supported"):
        tvmfuse.compile(_attention(False, unidirectional=1), target="x86-host")
    model = _attention(False)
    model.graph.node[0].input.append("lengths")  # mask_index as key lengths ([batch])
    model.graph.input.append(helper.make_tensor_value_info("lengths", onnx.TensorProto.INT32, [2]))
    with pytest.raises(UnsupportedOpError, match=r"mask_index of rank 1 is not supported"):
        tvmfuse.compile(model, target="x86-host")
