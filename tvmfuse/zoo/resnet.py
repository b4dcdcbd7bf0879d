"""torchvision ResNet-18 / ResNet-50 (v1.5: stride on the bottleneck 3x3)."""

from __future__ import annotations

import onnx

from .builder import GraphBuilder

# Small gamma on the last BN of each residual branch keeps the skip stream
# from growing block after block with random weights.
_RESIDUAL_GAMMA = (0.1, 0.3)


def _basic_block(g: GraphBuilder, x: str, planes: int, stride: int, p: str) -> str:
    in_ch = g.shape(x)[1]
    y = g.conv_bn(x, planes, 3, stride, conv_name=f"{p}.conv1", bn_name=f"{p}.bn1",
                  act="relu", act_name=f"{p}.relu1")
    y = g.conv_bn(y, planes, 3, 1, conv_name=f"{p}.conv2", bn_name=f"{p}.bn2",
                  gamma=_RESIDUAL_GAMMA)
    if stride != 1 or in_ch != planes:
        x = g.conv_bn(x, planes, 1, stride, pad=0, conv_name=f"{p}.downsample.0",
                      bn_name=f"{p}.downsample.1")
    return g.relu(g.add(y, x, name=f"{p}.add"), name=f"{p}.relu2")


def _bottleneck(g: GraphBuilder, x: str, planes: int, stride: int, p: str) -> str:
    in_ch = g.shape(x)[1]
    out_ch = planes * 4
    y = g.conv_bn(x, planes, 1, 1, pad=0, conv_name=f"{p}.conv1", bn_name=f"{p}.bn1",
                  act="relu", act_name=f"{p}.relu1")
    y = g.conv_bn(y, planes, 3, stride, conv_name=f"{p}.conv2", bn_name=f"{p}.bn2",
                  act="relu", act_name=f"{p}.relu2")
    y = g.conv_bn(y, out_ch, 1, 1, pad=0, conv_name=f"{p}.conv3", bn_name=f"{p}.bn3",
                  gamma=_RESIDUAL_GAMMA)
    if stride != 1 or in_ch != out_ch:
        x = g.conv_bn(x, out_ch, 1, stride, pad=0, conv_name=f"{p}.downsample.0",
                      bn_name=f"{p}.downsample.1")
    return g.relu(g.add(y, x, name=f"{p}.add"), name=f"{p}.relu3")


def _resnet(name: str, block, layers: list[int], seed: int) -> onnx.ModelProto:
    g = GraphBuilder(seed)
    x = g.conv_bn(g.input_name, 64, 7, 2, pad=3, conv_name="conv1", bn_name="bn1",
                  act="relu", act_name="relu")
    x = g.max_pool(x, 3, 2, 1, name="maxpool")
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers), start=1):
        for j in range(n):
            stride = 2 if (j == 0 and i > 1) else 1
            x = block(g, x, planes, stride, f"layer{i}.{j}")
    x = g.flatten(g.global_avg_pool(x, name="avgpool"), name="flatten")
    out = g.gemm(x, 1000, name="fc", output="output")
    return g.build(name, out, doc=f"torchvision {name} architecture, random weights")


def resnet18() -> onnx.ModelProto:
    """ResNet-18 (BasicBlock x [2, 2, 2, 2]), 11,689,512 parameters.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 224, 224), output ``output`` (1, 1000).
    """
    return _resnet("resnet18", _basic_block, [2, 2, 2, 2], seed=18)


def resnet50() -> onnx.ModelProto:
    """ResNet-50 v1.5 (Bottleneck x [3, 4, 6, 3]), 25,557,032 parameters.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 224, 224), output ``output`` (1, 1000).
    """
    return _resnet("resnet50", _bottleneck, [3, 4, 6, 3], seed=50)
