"""EfficientNet-Lite0 as timm's ``tf_efficientnet_lite0`` exports it to ONNX."""

from __future__ import annotations

import onnx

from .builder import GraphBuilder

# (expand ratio, output channels, repeats, kernel, first stride) per stage.
_STAGES = [
    (1, 16, 1, 3, 1),
    (6, 24, 2, 3, 2),
    (6, 40, 2, 5, 2),
    (6, 80, 3, 3, 2),
    (6, 112, 3, 5, 1),
    (6, 192, 4, 5, 2),
    (6, 320, 1, 3, 1),
]
_RESIDUAL_GAMMA = (0.1, 0.3)
# timm's tf_* ports keep TensorFlow's BatchNorm epsilon.
_TF_BN_EPS = 1e-3


def _same_conv_bn(g: GraphBuilder, x: str, out_ch: int, k: int, stride: int, groups: int,
                  conv: str, bn: str, act: str | None, gamma=(0.5, 1.5)) -> str:
    """Conv with TF "SAME" padding the way timm realises it.

    timm keeps stride-1 odd-kernel convs as ordinary symmetric-padded convs
    (static padding) and turns stride-2 ones into ``Conv2dSame``, whose
    ``F.pad`` with a computed (asymmetric) pad list becomes a ``Pad`` fed by a
    constant shape subgraph in the ONNX export.
    """
    if stride == 1:
        y = g.conv(x, out_ch, k, 1, groups, pad=(k - 1) // 2, name=conv)
    else:
        x = g.pad_same(x, k, stride, name=f"{conv}.pad")
        y = g.conv(x, out_ch, k, stride, groups, pad=0, name=conv)
    y = g.batch_norm(y, name=bn, gamma=gamma)
    return g.relu6(y, name=f"{bn}.act") if act else y


def _block(g: GraphBuilder, x: str, e: int, out_ch: int, k: int, stride: int, p: str) -> str:
    in_ch = g.shape(x)[1]
    skip = stride == 1 and in_ch == out_ch
    last_gamma = _RESIDUAL_GAMMA if skip else (0.5, 1.5)
    if e == 1:
        # DepthwiseSeparableConv: dw -> pw (no activation after pw).
        y = _same_conv_bn(g, x, in_ch, k, stride, in_ch, f"{p}.conv_dw", f"{p}.bn1", "relu6")
        y = _same_conv_bn(g, y, out_ch, 1, 1, 1, f"{p}.conv_pw", f"{p}.bn2", None, last_gamma)
    else:
        # InvertedResidual without squeeze-excite (removed in the Lite variants).
        hidden = in_ch * e
        y = _same_conv_bn(g, x, hidden, 1, 1, 1, f"{p}.conv_pw", f"{p}.bn1", "relu6")
        y = _same_conv_bn(g, y, hidden, k, stride, hidden, f"{p}.conv_dw", f"{p}.bn2", "relu6")
        y = _same_conv_bn(g, y, out_ch, 1, 1, 1, f"{p}.conv_pwl", f"{p}.bn3", None, last_gamma)
    return g.add(y, x, name=f"{p}.add") if skip else y


def efficientnet_lite0() -> onnx.ModelProto:
    """EfficientNet-Lite0 (timm ``tf_efficientnet_lite0``): 49 convs, 5 SAME pads, 4,652,008 params.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 224, 224), output ``output`` (1, 1000).
    """
    g = GraphBuilder(seed=1000, bn_eps=_TF_BN_EPS)
    # Lite models fix stem (32) and head (1280) widths regardless of scaling.
    x = _same_conv_bn(g, g.input_name, 32, 3, 2, 1, "conv_stem", "bn1", "relu6")
    for s, (e, c, n, k, stride) in enumerate(_STAGES):
        for j in range(n):
            x = _block(g, x, e, c, k, stride if j == 0 else 1, f"blocks.{s}.{j}")
    x = _same_conv_bn(g, x, 1280, 1, 1, 1, "conv_head", "bn2", "relu6")
    x = g.flatten(g.global_avg_pool(x, name="global_pool"), name="flatten")
    out = g.gemm(x, 1000, name="classifier", output="output")
    return g.build("efficientnet_lite0", out,
                   doc="timm tf_efficientnet_lite0 architecture, random weights")
