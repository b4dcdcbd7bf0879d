"""The zoo models' exporter-specific structure: what each model is built to exercise (Paddle-style
``Constant`` weights, YOLOv8n's head and box decoding, MobileNetV3's hardswish and SE, DeepLab's ASPP, U-Net's
ConvTranspose, ShuffleNet's shape arithmetic, ResNeXt's grouped convs, ConvNeXt, CRNN's recurrence).
Architecture pins, determinism and onnxruntime runs of every model: ``test_zoo.py``."""

from __future__ import annotations

import pytest

from tvmfuse import zoo

from helpers.onnx_graph import attr, constants, consumers, nodes, producers, run_ort


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
    prod, cons = producers(model), consumers(model)
    inits = {t.name for t in model.graph.initializer}
    consts = constants(model)
    assert not nodes(model, "BatchNormalization")  # folded into conv biases
    convs = nodes(model, "Conv")
    dfl = [c for c in convs if len(c.input) == 2]
    assert len(dfl) == 1 and consts[dfl[0].input[1]].ravel().tolist() == list(range(16))
    # SiLU = x * Sigmoid(x) after every Conv module.
    silu = [n for n in nodes(model, "Mul") if prod.get(n.input[1]) is not None
            and prod[n.input[1]].op_type == "Sigmoid" and prod[n.input[1]].input[0] == n.input[0]]
    assert len(silu) == 57
    # C2f chunks and the head's box/class split: opset-13 Split with constant sizes.
    splits = nodes(model, "Split")
    assert len(splits) == 10 and all(s.input[1] in inits for s in splits)
    # SPPF: three 5x5 stride-1 pad-2 MaxPools in a chain, all four tensors concatenated.
    pools = nodes(model, "MaxPool")
    assert [prod[p.input[0]].op_type for p in pools] == ["Mul", "MaxPool", "MaxPool"]
    for p in pools:
        assert (attr(p, "kernel_shape"), attr(p, "strides"), attr(p, "pads")) == ([5, 5], [1, 1], [2] * 4)
    assert cons[pools[2].output[0]][0].op_type == "Concat"
    assert len(cons[pools[2].output[0]][0].input) == 4
    # nearest x2 upsampling the way torch writes nn.Upsample.
    resizes = nodes(model, "Resize")
    assert len(resizes) == 2
    for r in resizes:
        assert r.input[1] == "" and consts[r.input[2]].tolist() == [1, 1, 2, 2]
        assert (attr(r, "mode"), attr(r, "coordinate_transformation_mode"),
                attr(r, "nearest_mode")) == (b"nearest", b"asymmetric", b"floor")
    # DFL: Reshape (1, 4, 16, A) -> Transpose -> Softmax(axis 1) -> Conv -> Reshape (1, 4, A).
    (sm,) = nodes(model, "Softmax")
    assert attr(sm, "axis") == 1
    tr = prod[sm.input[0]]
    assert tr.op_type == "Transpose" and attr(tr, "perm") == [0, 2, 1, 3]
    assert consts[prod[tr.input[0]].input[1]].tolist() == [1, 4, 16, 2100]
    assert cons[sm.output[0]] == dfl
    out = prod["output"]
    assert out.op_type == "Concat" and prod[out.input[1]].op_type == "Sigmoid"


def test_yolov8n_decodes_boxes_in_pixels():
    model = zoo.get("yolov8n")
    y = run_ort(model)["output"][0]
    scores, wh = y[4:], y[2:4]
    assert ((scores >= 0) & (scores <= 1)).all()
    assert ((scores > 0.01) & (scores < 0.99)).mean() > 0.5  # mostly unsaturated
    assert (wh >= 0).all() and wh.max() <= 30 * 32  # 2 * (reg_max - 1) * stride at most


