"""torchvision ShuffleNetV2 x1.0, with the shape arithmetic of torch's legacy exporter."""

from __future__ import annotations

import numpy as np
import onnx

from . import layers as L
from .builder import GraphBuilder

_REPEATS = (4, 8, 4)
_CHANNELS = (24, 116, 232, 464, 1024)
# Stages whose channel shuffle keeps the traced `x.size()` arithmetic (Shape -> Gather ->
# Unsqueeze -> Concat -> Reshape); stage 3's shapes are folded to constants, as they are when
# the exporter can see static sizes.
_TRACED_STAGES = (2, 4)
_I64 = np.int64
# BN after the depthwise convs, which no ReLU follows: E[gamma^2] ~ 1/2 offsets the He init of the
# next 1x1 conv (which assumes a ReLU-halved input), so random activations keep their scale.
_DW_GAMMA = (0.4, 1.0)


def _shuffle_traced(g: GraphBuilder, x: str, p: str) -> str:
    """``channel_shuffle(x, 2)`` with sizes read from ``x.size()`` at run time."""
    n, c, h, w = g.shape(x)
    shape = g._node("Shape", [x], f"{p}.shape", (4,))
    dims = [g._node("Gather", [shape, g._const(f"{p}.index{i}", np.array(i, _I64))],
                    f"{p}.gather{i}", (), axis=0) for i in range(4)]
    # channels_per_group = num_channels // groups
    cpg = g._node("Div", [dims[1], g._const(f"{p}.groups", np.array(2, _I64))], f"{p}.div", ())
    b, cpg, hh, ww = (g._node("Unsqueeze", [d, g._const(f"{p}.axes{i}", np.array([0], _I64))],
                              f"{p}.unsqueeze{i}", (1,))
                      for i, d in enumerate([dims[0], cpg, dims[2], dims[3]]))
    two = g._const(f"{p}.groups_1d", np.array([2], _I64))
    shape5 = g._node("Concat", [b, two, cpg, hh, ww], f"{p}.shape5", (5,), axis=0)
    y = g._node("Reshape", [x, shape5], f"{p}.view", (n, 2, c // 2, h, w))
    y = L.transpose(g, y, [0, 2, 1, 3, 4], f"{p}.transpose")
    minus1 = g._const(f"{p}.minus1", np.array([-1], _I64))
    shape4 = g._node("Concat", [b, minus1, hh, ww], f"{p}.shape4", (4,), axis=0)
    return g._node("Reshape", [y, shape4], f"{p}.view_out", (n, c, h, w))


def _shuffle_folded(g: GraphBuilder, x: str, p: str) -> str:
    n, c, h, w = g.shape(x)
    y = L.reshape(g, x, [n, 2, c // 2, h, w], f"{p}.view", const=True)
    y = L.transpose(g, y, [0, 2, 1, 3, 4], f"{p}.transpose")
    return L.reshape(g, y, [n, -1, h, w], f"{p}.view_out", const=True)


def _branch2(g: GraphBuilder, x: str, bf: int, stride: int, p: str) -> str:
    y = g.conv_bn(x, bf, 1, pad=0, conv_name=f"{p}.0", bn_name=f"{p}.1", act="relu",
                  act_name=f"{p}.2")
    y = g.conv_bn(y, bf, 3, stride, groups=bf, conv_name=f"{p}.3", bn_name=f"{p}.4",
                  gamma=_DW_GAMMA)
    return g.conv_bn(y, bf, 1, pad=0, conv_name=f"{p}.5", bn_name=f"{p}.6", act="relu",
                     act_name=f"{p}.7")


def _block(g: GraphBuilder, x: str, oup: int, stride: int, traced: bool, p: str) -> str:
    bf = oup // 2
    if stride == 1:
        x1, x2 = L.split(g, x, [bf, bf], 1, f"{p}.chunk", const=True)  # x.chunk(2, dim=1)
        parts = [x1, _branch2(g, x2, bf, 1, f"{p}.branch2")]
    else:
        c = g.shape(x)[1]
        y = g.conv_bn(x, c, 3, stride, groups=c, conv_name=f"{p}.branch1.0",
                      bn_name=f"{p}.branch1.1", gamma=_DW_GAMMA)
        y = g.conv_bn(y, bf, 1, pad=0, conv_name=f"{p}.branch1.2", bn_name=f"{p}.branch1.3",
                      act="relu", act_name=f"{p}.branch1.4")
        parts = [y, _branch2(g, x, bf, stride, f"{p}.branch2")]
    out = L.concat(g, parts, 1, f"{p}.cat")
    return (_shuffle_traced if traced else _shuffle_folded)(g, out, f"{p}.shuffle")


def shufflenet_v2() -> onnx.ModelProto:
    """ShuffleNetV2 x1.0 as in torchvision: 56 convs, 2,278,604 parameters.

    Exporter style: torch legacy exporter, opset 17, weights as
    initializers, shape arithmetic as ``Constant`` nodes. ``x.chunk(2, 1)``
    is a ``Split`` with ``Constant`` split sizes; ``channel_shuffle`` is
    ``Reshape (N, 2, C/2, H, W) -> Transpose (0, 2, 1, 3, 4) -> Reshape``.
    In stages 2 and 4 the reshape targets are computed at run time from
    ``Shape -> Gather -> (Div) -> Unsqueeze -> Concat`` as traced from
    ``x.size()`` (a frontend must fold them); in stage 3 they are constants.
    Global pooling is ``x.mean([2, 3])`` (``ReduceMean``, keepdims 0).
    Published width and 224x224 input (fast enough as published).

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (1, 3, 224, 224), output ``output`` (1, 1000).
    """
    g = GraphBuilder(seed=22)
    x = g.conv_bn(g.input_name, _CHANNELS[0], 3, 2, conv_name="conv1.0", bn_name="conv1.1",
                  act="relu", act_name="conv1.2")
    x = g.max_pool(x, 3, 2, 1, name="maxpool")
    for s, (n, oup) in enumerate(zip(_REPEATS, _CHANNELS[1:4]), start=2):
        for j in range(n):
            x = _block(g, x, oup, 2 if j == 0 else 1, s in _TRACED_STAGES, f"stage{s}.{j}")
    x = g.conv_bn(x, _CHANNELS[4], 1, pad=0, conv_name="conv5.0", bn_name="conv5.1", act="relu",
                  act_name="conv5.2")
    x = L.reduce_mean(g, x, [2, 3], "mean", keepdims=False)
    out = g.gemm(x, 1000, name="fc", output="output")
    return g.build("shufflenet_v2", out, doc="torchvision shufflenet_v2_x1_0 architecture, random weights")
