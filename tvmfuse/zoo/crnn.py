"""A small CRNN text recognizer (Shi et al. 2015) as OCR toolkits build it, paddle2onnx style."""

from __future__ import annotations

import onnx

from . import layers as L
from .builder import GraphBuilder

# (output channels, pool after the conv: (kernel/stride h, w) or None), CRNN's VGG stack at
# half width; the last conv is 2x2 without padding, taking the height from 2 to 1.
_CONVS = [
    (32, (2, 2)),
    (64, (2, 2)),
    (128, None),
    (128, (2, 1)),
    (256, None),
    (256, (2, 1)),
]
_LAST = 256
_HIDDEN = 48
_NUM_CLASSES = 37  # 0-9, a-z and the CTC blank


def crnn() -> onnx.ModelProto:
    """CRNN: 7 conv-BN-ReLU, a BiLSTM and a BiGRU, 1x3x32x128 input, 31 time steps.

    Exporter style: paddle2onnx. Every weight is a ``Constant`` node and the
    declared batch dimension is ``-1`` (``dim_value`` -1); opset 17. The
    sequence part is written as torch exports ``nn.LSTM`` / ``nn.GRU``
    (``bidirectional=True``): no initial states, ``B`` bias input, GRU with
    ``linear_before_reset=1``, and every ``Y`` ``(T, 2, N, H)`` brought to
    ``(T, N, 2H)`` by ``Transpose(0, 2, 1, 3) -> Reshape [0, 0, -1]``.

    The conv stack halves the original CRNN widths; two of its max-pools
    use a ``(2, 1)`` kernel and stride so the width (time axis) keeps its
    resolution. ``Squeeze`` of the height and ``Transpose`` give ``(T, N,
    C)``; after the RNNs a Linear (``MatMul + Add``) maps to 37 classes.
    tvmfuse's frontend does not import ``LSTM``/``GRU`` yet; onnxruntime runs it.

    Returns
    -------
    onnx.ModelProto
        Input ``input`` (-1, 3, 32, 128), output ``output`` (31, -1, 37)
        (time-major, as a CTC loss expects).
    """
    g = GraphBuilder(seed=2015, input_shape=(-1, 3, 32, 128), const_weights=True)
    x = g.input_name
    for i, (c, pool) in enumerate(_CONVS):
        x = g.conv_bn(x, c, 3, conv_name=f"cnn.conv{i}", bn_name=f"cnn.bn{i}", act="relu",
                      act_name=f"cnn.relu{i}")
        if pool:
            x = L.max_pool2d(g, x, pool, pool, name=f"cnn.pool{i}")
    i = len(_CONVS)
    x = g.conv_bn(x, _LAST, 2, pad=0, conv_name=f"cnn.conv{i}", bn_name=f"cnn.bn{i}",
                  act="relu", act_name=f"cnn.relu{i}")
    x = L.squeeze(g, x, [2], "squeeze")  # (N, C, 1, T) -> (N, C, T)
    x = L.transpose(g, x, [2, 0, 1], "permute")  # -> (T, N, C)
    x = L.lstm(g, x, _HIDDEN, "rnn.0.lstm")
    x = L.rnn_to_sequence(g, x, "rnn.0.view", const=True)
    x = L.gru(g, x, _HIDDEN, "rnn.1.gru")
    x = L.rnn_to_sequence(g, x, "rnn.1.view", const=True)
    out = L.linear(g, x, _NUM_CLASSES, "fc", output="output")
    return g.build("crnn", out, doc="CRNN (conv stack + BiLSTM + BiGRU) architecture, random weights")
