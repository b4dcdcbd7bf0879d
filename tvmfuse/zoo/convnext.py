"""ConvNeXt (Liu et al. 2022) as the official ``facebookresearch/ConvNeXt`` code builds it, shrunk."""

from __future__ import annotations

import numpy as np
import onnx

from . import layers as L
from .builder import GraphBuilder

_OPSET = 18
_DEPTHS = (1, 1, 3, 1)  # ConvNeXt-T: (3, 3, 9, 3)
_DIMS = (32, 64, 128, 256)  # ConvNeXt-T: (96, 192, 384, 768)
# Blocks of these stages normalise with the LayerNormalization op, the others spell LN out.
_FUSED_LN_STAGES = (3,)
_EPS = 1e-6
# Layer scale (``gamma``) values of a trained model; the 1e-6 init would mute every block.
_LAYER_SCALE = (0.5, 1.5)
_SIZE = 128  # input height and width


def _block(g: GraphBuilder, x: str, fused_ln: bool, p: str) -> str:
    c = g.shape(x)[1]
    y = g.conv(x, c, 7, groups=c, pad=3, bias=True, name=f"{p}.dwconv")
    y = L.transpose(g, y, [0, 2, 3, 1], f"{p}.permute")  # (N, C, H, W) -> (N, H, W, C)
    y = L.layer_norm(g, y, f"{p}.norm", eps=_EPS, spelt=not fused_ln, opset=_OPSET)
    y = L.linear(g, y, 4 * c, f"{p}.pwconv1")
    y = L.gelu_erf(g, y, f"{p}.act")
    y = L.linear(g, y, c, f"{p}.pwconv2")
    gamma = g._init(f"{p}.gamma", g.rng.uniform(*_LAYER_SCALE, c).astype(np.float32))
    y = L.binary(g, "Mul", gamma, y, f"{p}.layer_scale")
    y = L.transpose(g, y, [0, 3, 1, 2], f"{p}.permute_back")
    return L.binary(g, "Add", x, y, f"{p}.add")


def convnext_tiny() -> onnx.ModelProto:
    """ConvNeXt-Tiny-style, depths (1, 1, 3, 1), dims (32, 64, 128, 256), 128x128 input: 10 convs.

    Shrunk from ConvNeXt-T (depths (3, 3, 9, 3), dims (96, 192, 384, 768),
    224x224) to keep tests fast; every op pattern of the full model is kept.

    Exporter style: opset 18 with weights as initializers, as the dynamo
    exporter writes, mixing the two LayerNorm spellings real exports contain:

    * the channels-first LayerNorm of the stem and of each downsampling layer
      is the official code's hand-written one, so every exporter spells it
      out: ``ReduceMean/Sub/Pow/ReduceMean/Add eps/Sqrt/Div/Mul/Add`` over
      axis 1 (``ReduceMean`` takes its axes as an input from opset 18), with
      ``(C, 1, 1)`` affine;
    * block LayerNorms run channels-last after ``Transpose(0, 2, 3, 1)``:
      spelt out over the last axis in stages 0-2 (the legacy exporter's
      pre-opset-17 form) and as the ``LayerNormalization`` op in stage 3 and
      the final norm (what the dynamo exporter writes).

    Blocks: 7x7 depthwise conv (pad 3), LN, ``MatMul + Add`` (Linear),
    GELU as ``x * (1 + Erf(x / sqrt 2)) * 0.5``, Linear, layer scale ``Mul``,
    ``Transpose`` back, residual ``Add``. Stem: 4x4 stride-4 conv; downsample:
    LN then 2x2 stride-2 conv. Head: ``ReduceMean`` over H, W, LN, ``Gemm``.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 128, 128), output ``output`` (1, 1000).
    """
    g = GraphBuilder(seed=2022, input_shape=(1, 3, _SIZE, _SIZE))
    x = g.conv(g.input_name, _DIMS[0], 4, 4, pad=0, bias=True, name="downsample_layers.0.0")
    x = L.layer_norm(g, x, "downsample_layers.0.1", axis=1, eps=_EPS, opset=_OPSET)
    for s, (depth, dim) in enumerate(zip(_DEPTHS, _DIMS)):
        if s:
            p = f"downsample_layers.{s}"
            x = L.layer_norm(g, x, f"{p}.0", axis=1, eps=_EPS, opset=_OPSET)
            x = g.conv(x, dim, 2, 2, pad=0, bias=True, name=f"{p}.1")
        for j in range(depth):
            x = _block(g, x, s in _FUSED_LN_STAGES, f"stages.{s}.{j}")
    x = L.reduce_mean(g, x, [-2, -1], "mean", keepdims=False, opset=_OPSET)  # x.mean([-2, -1])
    x = L.layer_norm(g, x, "norm", eps=_EPS, spelt=False)
    out = g.gemm(x, 1000, name="head", output="output")
    return g.build("convnext_tiny", out, opset=_OPSET,
                   doc="ConvNeXt-T-style (depths 1,1,3,1; dims 32..256) architecture, random weights")
