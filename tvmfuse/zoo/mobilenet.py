"""torchvision MobileNetV2 (width 1.0)."""

from __future__ import annotations

import onnx

from .builder import GraphBuilder

# (expand ratio t, output channels c, repeats n, first stride s), as published.
SETTINGS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]
_RESIDUAL_GAMMA = (0.1, 0.3)


def make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's ``_make_divisible``: channels of a width-scaled MobileNet, rounded to ``divisor``."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def inverted_residual(g: GraphBuilder, x: str, out_ch: int, stride: int, t: int, p: str, dilation: int = 1) -> str:
    """MobileNetV2's block; ``dilation`` is the depthwise conv's atrous rate (DeepLab's backbone)."""
    in_ch = g.shape(x)[1]
    skip = stride == 1 and in_ch == out_ch
    hidden = in_ch * t
    y, i = x, 0
    # Names follow torchvision's state_dict: features.N.conv.{i}[.j].
    if t != 1:
        y = g.conv_bn(y, hidden, 1, pad=0, conv_name=f"{p}.conv.0.0", bn_name=f"{p}.conv.0.1",
                      act="relu6", act_name=f"{p}.conv.0.2")
        i = 1
    y = g.conv_bn(y, hidden, 3, stride, groups=hidden, dilation=dilation, conv_name=f"{p}.conv.{i}.0",
                  bn_name=f"{p}.conv.{i}.1", act="relu6", act_name=f"{p}.conv.{i}.2")
    y = g.conv_bn(y, out_ch, 1, pad=0, conv_name=f"{p}.conv.{i + 1}", bn_name=f"{p}.conv.{i + 2}",
                  gamma=_RESIDUAL_GAMMA if skip else (0.5, 1.5))
    return g.add(x, y, name=f"{p}.add") if skip else y


def mobilenet_v2() -> onnx.ModelProto:
    """MobileNetV2 1.0 as in torchvision: 52 convs, 3,504,872 parameters.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 224, 224), output ``output`` (1, 1000).
    """
    g = GraphBuilder(seed=2)
    x = g.conv_bn(g.input_name, 32, 3, 2, conv_name="features.0.0", bn_name="features.0.1",
                  act="relu6", act_name="features.0.2")
    idx = 1
    for t, c, n, s in SETTINGS:
        for j in range(n):
            x = inverted_residual(g, x, c, s if j == 0 else 1, t, f"features.{idx}")
            idx += 1
    x = g.conv_bn(x, 1280, 1, pad=0, conv_name=f"features.{idx}.0", bn_name=f"features.{idx}.1",
                  act="relu6", act_name=f"features.{idx}.2")
    # torchvision uses adaptive_avg_pool2d + flatten; Dropout vanishes in eval export.
    x = g.flatten(g.global_avg_pool(x, name="avgpool"), name="flatten")
    out = g.gemm(x, 1000, name="classifier.1", output="output")
    return g.build("mobilenet_v2", out, doc="torchvision mobilenet_v2 architecture, random weights")
