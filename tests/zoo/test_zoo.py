"""Tests for tvmfuse.zoo: architecture pins, determinism and onnxruntime runs (each model's exporter-specific
structure: test_zoo_structure.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import NamedTuple

import numpy as np
import onnx
import pytest

from tvmfuse import zoo

from helpers.onnx_graph import attr, concrete, constants, producers, shape_of

ort = pytest.importorskip("onnxruntime")


class Arch(NamedTuple):
    convs: int  # Conv nodes (not ConvTranspose)
    params: int  # learnable parameters, see _param_count
    in_shape: tuple[int, ...]  # as declared; -1 is a dynamic batch (run with 1)
    out_shape: tuple[int, ...]
    gemms: int = 1
    opset: int = 17
    out_max: float = 50.0  # bound on max |output| for a standard-normal input


EXPECTED = {
    "mobilenet_v2": Arch(52, 3_504_872, (1, 3, 224, 224), (1, 1000)),
    "resnet18": Arch(20, 11_689_512, (1, 3, 224, 224), (1, 1000)),
    "resnet50": Arch(53, 25_557_032, (1, 3, 224, 224), (1, 1000)),
    # 1 stem + 2 (ds block) + 15 * 3 (MBConv) + 1 head; 4,652,008 == timm's count.
    "efficientnet_lite0": Arch(49, 4_652_008, (1, 3, 224, 224), (1, 1000)),
    "tiny_convnet": Arch(6, 26_842, (1, 3, 32, 32), (1, 10)),
    # 57 Conv modules + 6 Detect output convs + the DFL conv; == Ultralytics' fused yolov8n.
    # Boxes are in pixels (up to ~3x the 320 input for random weights).
    "yolov8n": Arch(64, 3_151_904, (1, 3, 320, 320), (1, 84, 2100), gemms=0, out_max=1000.0),
    # 1 stem + 2 + 14 * 3 (blocks) + 8 * 2 (SE) + 1 last; == torchvision's count.
    "mobilenet_v3_large": Arch(62, 5_483_032, (-1, 3, 224, 224), (-1, 1000), gemms=2),
    # 51 backbone + 6 ASPP + 2 head (width 0.5, output stride 8).
    "deeplabv3_mobilenet_v2": Arch(59, 2_594_645, (1, 3, 160, 160), (1, 21, 160, 160), gemms=0),
    # 9 DoubleConv * 2 + 1 (after the depthwise ConvTranspose) + 1 out; 4 ConvTranspose besides.
    "unet": Arch(20, 2_100_610, (1, 3, 128, 128), (1, 2, 128, 128), gemms=0),
    # 1 + 3 * 5 (stride-2 blocks) + 13 * 3 + 1; == torchvision's shufflenet_v2_x1_0.
    "shufflenet_v2": Arch(56, 2_278_604, (1, 3, 224, 224), (1, 1000)),
    # Same conv count as ResNet-50; == torchvision's count.
    "resnext50_32x4d": Arch(53, 25_028_904, (1, 3, 128, 128), (1, 1000)),
    # stem + 6 depthwise + 3 downsample convs; the Linears are MatMul + Add.
    "convnext_tiny": Arch(10, 1_433_224, (1, 3, 128, 128), (1, 1000), opset=18),
    "crnn": Arch(7, 1_552_741, (-1, 3, 32, 128), (31, -1, 37), gemms=0),
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



# Inputs of these ops that hold learnable weights (BN: scale and bias, not the running stats).
_WEIGHT_SLOTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2),
    "LayerNormalization": (1, 2), "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "MatMul": (0, 1),
}



def _param_count(model: onnx.ModelProto) -> int:
    """Learnable parameters, torchvision style (BN running stats excluded).

    Weight inputs of the ops in ``_WEIGHT_SLOTS``, plus the per-channel tensors
    of elementwise ``Add``/``Mul`` named like state_dict entries (Linear bias
    after a ``MatMul``, a spelt-out LayerNorm's affine, ConvNeXt's layer scale
    ``gamma``), but not constants such as YOLO's anchors and strides.
    """
    consts = constants(model)
    used: set[str] = set()
    for node in model.graph.node:
        if node.op_type in _WEIGHT_SLOTS:
            used.update(node.input[i] for i in _WEIGHT_SLOTS[node.op_type] if i < len(node.input))
        elif node.op_type in ("Add", "Mul"):
            used.update(i for i in node.input if i.endswith((".weight", ".bias", ".gamma")))
    return sum(consts[n].size for n in used if n in consts)








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
    assert [(o.domain, o.version) for o in model.opset_import] == [("", EXPECTED[name].opset)]


def test_architecture(named_model):
    name, model = named_model
    arch = EXPECTED[name]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == arch.convs
    assert ops.count("Gemm") == arch.gemms
    assert _param_count(model) == arch.params
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["output"]
    assert shape_of(model.graph.input[0]) == arch.in_shape
    assert shape_of(model.graph.output[0]) == arch.out_shape
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names) and all(names)


def test_efficientnet_same_pad_chain():
    model = zoo.get("efficientnet_lite0")
    prod = producers(model)
    pads = [n for n in model.graph.node if n.op_type == "Pad"]
    stride2 = [n for n in model.graph.node if n.op_type == "Conv" and attr(n, "strides") == [2, 2]]
    assert len(pads) == len(stride2) == 5
    consumers = {i: n for n in model.graph.node for i in n.input}
    for conv in stride2:
        assert attr(conv, "pads") == [0, 0, 0, 0]
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
        if conv.op_type == "Conv" and attr(conv, "strides") == [1, 1]:
            k = attr(conv, "kernel_shape")[0]
            assert attr(conv, "pads") == [(k - 1) // 2] * 4


def test_efficientnet_pad_values():
    """The constant chains evaluate to TF SAME pads and give TF output sizes."""
    model = zoo.get("efficientnet_lite0")
    prod = producers(model)
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
    arch = EXPECTED[name]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(concrete(arch.in_shape)).astype(np.float32)
    (y,) = sess.run(None, {"input": x})
    assert y.shape == concrete(arch.out_shape) and y.dtype == np.float32
    assert np.isfinite(y).all()
    # Keeps compiler-vs-ORT comparisons at rtol=atol=1e-4 meaningful.
    assert 0.1 <= float(np.abs(y).max()) <= arch.out_max
    # Random weights must not saturate the network into a constant.
    assert float(y.std()) > 0.05
