"""torchvision MobileNetV3-Large (width 1.0), written the way paddle2onnx writes models."""

from __future__ import annotations

import onnx

from . import layers as L
from .builder import GraphBuilder
from .mobilenet import make_divisible

# (kernel, expanded channels, output channels, squeeze-excite, activation, stride), as published.
_SETTINGS = [
    (3, 16, 16, False, "relu", 1),
    (3, 64, 24, False, "relu", 2),
    (3, 72, 24, False, "relu", 1),
    (5, 72, 40, True, "relu", 2),
    (5, 120, 40, True, "relu", 1),
    (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hardswish", 2),
    (3, 200, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 480, 112, True, "hardswish", 1),
    (3, 672, 112, True, "hardswish", 1),
    (5, 672, 160, True, "hardswish", 2),
    (5, 960, 160, True, "hardswish", 1),
    (5, 960, 160, True, "hardswish", 1),
]
_RESIDUAL_GAMMA = (0.1, 0.3)
_BN_EPS = 1e-3  # torchvision builds MobileNetV3's BatchNorm2d with eps=0.001


def _squeeze_excite(g: GraphBuilder, x: str, p: str) -> str:
    """torchvision ``SqueezeExcitation`` with ``scale_activation=nn.Hardsigmoid``."""
    c = g.shape(x)[1]
    s = g.global_avg_pool(x, name=f"{p}.avgpool")
    s = g.relu(g.conv(s, make_divisible(c // 4), 1, pad=0, bias=True, name=f"{p}.fc1"),
               name=f"{p}.activation")
    s = g.conv(s, c, 1, pad=0, bias=True, name=f"{p}.fc2")
    s = L.hardsigmoid(g, s, f"{p}.scale_activation")
    return L.binary(g, "Mul", s, x, f"{p}.mul")


def _block(g: GraphBuilder, x: str, k: int, exp: int, out_ch: int, se: bool, act: str,
           stride: int, p: str) -> str:
    in_ch = g.shape(x)[1]
    skip = stride == 1 and in_ch == out_ch
    y, j = x, 0
    if exp != in_ch:
        y = g.conv_bn(y, exp, 1, pad=0, conv_name=f"{p}.block.0.0", bn_name=f"{p}.block.0.1",
                      act=act, act_name=f"{p}.block.0.2")
        j = 1
    y = g.conv_bn(y, exp, k, stride, groups=exp, conv_name=f"{p}.block.{j}.0",
                  bn_name=f"{p}.block.{j}.1", act=act, act_name=f"{p}.block.{j}.2")
    if se:
        j += 1
        y = _squeeze_excite(g, y, f"{p}.block.{j}")
    j += 1
    y = g.conv_bn(y, out_ch, 1, pad=0, conv_name=f"{p}.block.{j}.0", bn_name=f"{p}.block.{j}.1",
                  gamma=_RESIDUAL_GAMMA if skip else (0.5, 1.5))
    return g.add(x, y, name=f"{p}.add") if skip else y


def mobilenet_v3_large() -> onnx.ModelProto:
    """MobileNetV3-Large 1.0 as in torchvision: 62 convs, 5,483,032 parameters.

    Exporter style: paddle2onnx. Every weight is a ``Constant`` node (no
    initializers) and the declared batch dimension is ``-1`` (``dim_value``
    -1); opset 17. Ops as torch writes them: ``HardSwish``, squeeze-excite
    ``GlobalAveragePool -> Conv -> Relu -> Conv -> HardSigmoid(1/6, 0.5) ->
    Mul``, classifier ``Flatten -> Gemm -> HardSwish -> Gemm``. Full width
    and the published 224x224 input (fast enough as published).

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (-1, 3, 224, 224), output ``output`` (-1, 1000).
    """
    g = GraphBuilder(seed=3, input_shape=(-1, 3, 224, 224), bn_eps=_BN_EPS, const_weights=True)
    x = g.conv_bn(g.input_name, 16, 3, 2, conv_name="features.0.0", bn_name="features.0.1",
                  act="hardswish", act_name="features.0.2")
    for i, (k, exp, c, se, act, s) in enumerate(_SETTINGS, start=1):
        x = _block(g, x, k, exp, c, se, act, s, f"features.{i}")
    i = len(_SETTINGS) + 1
    x = g.conv_bn(x, 6 * g.shape(x)[1], 1, pad=0, conv_name=f"features.{i}.0",
                  bn_name=f"features.{i}.1", act="hardswish", act_name=f"features.{i}.2")
    x = g.flatten(g.global_avg_pool(x, name="avgpool"), name="flatten")
    x = g.hardswish(g.gemm(x, 1280, name="classifier.0"), name="classifier.1")
    out = g.gemm(x, 1000, name="classifier.3", output="output")
    return g.build("mobilenet_v3_large", out,
                   doc="torchvision mobilenet_v3_large architecture, random weights, paddle2onnx style")
