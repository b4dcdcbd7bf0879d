"""Classic U-Net (Ronneberger et al. 2015) as the popular ``milesial/Pytorch-UNet`` builds it."""

from __future__ import annotations

import onnx

from . import layers as L
from .builder import GraphBuilder

_BASE = 16  # published: 64
_LEVELS = 4
_NUM_CLASSES = 2
_SIZE = 128  # input height and width


def _double_conv(g: GraphBuilder, x: str, out_ch: int, p: str) -> str:
    """``(Conv3x3 no bias -> BN -> ReLU) x 2``."""
    for i in (0, 3):
        x = g.conv_bn(x, out_ch, 3, conv_name=f"{p}.double_conv.{i}",
                      bn_name=f"{p}.double_conv.{i + 1}", act="relu",
                      act_name=f"{p}.double_conv.{i + 2}")
    return x


def _up(g: GraphBuilder, x: str, skip: str, level: int, p: str) -> str:
    c = g.shape(x)[1]
    if level == 0:
        # Variant: a 3x3 stride-2 transposed conv, whose output_padding=1 restores the even size.
        y = L.conv_transpose(g, x, c // 2, 3, 2, f"{p}.up", pad=1, output_padding=1)
    elif level == 2:
        # Variant: depthwise transposed conv (group = channels), then a 1x1 conv halving them.
        y = L.conv_transpose(g, x, c, 2, 2, f"{p}.up.0", groups=c)
        y = g.conv(y, c // 2, 1, pad=0, bias=True, name=f"{p}.up.1")
    else:
        y = L.conv_transpose(g, x, c // 2, 2, 2, f"{p}.up")  # nn.ConvTranspose2d(c, c // 2, 2, 2)
    y = L.concat(g, [skip, y], 1, f"{p}.cat")  # torch.cat([x2, x1], dim=1)
    return _double_conv(g, y, c // 2, f"{p}.conv")


def unet() -> onnx.ModelProto:
    """U-Net, 4 levels, base width 16 (published: 64), 128x128 input: 20 convs, 4 ConvTranspose.

    Exporter style: torch legacy exporter, opset 17, weights as initializers.
    Encoder ``DoubleConv`` (conv3x3 + BN + ReLU, twice) and 2x2 ``MaxPool``;
    decoder ``ConvTranspose`` 2x2 stride 2 with bias, skip ``Concat``,
    ``DoubleConv``; final 1x1 conv to 2 classes. Two decoder stages are
    deliberate variants so both less common ``ConvTranspose`` forms occur:
    the deepest upsampler is a 3x3 stride-2 pad-1 transposed conv with
    ``output_padding=1``, and the third is a depthwise transposed conv
    (``group`` = channels) followed by a 1x1 conv.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 128, 128), output ``output`` (1, 2, 128, 128).
    """
    g = GraphBuilder(seed=1505, input_shape=(1, 3, _SIZE, _SIZE))
    skips = [_double_conv(g, g.input_name, _BASE, "inc")]
    for i in range(1, _LEVELS + 1):
        x = g.max_pool(skips[-1], 2, 2, name=f"down{i}.maxpool_conv.0")
        skips.append(_double_conv(g, x, _BASE << i, f"down{i}.maxpool_conv.1"))
    x = skips.pop()
    for i in range(_LEVELS):
        x = _up(g, x, skips.pop(), i, f"up{i + 1}")
    out = g.conv(x, _NUM_CLASSES, 1, pad=0, bias=True, name="outc.conv", output="output")
    return g.build("unet", out, doc="U-Net (milesial Pytorch-UNet, base 16) architecture, random weights")
