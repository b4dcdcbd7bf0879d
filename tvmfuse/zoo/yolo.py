"""Ultralytics YOLOv8n as ``model.export(format="onnx")`` writes it (BN folded into the convs)."""

from __future__ import annotations

import numpy as np
import onnx

from . import layers as L
from .builder import GraphBuilder

# yolov8.yaml at scale "n": depth 0.33, width 0.25, max channels 1024.
_DEPTH, _WIDTH, _MAX_CH = 0.33, 0.25, 1024
_NC, _REG_MAX = 80, 16
_STRIDES = (8, 16, 32)
# Extra He gain for the BN-free (folded) SiLU convs, so random features stay O(1) as trained BN
# statistics would keep them (SiLU's own gain is ~1.19, but SPPF max-pools and C2f concats add
# energy; 1.0 lets the head fade to constants, 1.19 blows it up).
_SILU_GAIN = 1.1
# Smaller scale on the last conv of a residual Bottleneck, so the skip stream stays O(1).
_RESIDUAL_GAIN = 0.4
_SIZE = 320  # input height and width


def _ch(c: int) -> int:
    return int(np.ceil(min(c, _MAX_CH) * _WIDTH / 8) * 8)


def _n(n: int) -> int:
    return max(round(n * _DEPTH), 1)


def _conv(g: GraphBuilder, x: str, c: int, k: int, s: int, p: str, gain: float = _SILU_GAIN) -> str:
    """Ultralytics ``Conv`` after ``fuse()``: Conv2d with bias (BN folded in), then SiLU."""
    y = g.conv(x, c, k, s, bias=True, name=f"{p}.conv", gain=gain)
    return L.silu(g, y, f"{p}.act")


def _c2f(g: GraphBuilder, x: str, c2: int, n: int, shortcut: bool, p: str) -> str:
    c = c2 // 2
    y = _conv(g, x, 2 * c, 1, 1, f"{p}.cv1")
    ys = L.split(g, y, [c, c], 1, f"{p}.split")  # cv1(x).chunk(2, 1)
    for i in range(n):
        b = _conv(g, ys[-1], c, 3, 1, f"{p}.m.{i}.cv1")
        b = _conv(g, b, c, 3, 1, f"{p}.m.{i}.cv2", _RESIDUAL_GAIN if shortcut else _SILU_GAIN)
        ys.append(L.binary(g, "Add", ys[-1], b, f"{p}.m.{i}.add") if shortcut else b)
    return _conv(g, L.concat(g, ys, 1, f"{p}.cat"), c2, 1, 1, f"{p}.cv2")


