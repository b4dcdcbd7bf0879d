"""torchvision ResNeXt-50 32x4d (ResNet-50 v1.5 layout with grouped 3x3 convs)."""

from __future__ import annotations

import onnx

from .builder import GraphBuilder

_GROUPS, _WIDTH_PER_GROUP = 32, 4
_LAYERS = (3, 4, 6, 3)
_RESIDUAL_GAMMA = (0.1, 0.3)
_SIZE = 128  # input height and width


def _bottleneck(g: GraphBuilder, x: str, planes: int, stride: int, p: str) -> str:
    in_ch = g.shape(x)[1]
    width = planes * _WIDTH_PER_GROUP // 64 * _GROUPS
    out_ch = planes * 4
    y = g.conv_bn(x, width, 1, pad=0, conv_name=f"{p}.conv1", bn_name=f"{p}.bn1", act="relu",
                  act_name=f"{p}.relu1")
    y = g.conv_bn(y, width, 3, stride, groups=_GROUPS, conv_name=f"{p}.conv2",
                  bn_name=f"{p}.bn2", act="relu", act_name=f"{p}.relu2")
    y = g.conv_bn(y, out_ch, 1, pad=0, conv_name=f"{p}.conv3", bn_name=f"{p}.bn3",
                  gamma=_RESIDUAL_GAMMA)
    if stride != 1 or in_ch != out_ch:
        x = g.conv_bn(x, out_ch, 1, stride, pad=0, conv_name=f"{p}.downsample.0",
                      bn_name=f"{p}.downsample.1")
    return g.relu(g.add(y, x, name=f"{p}.add"), name=f"{p}.relu3")


def resnext50_32x4d() -> onnx.ModelProto:
    """ResNeXt-50 32x4d as in torchvision, 128x128 input: 53 convs, 25,028,904 parameters.

    Exporter style: torch legacy exporter, opset 17, weights as initializers
    (like the ResNet models). Published widths; the 3x3 conv of every
    bottleneck is grouped (``group=32``). The input is reduced from 224x224
    to 128x128 to keep tests fast (the final feature map is 4x4).

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 128, 128), output ``output`` (1, 1000).
    """
    g = GraphBuilder(seed=3204, input_shape=(1, 3, _SIZE, _SIZE))
    x = g.conv_bn(g.input_name, 64, 7, 2, pad=3, conv_name="conv1", bn_name="bn1", act="relu",
                  act_name="relu")
    x = g.max_pool(x, 3, 2, 1, name="maxpool")
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), _LAYERS), start=1):
        for j in range(n):
            x = _bottleneck(g, x, planes, 2 if (j == 0 and i > 1) else 1, f"layer{i}.{j}")
    x = g.flatten(g.global_avg_pool(x, name="avgpool"), name="flatten")
    out = g.gemm(x, 1000, name="fc", output="output")
    return g.build("resnext50_32x4d", out, doc="torchvision resnext50_32x4d architecture, random weights")