def test_mobilenet_v3_large_structure():
    model = zoo.get("mobilenet_v3_large")
    prod = producers(model)
    hsig = nodes(model, "HardSigmoid")
    assert len(hsig) == 8
    for h in hsig:
        assert attr(h, "alpha") == pytest.approx(1 / 6) and attr(h, "beta") == pytest.approx(0.5)
        chain, node = [], h
        for _ in range(4):
            node = prod[node.input[0]]
            chain.append(node.op_type)
        assert chain == ["Conv", "Relu", "Conv", "GlobalAveragePool"]
    assert len(nodes(model, "HardSwish")) == 21
    gemm2 = prod["output"]
    assert gemm2.op_type == "Gemm" and prod[gemm2.input[0]].op_type == "HardSwish"
    assert prod[prod[gemm2.input[0]].input[0]].op_type == "Gemm"


def test_deeplab_structure():
    model = zoo.get("deeplabv3_mobilenet_v2")
    prod = producers(model)
    consts = constants(model)
    dilated = [c for c in nodes(model, "Conv") if attr(c, "dilations") != [1, 1]]
    dw = [c for c in dilated if attr(c, "group") > 1]
    assert {tuple(attr(c, "dilations")) for c in dw} == {(2, 2), (4, 4)}
    for c in dw:  # depthwise: one input channel per group, "same" padding for the rate
        assert consts[c.input[1]].shape[1] == 1 and attr(c, "pads") == [attr(c, "dilations")[0]] * 4
    aspp = [c for c in dilated if attr(c, "group") == 1]
    assert sorted(attr(c, "dilations")[0] for c in aspp) == [6, 12, 18]
    resizes = {attr(r, "coordinate_transformation_mode"): r for r in nodes(model, "Resize")}
    assert set(resizes) == {b"align_corners", b"half_pixel"}
    assert all(attr(r, "mode") == b"linear" for r in resizes.values())
    pool = resizes[b"align_corners"]  # image pooling branch: sizes from Shape at run time
    assert prod[pool.input[3]].op_type == "Concat"
    assert {prod[prod[i].input[0]].op_type for i in prod[pool.input[3]].input} == {"Shape"}
    assert prod[prod[pool.input[0]].input[0]].op_type == "BatchNormalization"
    final = resizes[b"half_pixel"]
    assert final.output[0] == "output" and consts[final.input[3]].tolist() == [1, 21, 160, 160]


def test_unet_structure():
    model = zoo.get("unet")
    consts = constants(model)
    ups = nodes(model, "ConvTranspose")
    assert len(ups) == 4 and all(len(u.input) == 3 for u in ups)  # with bias
    shapes = [consts[u.input[1]].shape for u in ups]
    assert shapes == [(256, 128, 3, 3), (128, 64, 2, 2), (64, 1, 2, 2), (32, 16, 2, 2)]
    assert attr(ups[0], "output_padding") == [1, 1] and attr(ups[0], "pads") == [1] * 4
    assert [attr(u, "group") for u in ups] == [1, 1, 64, 1]
    assert all(attr(u, "strides") == [2, 2] for u in ups)
    assert len(nodes(model, "Concat")) == 4 and len(nodes(model, "MaxPool")) == 4
    res = run_ort(model, [u.output[0] for u in ups])
    assert [res[u.output[0]].shape[2] for u in ups] == [16, 32, 64, 128]


def test_shufflenet_shape_arithmetic():
    model = zoo.get("shufflenet_v2")
    prod = producers(model)
    reshapes = nodes(model, "Reshape")
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
    assert all(attr(t, "perm") == [0, 2, 1, 3, 4] for t in nodes(model, "Transpose"))
    splits = nodes(model, "Split")
    assert len(splits) == 13 and all(prod[s.input[1]].op_type == "Constant" for s in splits)
    res = run_ort(model, [r.input[1] for r in traced[:2]])
    assert res[traced[0].input[1]].tolist() == [1, 2, 58, 28, 28]
    assert res[traced[1].input[1]].tolist() == [1, -1, 28, 28]


