"""A tiny CNN for fast tests that still exercises every op family of the zoo."""

from __future__ import annotations

import onnx

from .builder import GraphBuilder


def tiny_convnet() -> onnx.ModelProto:
    """Small convnet, input (1, 3, 32, 32), output (1, 10).

    Covers conv+BN+Relu, conv+bias+Relu, a residual block (conv+BN, Add,
    Relu), depthwise conv+BN+Clip (ReLU6), HardSwish and a
    GlobalAveragePool+Flatten+Gemm head. Runs in well under a millisecond.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 32, 32), output ``output`` (1, 10).
    """
    g = GraphBuilder(seed=7, input_shape=(1, 3, 32, 32))
    x = g.conv_bn(g.input_name, 16, 3, conv_name="stem.conv", bn_name="stem.bn",
                  act="relu", act_name="stem.relu")
    x = g.relu(g.conv(x, 32, 3, 2, bias=True, name="down.conv"), name="down.relu")
    # Residual block, ResNet BasicBlock style.
    y = g.conv_bn(x, 32, 3, conv_name="res.conv1", bn_name="res.bn1",
                  act="relu", act_name="res.relu1")
    y = g.conv_bn(y, 32, 3, conv_name="res.conv2", bn_name="res.bn2", gamma=(0.1, 0.3))
    x = g.relu(g.add(y, x, name="res.add"), name="res.relu2")
    x = g.conv_bn(x, 32, 3, 2, groups=32, conv_name="dw.conv", bn_name="dw.bn",
                  act="relu6", act_name="dw.relu6")
    x = g.conv_bn(x, 64, 1, pad=0, conv_name="pw.conv", bn_name="pw.bn")
    x = g.hardswish(x, name="pw.hardswish")
    x = g.flatten(g.global_avg_pool(x, name="avgpool"), name="flatten")
    out = g.gemm(x, 10, name="fc", output="output")
    return g.build("tiny_convnet", out, doc="tiny test convnet, random weights")