def _sppf(g: GraphBuilder, x: str, c2: int, p: str) -> str:
    y = [_conv(g, x, g.shape(x)[1] // 2, 1, 1, f"{p}.cv1")]
    for i in range(3):  # the same MaxPool2d(5, 1, 2) applied three times in a chain
        y.append(g.max_pool(y[-1], 5, 1, 2, name=f"{p}.m.{i}"))
    return _conv(g, L.concat(g, y, 1, f"{p}.cat"), c2, 1, 1, f"{p}.cv2")


def _upsample(g: GraphBuilder, x: str, p: str) -> str:
    # nn.Upsample(scale_factor=2, mode="nearest")
    return L.resize(g, x, p, "nearest", "asymmetric", scales=[1.0, 1.0, 2.0, 2.0])


def _anchors(sizes: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """``make_anchors(feats, strides, 0.5)``, transposed as ``Detect`` stores them."""
    pts, strides = [], []
    for (h, w), s in zip(sizes, _STRIDES):
        sy, sx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        pts.append(np.stack([sx, sy], -1).reshape(-1, 2))
        strides.append(np.full((h * w, 1), s))
    anchors = np.concatenate(pts).T[None].astype(np.float32)  # (1, 2, A)
    return anchors, np.concatenate(strides).T.astype(np.float32)  # (1, A)


def _detect(g: GraphBuilder, feats: list[str], p: str) -> str:
    c2 = max(16, g.shape(feats[0])[1] // 4, _REG_MAX * 4)
    c3 = max(g.shape(feats[0])[1], min(_NC, 100))
    no = _NC + 4 * _REG_MAX
    flat = []
    for i, x in enumerate(feats):
        box = _conv(g, _conv(g, x, c2, 3, 1, f"{p}.cv2.{i}.0"), c2, 3, 1, f"{p}.cv2.{i}.1")
        box = g.conv(box, 4 * _REG_MAX, 1, bias=True, name=f"{p}.cv2.{i}.2")
        cls = _conv(g, _conv(g, x, c3, 3, 1, f"{p}.cv3.{i}.0"), c3, 3, 1, f"{p}.cv3.{i}.1")
        cls = g.conv(cls, _NC, 1, bias=True, name=f"{p}.cv3.{i}.2")
        y = L.concat(g, [box, cls], 1, f"{p}.cat.{i}")
        flat.append(L.reshape(g, y, [1, no, -1], f"{p}.view.{i}"))  # xi.view(b, no, -1)
    x = L.concat(g, flat, 2, f"{p}.cat")
    a = g.shape(x)[2]
    box, cls = L.split(g, x, [4 * _REG_MAX, _NC], 1, f"{p}.split")
    # DFL: conv(x.view(b, 4, 16, a).transpose(2, 1).softmax(1)).view(b, 4, a)
    d = L.reshape(g, box, [1, 4, _REG_MAX, a], f"{p}.dfl.view")
    d = L.transpose(g, d, [0, 2, 1, 3], f"{p}.dfl.transpose")
    d = L.unary(g, "Softmax", d, f"{p}.dfl.softmax", axis=1)
    arange = np.arange(_REG_MAX, dtype=np.float32).reshape(1, _REG_MAX, 1, 1)
    d = g._node("Conv", [d, g._init(f"{p}.dfl.conv.weight", arange)], f"{p}.dfl.conv",
                (1, 1, 4, a), kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0],
                dilations=[1, 1], group=1)
    d = L.reshape(g, d, [1, 4, a], f"{p}.dfl.view_out")
    # dist2bbox(d, anchors, xywh=True, dim=1) * strides
    anchors, strides = _anchors([g.shape(f)[2:] for f in feats])
    anchors = g._init(f"{p}.anchors", anchors)
    lt, rb = L.split(g, d, [2, 2], 1, f"{p}.chunk")
    x1y1 = L.binary(g, "Sub", anchors, lt, f"{p}.x1y1")
    x2y2 = L.binary(g, "Add", anchors, rb, f"{p}.x2y2")
    c_xy = L.binary(g, "Add", x1y1, x2y2, f"{p}.c_xy.add")
    c_xy = L.binary(g, "Div", c_xy, L.scalar(g, f"{p}.two", 2.0), f"{p}.c_xy")
    wh = L.binary(g, "Sub", x2y2, x1y1, f"{p}.wh")
    dbox = L.concat(g, [c_xy, wh], 1, f"{p}.dbox.cat")
    dbox = L.binary(g, "Mul", dbox, g._init(f"{p}.strides", strides), f"{p}.dbox")
    cls = L.unary(g, "Sigmoid", cls, f"{p}.cls.sigmoid")
    return g._node("Concat", [dbox, cls], f"{p}.output", (1, 4 + _NC, a), output="output", axis=1)


def yolov8n() -> onnx.ModelProto:
    """YOLOv8n (Ultralytics, 80 classes) at a 320x320 input: 64 convs, 3,151,904 params.

    Exporter style: Ultralytics ``export(format="onnx")`` (torch legacy
    exporter, opset 17, weights as initializers). BN is folded into conv
    biases, SiLU is ``Sigmoid`` + ``Mul``, C2f splits with ``Split``, SPPF
    chains three 5x5 MaxPools, upsampling is nearest ``Resize`` by scales, and
    the Detect head decodes boxes with the DFL (Softmax + fixed ``arange``
    1x1 conv) and ``dist2bbox`` against constant anchors and strides. The
    parameter count equals Ultralytics' fused yolov8n (it does not depend on
    the input size, which is reduced from 640 to keep tests fast).

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 320, 320), output ``output`` (1, 84, 2100):
        ``cx, cy, w, h`` in pixels, then 80 class scores, per anchor.
    """
    g = GraphBuilder(seed=8, input_shape=(1, 3, _SIZE, _SIZE))
    x = _conv(g, g.input_name, _ch(64), 3, 2, "model.0")
    x = _conv(g, x, _ch(128), 3, 2, "model.1")
    x = _c2f(g, x, _ch(128), _n(3), True, "model.2")
    x = _conv(g, x, _ch(256), 3, 2, "model.3")
    p3 = _c2f(g, x, _ch(256), _n(6), True, "model.4")
    x = _conv(g, p3, _ch(512), 3, 2, "model.5")
    p4 = _c2f(g, x, _ch(512), _n(6), True, "model.6")
    x = _conv(g, p4, _ch(1024), 3, 2, "model.7")
    x = _c2f(g, x, _ch(1024), _n(3), True, "model.8")
    p5 = _sppf(g, x, _ch(1024), "model.9")
    # Head: top-down (FPN) then bottom-up (PAN) paths.
    x = L.concat(g, [_upsample(g, p5, "model.10"), p4], 1, "model.11")
    h4 = _c2f(g, x, _ch(512), _n(3), False, "model.12")
    x = L.concat(g, [_upsample(g, h4, "model.13"), p3], 1, "model.14")
    o3 = _c2f(g, x, _ch(256), _n(3), False, "model.15")
    x = L.concat(g, [_conv(g, o3, _ch(256), 3, 2, "model.16"), h4], 1, "model.17")
    o4 = _c2f(g, x, _ch(512), _n(3), False, "model.18")
    x = L.concat(g, [_conv(g, o4, _ch(512), 3, 2, "model.19"), p5], 1, "model.20")
    o5 = _c2f(g, x, _ch(1024), _n(3), False, "model.21")
    out = _detect(g, [o3, o4, o5], "model.22")
    return g.build("yolov8n", out, doc="Ultralytics yolov8n architecture (fused), random weights")
