"""DeepLabV3 with a dilated MobileNetV2 backbone (the common ``deeplabv3_mobilenet`` port)."""

from __future__ import annotations

import numpy as np
import onnx

from . import layers as L
from .builder import GraphBuilder
from .mobilenet import SETTINGS, inverted_residual, make_divisible

_WIDTH = 0.5
_OUTPUT_STRIDE = 8
# torchvision's DeepLabHead uses rates (12, 24, 36) at output stride 8; halved here because the
# feature map of the small input is only 20x20.
_RATES = (6, 12, 18)
_ASPP_CH = 256
_NUM_CLASSES = 21
_SIZE = 160  # input height and width


def _backbone(g: GraphBuilder) -> str:
    """MobileNetV2 ``features[:-1]`` with strides past the output stride turned into dilation."""
    x = g.conv_bn(g.input_name, make_divisible(32 * _WIDTH), 3, 2, conv_name="backbone.0.0",
                  bn_name="backbone.0.1", act="relu6", act_name="backbone.0.2")
    idx, current_stride, dilation = 1, 2, 1
    for t, c, n, s in SETTINGS:
        previous_dilation = dilation
        if current_stride == _OUTPUT_STRIDE:
            stride, dilation = 1, dilation * s
        else:
            stride, current_stride = s, current_stride * s
        for j in range(n):
            x = inverted_residual(g, x, make_divisible(c * _WIDTH), stride if j == 0 else 1, t, f"backbone.{idx}",
                                  dilation=previous_dilation if j == 0 else dilation)
            idx += 1
    return x


def _aspp(g: GraphBuilder, x: str, p: str) -> str:
    n, _, h, w = g.shape(x)
    branches = [g.conv_bn(x, _ASPP_CH, 1, pad=0, conv_name=f"{p}.convs.0.0",
                          bn_name=f"{p}.convs.0.1", act="relu", act_name=f"{p}.convs.0.2")]
    for i, rate in enumerate(_RATES, start=1):
        branches.append(g.conv_bn(x, _ASPP_CH, 3, dilation=rate, conv_name=f"{p}.convs.{i}.0",
                                  bn_name=f"{p}.convs.{i}.1", act="relu",
                                  act_name=f"{p}.convs.{i}.2"))
    # ASPPPooling: the upsample size comes from x.shape[-2:], so torch's legacy exporter computes
    # Resize's `sizes` at run time (Shape -> Slice [-2:], concatenated with the pooled N, C).
    q = f"{p}.convs.4"
    y = g.global_avg_pool(x, name=f"{q}.0")
    y = g.conv_bn(y, _ASPP_CH, 1, pad=0, conv_name=f"{q}.1", bn_name=f"{q}.2", act="relu",
                  act_name=f"{q}.3")
    i64 = np.int64
    hw = g._node("Slice", [g._node("Shape", [x], f"{q}.shape_x", (4,)),
                           g._const(f"{q}.hw_starts", np.array([-2], i64)),
                           g._const(f"{q}.hw_ends", np.array([2**63 - 1], i64)),
                           g._const(f"{q}.hw_axes", np.array([0], i64))], f"{q}.hw", (2,))
    nc = g._node("Slice", [g._node("Shape", [y], f"{q}.shape_y", (4,)),
                           g._const(f"{q}.nc_starts", np.array([0], i64)),
                           g._const(f"{q}.nc_ends", np.array([2], i64)),
                           g._const(f"{q}.nc_axes", np.array([0], i64))], f"{q}.nc", (2,))
    sizes = g._node("Concat", [nc, hw], f"{q}.sizes", (4,), axis=0)
    # align_corners=True (as the pytorch-deeplab-xception port writes it; the source is 1x1).
    branches.append(L.resize(g, y, f"{q}.upsample", "linear", "align_corners", sizes=sizes,
                             out_shape=(n, _ASPP_CH, h, w)))
    y = L.concat(g, branches, 1, f"{p}.cat")
    return g.conv_bn(y, _ASPP_CH, 1, pad=0, conv_name=f"{p}.project.0", bn_name=f"{p}.project.1",
                     act="relu", act_name=f"{p}.project.2")


def deeplabv3_mobilenet_v2() -> onnx.ModelProto:
    """DeepLabV3, MobileNetV2 backbone (width 0.5, output stride 8), 160x160 input: 59 convs.

    Exporter style: torch legacy exporter, opset 17, weights as initializers,
    the ASPP pooling branch's ``Resize`` sizes computed at run time from
    ``Shape``. The backbone turns the strides past output stride 8 into
    dilated depthwise convs (dilation 2 and 4, ``group`` = channels); the
    ASPP has a 1x1 conv, three dilated 3x3 convs (rates 6/12/18, halved from
    torchvision's output-stride-8 rates for the small input) and an image
    pooling branch (``GlobalAveragePool`` -> conv -> bilinear ``Resize``,
    ``align_corners`` mode). The classifier output is resized back to the
    input with ``mode=linear``, ``half_pixel`` (torch ``align_corners=False``).
    Width 0.5 and 160x160 (not 513x513) keep it fast; 21 classes (VOC).

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 160, 160), output ``output`` (1, 21, 160, 160).
    """
    g = GraphBuilder(seed=21, input_shape=(1, 3, _SIZE, _SIZE))
    x = _backbone(g)
    x = _aspp(g, x, "classifier.0")
    x = g.conv_bn(x, _ASPP_CH, 3, conv_name="classifier.1", bn_name="classifier.2", act="relu",
                  act_name="classifier.3")
    x = g.conv(x, _NUM_CLASSES, 1, pad=0, bias=True, name="classifier.4")
    # F.interpolate(x, size=input_shape, mode="bilinear", align_corners=False)
    out = L.resize(g, x, "upsample", "linear", "half_pixel",
                   sizes=(1, _NUM_CLASSES, _SIZE, _SIZE), output="output")
    return g.build("deeplabv3_mobilenet_v2", out,
                   doc="DeepLabV3 + dilated MobileNetV2 (width 0.5, OS 8) architecture, random weights")