def test_resnext_grouped_convs():
    model = zoo.get("resnext50_32x4d")
    consts = constants(model)
    grouped = [c for c in nodes(model, "Conv") if attr(c, "group") != 1]
    assert len(grouped) == 16 and all(attr(c, "group") == 32 for c in grouped)
    widths = [consts[c.input[1]].shape for c in grouped]
    assert widths[0] == (128, 4, 3, 3) and widths[-1] == (1024, 32, 3, 3)


def test_convnext_structure():
    model = zoo.get("convnext_tiny")
    prod, cons = producers(model), consumers(model)
    assert len(nodes(model, "Erf")) == 6 and len(nodes(model, "MatMul")) == 12
    assert len(nodes(model, "LayerNormalization")) == 2
    # Opset 18: ReduceMean takes its axes as an input, never as an attribute.
    means = nodes(model, "ReduceMean")
    assert all(len(m.input) == 2 and attr(m, "axes") is None for m in means)
    # Spelt-out LayerNorm: ReduceMean -> Sub -> Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul -> Add.
    spelt = [m for m in means if cons[m.output[0]][0].op_type == "Sub"]
    assert len(spelt) == 9  # stem + 3 downsample (channels first) + 5 blocks (channels last)
    axes = sorted(int(constants(model)[m.input[1]][0]) for m in spelt)
    assert axes == [-1] * 5 + [1] * 4
    for m in spelt:
        chain, node = [], cons[m.output[0]][0]
        for _ in range(8):
            chain.append(node.op_type)
            node = cons[node.output[0]][0]
        assert chain == ["Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]
    # Blocks: 7x7 depthwise conv -> Transpose to channels last.
    dw = [c for c in nodes(model, "Conv") if attr(c, "group") > 1]
    assert len(dw) == 6
    for c in dw:
        assert attr(c, "kernel_shape") == [7, 7] and attr(c, "pads") == [3] * 4
        assert attr(cons[c.output[0]][0], "perm") == [0, 2, 3, 1]
    # GELU = x * (1 + Erf(x / sqrt 2)) * 0.5
    for erf in nodes(model, "Erf"):
        assert prod[erf.input[0]].op_type == "Div"
        assert cons[erf.output[0]][0].op_type == "Add"
    stem = nodes(model, "Conv")[0]
    assert attr(stem, "kernel_shape") == [4, 4] and attr(stem, "strides") == [4, 4]


def test_crnn_structure():
    model = zoo.get("crnn")
    prod, cons = producers(model), consumers(model)
    consts = constants(model)
    (lstm,) = nodes(model, "LSTM")
    (gru,) = nodes(model, "GRU")
    assert attr(lstm, "direction") == b"bidirectional" and attr(gru, "direction") == b"bidirectional"
    assert attr(gru, "linear_before_reset") == 1
    assert len(lstm.input) == len(gru.input) == 4  # X, W, R, B; no initial states
    assert consts[lstm.input[3]].shape == (2, 8 * 48) and consts[gru.input[3]].shape == (2, 6 * 48)
    for rnn in (lstm, gru):  # Y (T, 2, N, H) -> Transpose -> Reshape [0, 0, -1] -> (T, N, 2H)
        tr = cons[rnn.output[0]][0]
        assert tr.op_type == "Transpose" and attr(tr, "perm") == [0, 2, 1, 3]
        rs = cons[tr.output[0]][0]
        assert rs.op_type == "Reshape" and consts[rs.input[1]].tolist() == [0, 0, -1]
    assert prod[prod[lstm.input[0]].input[0]].op_type == "Squeeze"
    pools = [(attr(p, "kernel_shape"), attr(p, "strides")) for p in nodes(model, "MaxPool")]
    assert pools == [([2, 2], [2, 2])] * 2 + [([2, 1], [2, 1])] * 2
    y = run_ort(model)["output"]
    assert y.shape == (31, 1, 37)
