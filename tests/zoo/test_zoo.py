"""Tests for tvmfuse.zoo: architecture pins, determinism and onnxruntime runs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

from tvmfuse import zoo

ort = pytest.importorskip("onnxruntime")

# name -> (Conv count, parameter count, input shape, output shape)
EXPECTED = {
    "mobilenet_v2": (52, 3_504_872, (1, 3, 224, 224), (1, 1000)),
    "resnet18": (20, 11_689_512, (1, 3, 224, 224), (1, 1000)),
    "resnet50": (53, 25_557_032, (1, 3, 224, 224), (1, 1000)),
    # 1 stem + 2 (ds block) + 15 * 3 (MBConv) + 1 head; 4,652,008 == timm's count.
    "efficientnet_lite0": (49, 4_652_008, (1, 3, 224, 224), (1, 1000)),
    "tiny_convnet": (6, 26_842, (1, 3, 32, 32), (1, 10)),
}
# TF SAME padding of efficientnet_lite0's stride-2 convs in ONNX order
# (top, left, bottom, right): the extra pixel goes bottom/right.
LITE0_PADS = {
    "conv_stem": (0, 0, 1, 1),  # k3 on 224
    "blocks.1.0.conv_dw": (0, 0, 1, 1),  # k3 on 112
    "blocks.2.0.conv_dw": (1, 1, 2, 2),  # k5 on 56
    "blocks.3.0.conv_dw": (0, 0, 1, 1),  # k3 on 28
    "blocks.5.0.conv_dw": (1, 1, 2, 2),  # k5 on 14
}


def _shape(value_info: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)


def _param_count(model: onnx.ModelProto) -> int:
    """Learnable parameters, torchvision style (BN running stats excluded)."""
    inits = {t.name: t for t in model.graph.initializer}
    used: set[str] = set()
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm"):
            used.update(node.input[1:])
        elif node.op_type == "BatchNormalization":
            used.update(node.input[1:3])  # scale, bias
    return sum(int(np.prod(inits[n].dims)) for n in used)


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _attr(node: onnx.NodeProto, name: str):
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def named_model(request) -> tuple[str, onnx.ModelProto]:
    return request.param, zoo.get(request.param)


def test_names():
    assert zoo.names() == sorted(EXPECTED)


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError) as info:
        zoo.get("resnet1000")
    for name in EXPECTED:
        assert name in str(info.value)


def test_get_returns_fresh_copy():
    a = zoo.get("tiny_convnet")
    a.graph.node.pop()
    b = zoo.get("tiny_convnet")
    assert len(b.graph.node) == len(a.graph.node) + 1


def test_byte_identical_across_processes():
    code = "import sys; from tvmfuse import zoo; sys.stdout.buffer.write(zoo.get('tiny_convnet').SerializeToString())"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True).stdout
    assert out == zoo.get("tiny_convnet").SerializeToString()


def test_checker_and_determinism(named_model):
    name, model = named_model
    onnx.checker.check_model(model, full_check=True)
    assert model.SerializeToString() == zoo.get(name).SerializeToString()
    assert model.opset_import[0].version == 17


def test_architecture(named_model):
    name, model = named_model
    n_conv, n_params, in_shape, out_shape = EXPECTED[name]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == n_conv
    assert ops.count("Gemm") == 1
    assert _param_count(model) == n_params
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["output"]
    assert _shape(model.graph.input[0]) == in_shape
    assert _shape(model.graph.output[0]) == out_shape
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names) and all(names)


def test_efficientnet_same_pad_chain():
    model = zoo.get("efficientnet_lite0")
    prod = _producers(model)
    pads = [n for n in model.graph.node if n.op_type == "Pad"]
    stride2 = [n for n in model.graph.node if n.op_type == "Conv" and _attr(n, "strides") == [2, 2]]
    assert len(pads) == len(stride2) == 5
    consumers = {i: n for n in model.graph.node for i in n.input}
    for conv in stride2:
        assert _attr(conv, "pads") == [0, 0, 0, 0]
        pad = prod[conv.input[0]]
        assert pad.op_type == "Pad"
        # Walk the torch-style chain back from the Pad's `pads` input.
        chain, node = [], prod[pad.input[1]]
        for _ in range(6):
            chain.append(node.op_type)
            concat, node = node, prod.get(node.input[0])
        assert chain == ["Cast", "Reshape", "Transpose", "Slice", "Reshape", "Concat"]
        assert "ConstantOfShape" in [prod[i].op_type for i in concat.input]
        assert node.op_type == "Constant"  # the pad list in torch order
        assert consumers[pad.output[0]] is conv
    # Stride-1 convs keep symmetric pads on the Conv itself.
    for conv in model.graph.node:
        if conv.op_type == "Conv" and _attr(conv, "strides") == [1, 1]:
            k = _attr(conv, "kernel_shape")[0]
            assert _attr(conv, "pads") == [(k - 1) // 2] * 4


def test_efficientnet_pad_values():
    """The constant chains evaluate to TF SAME pads and give TF output sizes."""
    model = zoo.get("efficientnet_lite0")
    prod = _producers(model)
    convs = {n.name: n for n in model.graph.node if n.op_type == "Conv"}
    wanted = [prod[convs[c].input[0]].input[1] for c in LITE0_PADS]
    wanted += [convs[c].output[0] for c in LITE0_PADS]
    for t in wanted:
        model.graph.output.append(onnx.ValueInfoProto(name=t))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.zeros((1, 3, 224, 224), np.float32)
    res = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"input": x})))
    for conv, (top, left, bottom, right) in LITE0_PADS.items():
        onnx_pads = res[prod[convs[conv].input[0]].input[1]]
        assert onnx_pads.dtype == np.int64
        assert onnx_pads.tolist() == [0, 0, top, left, 0, 0, bottom, right]
    sizes = [res[convs[c].output[0]].shape[2:] for c in LITE0_PADS]
    assert sizes == [(112, 112), (56, 56), (28, 28), (14, 14), (7, 7)]


def test_onnxruntime_run(named_model):
    name, model = named_model
    _, _, in_shape, out_shape = EXPECTED[name]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(in_shape).astype(np.float32)
    (y,) = sess.run(None, {"input": x})
    assert y.shape == out_shape and y.dtype == np.float32
    assert np.isfinite(y).all()
    # Keeps compiler-vs-ORT comparisons at rtol=atol=1e-4 meaningful.
    assert 0.1 <= float(np.abs(y).max()) <= 50.0
