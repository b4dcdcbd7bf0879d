"""Tests for tvmfuse.zoo: architecture pins, determinism and onnxruntime runs."""

from __future__ import annotations

import subprocess
import sys
from typing import NamedTuple

import numpy as np
import onnx
import pytest

from tvmfuse import zoo

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


def _shape(value_info: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)


# Inputs of these ops that hold learnable weights (BN: scale and bias, not the running stats).
_WEIGHT_SLOTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "BatchNormalization": (1, 2),
    "LayerNormalization": (1, 2), "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "MatMul": (0, 1),
}


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and ``Constant``-node values (Paddle-style models use the latter)."""
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
    return consts


def _param_count(model: onnx.ModelProto) -> int:
    """Learnable parameters, torchvision style (BN running stats excluded).

    Weight inputs of the ops in ``_WEIGHT_SLOTS``, plus the per-channel tensors
    of elementwise ``Add``/``Mul`` named like state_dict entries (Linear bias
    after a ``MatMul``, a spelt-out LayerNorm's affine, ConvNeXt's layer scale
    ``gamma``), but not constants such as YOLO's anchors and strides.
    """
    consts = _constants(model)
    used: set[str] = set()
    for node in model.graph.node:
        if node.op_type in _WEIGHT_SLOTS:
            used.update(node.input[i] for i in _WEIGHT_SLOTS[node.op_type] if i < len(node.input))
        elif node.op_type in ("Add", "Mul"):
            used.update(i for i in node.input if i.endswith((".weight", ".bias", ".gamma")))
    return sum(consts[n].size for n in used if n in consts)


def _concrete(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if d == -1 else d for d in shape)


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            out.setdefault(i, []).append(node)
    return out


def _attr(node: onnx.NodeProto, name: str, default=None):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name),
                default)


def _nodes(model: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op]


def _run(model: onnx.ModelProto, extra_outputs: list[str] = ()) -> dict[str, np.ndarray]:
    """Run on a seeded standard-normal input; returns every output by name."""
    for t in extra_outputs:
        model.graph.output.append(onnx.ValueInfoProto(name=t))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shape = _concrete(_shape(model.graph.input[0]))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"input": x})))


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
    assert _shape(model.graph.input[0]) == arch.in_shape
    assert _shape(model.graph.output[0]) == arch.out_shape
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
    arch = EXPECTED[name]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(_concrete(arch.in_shape)).astype(np.float32)
    (y,) = sess.run(None, {"input": x})
    assert y.shape == _concrete(arch.out_shape) and y.dtype == np.float32
    assert np.isfinite(y).all()
    # Keeps compiler-vs-ORT comparisons at rtol=atol=1e-4 meaningful.
    assert 0.1 <= float(np.abs(y).max()) <= arch.out_max
    # Random weights must not saturate the network into a constant.
    assert float(y.std()) > 0.05


# ------------------------------------------------------------------ exporter-specific structure

@pytest.mark.parametrize("name", ["mobilenet_v3_large", "crnn"])
def test_paddle_style_constant_weights_and_dynamic_batch(name):
    model = zoo.get(name)
    assert len(model.graph.initializer) == 0
    consts = {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    for node in model.graph.node:
        if node.op_type in ("Conv", "BatchNormalization", "Gemm", "MatMul", "LSTM", "GRU"):
            assert set(node.input[1:]) <= consts, node.name
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].HasField("dim_value") and dims[0].dim_value == -1


def test_yolov8n_structure():
    model = zoo.get("yolov8n")
    prod, cons = _producers(model), _consumers(model)
    inits = {t.name for t in model.graph.initializer}
    consts = _constants(model)
    assert not _nodes(model, "BatchNormalization")  # folded into conv biases
    convs = _nodes(model, "Conv")
    dfl = [c for c in convs if len(c.input) == 2]
    assert len(dfl) == 1 and consts[dfl[0].input[1]].ravel().tolist() == list(range(16))
    # SiLU = x * Sigmoid(x) after every Conv module.
    silu = [n for n in _nodes(model, "Mul") if prod.get(n.input[1]) is not None
            and prod[n.input[1]].op_type == "Sigmoid" and prod[n.input[1]].input[0] == n.input[0]]
    assert len(silu) == 57
    # C2f chunks and the head's box/class split: opset-13 Split with constant sizes.
    splits = _nodes(model, "Split")
    assert len(splits) == 10 and all(s.input[1] in inits for s in splits)
    # SPPF: three 5x5 stride-1 pad-2 MaxPools in a chain, all four tensors concatenated.
    pools = _nodes(model, "MaxPool")
    assert [prod[p.input[0]].op_type for p in pools] == ["Mul", "MaxPool", "MaxPool"]
    for p in pools:
        assert (_attr(p, "kernel_shape"), _attr(p, "strides"), _attr(p, "pads")) == ([5, 5], [1, 1], [2] * 4)
    assert cons[pools[2].output[0]][0].op_type == "Concat"
    assert len(cons[pools[2].output[0]][0].input) == 4
    # nearest x2 upsampling the way torch writes nn.Upsample.
    resizes = _nodes(model, "Resize")
    assert len(resizes) == 2
    for r in resizes:
        assert r.input[1] == "" and consts[r.input[2]].tolist() == [1, 1, 2, 2]
        assert (_attr(r, "mode"), _attr(r, "coordinate_transformation_mode"),
                _attr(r, "nearest_mode")) == (b"nearest", b"asymmetric", b"floor")
    # DFL: Reshape (1, 4, 16, A) -> Transpose -> Softmax(axis 1) -> Conv -> Reshape (1, 4, A).
    (sm,) = _nodes(model, "Softmax")
    assert _attr(sm, "axis") == 1
    tr = prod[sm.input[0]]
    assert tr.op_type == "Transpose" and _attr(tr, "perm") == [0, 2, 1, 3]
    assert consts[prod[tr.input[0]].input[1]].tolist() == [1, 4, 16, 2100]
    assert cons[sm.output[0]] == dfl
    out = prod["output"]
    assert out.op_type == "Concat" and prod[out.input[1]].op_type == "Sigmoid"


def test_yolov8n_decodes_boxes_in_pixels():
    model = zoo.get("yolov8n")
    y = _run(model)["output"][0]
    scores, wh = y[4:], y[2:4]
    assert ((scores >= 0) & (scores <= 1)).all()
    assert ((scores > 0.01) & (scores < 0.99)).mean() > 0.5  # mostly unsaturated
    assert (wh >= 0).all() and wh.max() <= 30 * 32  # 2 * (reg_max - 1) * stride at most


def test_mobilenet_v3_large_structure():
    model = zoo.get("mobilenet_v3_large")
    prod = _producers(model)
    hsig = _nodes(model, "HardSigmoid")
    assert len(hsig) == 8
    for h in hsig:
        assert _attr(h, "alpha") == pytest.approx(1 / 6) and _attr(h, "beta") == pytest.approx(0.5)
        chain, node = [], h
        for _ in range(4):
            node = prod[node.input[0]]
            chain.append(node.op_type)
        assert chain == ["Conv", "Relu", "Conv", "GlobalAveragePool"]
    assert len(_nodes(model, "HardSwish")) == 21
    gemm2 = prod["output"]
    assert gemm2.op_type == "Gemm" and prod[gemm2.input[0]].op_type == "HardSwish"
    assert prod[prod[gemm2.input[0]].input[0]].op_type == "Gemm"


def test_deeplab_structure():
    model = zoo.get("deeplabv3_mobilenet_v2")
    prod = _producers(model)
    consts = _constants(model)
    dilated = [c for c in _nodes(model, "Conv") if _attr(c, "dilations") != [1, 1]]
    dw = [c for c in dilated if _attr(c, "group") > 1]
    assert {tuple(_attr(c, "dilations")) for c in dw} == {(2, 2), (4, 4)}
    for c in dw:  # depthwise: one input channel per group, "same" padding for the rate
        assert consts[c.input[1]].shape[1] == 1 and _attr(c, "pads") == [_attr(c, "dilations")[0]] * 4
    aspp = [c for c in dilated if _attr(c, "group") == 1]
    assert sorted(_attr(c, "dilations")[0] for c in aspp) == [6, 12, 18]
    resizes = {_attr(r, "coordinate_transformation_mode"): r for r in _nodes(model, "Resize")}
    assert set(resizes) == {b"align_corners", b"half_pixel"}
    assert all(_attr(r, "mode") == b"linear" for r in resizes.values())
    pool = resizes[b"align_corners"]  # image pooling branch: sizes from Shape at run time
    assert prod[pool.input[3]].op_type == "Concat"
    assert {prod[prod[i].input[0]].op_type for i in prod[pool.input[3]].input} == {"Shape"}
    assert prod[prod[pool.input[0]].input[0]].op_type == "BatchNormalization"
    final = resizes[b"half_pixel"]
    assert final.output[0] == "output" and consts[final.input[3]].tolist() == [1, 21, 160, 160]


def test_unet_structure():
    model = zoo.get("unet")
    consts = _constants(model)
    ups = _nodes(model, "ConvTranspose")
    assert len(ups) == 4 and all(len(u.input) == 3 for u in ups)  # with bias
    shapes = [consts[u.input[1]].shape for u in ups]
    assert shapes == [(256, 128, 3, 3), (128, 64, 2, 2), (64, 1, 2, 2), (32, 16, 2, 2)]
    assert _attr(ups[0], "output_padding") == [1, 1] and _attr(ups[0], "pads") == [1] * 4
    assert [_attr(u, "group") for u in ups] == [1, 1, 64, 1]
    assert all(_attr(u, "strides") == [2, 2] for u in ups)
    assert len(_nodes(model, "Concat")) == 4 and len(_nodes(model, "MaxPool")) == 4
    res = _run(model, [u.output[0] for u in ups])
    assert [res[u.output[0]].shape[2] for u in ups] == [16, 32, 64, 128]


def test_shufflenet_shape_arithmetic():
    model = zoo.get("shufflenet_v2")
    prod = _producers(model)
    reshapes = _nodes(model, "Reshape")
    assert len(reshapes) == 32
    traced = [r for r in reshapes if prod[r.input[1]].op_type == "Concat"]
    folded = [r for r in reshapes if prod[r.input[1]].op_type == "Constant"]
    assert len(traced) == 16 and len(folded) == 16  # stages 2 and 4 vs stage 3
    for r in traced:
        for i in prod[r.input[1]].input:
            node = prod[i]
            if node.op_type == "Constant":
                continue
            assert node.op_type == "Unsqueeze"
            node = prod[node.input[0]]
            if node.op_type == "Div":
                node = prod[node.input[0]]
            assert node.op_type == "Gather" and prod[node.input[0]].op_type == "Shape"
    assert all(_attr(t, "perm") == [0, 2, 1, 3, 4] for t in _nodes(model, "Transpose"))
    splits = _nodes(model, "Split")
    assert len(splits) == 13 and all(prod[s.input[1]].op_type == "Constant" for s in splits)
    res = _run(model, [r.input[1] for r in traced[:2]])
    assert res[traced[0].input[1]].tolist() == [1, 2, 58, 28, 28]
    assert res[traced[1].input[1]].tolist() == [1, -1, 28, 28]


def test_resnext_grouped_convs():
    model = zoo.get("resnext50_32x4d")
    consts = _constants(model)
    grouped = [c for c in _nodes(model, "Conv") if _attr(c, "group") != 1]
    assert len(grouped) == 16 and all(_attr(c, "group") == 32 for c in grouped)
    widths = [consts[c.input[1]].shape for c in grouped]
    assert widths[0] == (128, 4, 3, 3) and widths[-1] == (1024, 32, 3, 3)


def test_convnext_structure():
    model = zoo.get("convnext_tiny")
    prod, cons = _producers(model), _consumers(model)
    assert len(_nodes(model, "Erf")) == 6 and len(_nodes(model, "MatMul")) == 12
    assert len(_nodes(model, "LayerNormalization")) == 2
    # Opset 18: ReduceMean takes its axes as an input, never as an attribute.
    means = _nodes(model, "ReduceMean")
    assert all(len(m.input) == 2 and _attr(m, "axes") is None for m in means)
    # Spelt-out LayerNorm: ReduceMean -> Sub -> Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul -> Add.
    spelt = [m for m in means if cons[m.output[0]][0].op_type == "Sub"]
    assert len(spelt) == 9  # stem + 3 downsample (channels first) + 5 blocks (channels last)
    axes = sorted(int(_constants(model)[m.input[1]][0]) for m in spelt)
    assert axes == [-1] * 5 + [1] * 4
    for m in spelt:
        chain, node = [], cons[m.output[0]][0]
        for _ in range(8):
            chain.append(node.op_type)
            node = cons[node.output[0]][0]
        assert chain == ["Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]
    # Blocks: 7x7 depthwise conv -> Transpose to channels last.
    dw = [c for c in _nodes(model, "Conv") if _attr(c, "group") > 1]
    assert len(dw) == 6
    for c in dw:
        assert _attr(c, "kernel_shape") == [7, 7] and _attr(c, "pads") == [3] * 4
        assert _attr(cons[c.output[0]][0], "perm") == [0, 2, 3, 1]
    # GELU = x * (1 + Erf(x / sqrt 2)) * 0.5
    for erf in _nodes(model, "Erf"):
        assert prod[erf.input[0]].op_type == "Div"
        assert cons[erf.output[0]][0].op_type == "Add"
    stem = _nodes(model, "Conv")[0]
    assert _attr(stem, "kernel_shape") == [4, 4] and _attr(stem, "strides") == [4, 4]


def test_crnn_structure():
    model = zoo.get("crnn")
    prod, cons = _producers(model), _consumers(model)
    consts = _constants(model)
    (lstm,) = _nodes(model, "LSTM")
    (gru,) = _nodes(model, "GRU")
    assert _attr(lstm, "direction") == b"bidirectional" and _attr(gru, "direction") == b"bidirectional"
    assert _attr(gru, "linear_before_reset") == 1
    assert len(lstm.input) == len(gru.input) == 4  # X, W, R, B; no initial states
    assert consts[lstm.input[3]].shape == (2, 8 * 48) and consts[gru.input[3]].shape == (2, 6 * 48)
    for rnn in (lstm, gru):  # Y (T, 2, N, H) -> Transpose -> Reshape [0, 0, -1] -> (T, N, 2H)
        tr = cons[rnn.output[0]][0]
        assert tr.op_type == "Transpose" and _attr(tr, "perm") == [0, 2, 1, 3]
        rs = cons[tr.output[0]][0]
        assert rs.op_type == "Reshape" and consts[rs.input[1]].tolist() == [0, 0, -1]
    assert prod[prod[lstm.input[0]].input[0]].op_type == "Squeeze"
    pools = [(_attr(p, "kernel_shape"), _attr(p, "strides")) for p in _nodes(model, "MaxPool")]
    assert pools == [([2, 2], [2, 2])] * 2 + [([2, 1], [2, 1])] * 2
    y = _run(model)["output"]
    assert y.shape == (31, 1, 37)
