"""A small CNN trained in numpy on scikit-learn's digits (8x8 images, shipped with the package), exported
to ONNX: real data for INT8 accuracy checks (tests/test_quantize_api.py, bench/int8_accuracy.py).

Network: conv3x3(8, pad 1) + relu -> conv3x3(16, stride 2, pad 1) + relu -> flatten -> dense(10), trained
with Adam on softmax cross-entropy and hand-written backprop. Seeded: the same weights on every run.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

TEST_SIZE = 497  # 1797 digits: 1300 to train (13 batches of 100) and the rest held out
BATCH = 100  # the batch the ONNX model is exported with


@dataclasses.dataclass
class Split:
    x_train: np.ndarray  # (N, 1, 8, 8) float32 in [0, 1]
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_split(seed: int = 0) -> Split:
    """The digits, scaled to [0, 1], shuffled with ``seed`` and split into training and held-out sets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], digits.target[order]
    return Split(x[TEST_SIZE:], y[TEST_SIZE:], x[:TEST_SIZE], y[:TEST_SIZE])


def _im2col(x: np.ndarray, stride: int) -> np.ndarray:
    """3x3 windows of ``x`` padded by 1: ``(N, OH, OW, C * 9)``."""
    win = sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]
    n, c, oh, ow = win.shape[:4]
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n, oh, ow, c * 9)


def _col2im(dcols: np.ndarray, shape, stride: int) -> np.ndarray:
    """Gradient of :func:`_im2col`: sums the window gradients back onto the input."""
    n, c, h, w = shape
    oh, ow = dcols.shape[1:3]
    d = dcols.reshape(n, oh, ow, c, 3, 3)
    dx = np.zeros((n, c, h + 2, w + 2), np.float32)
    for i in range(3):
        for j in range(3):
            dx[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += d[..., i, j].transpose(0, 3, 1, 2)
    return dx[:, :, 1:-1, 1:-1]


def _init(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {"W1": he((8, 1, 3, 3), 9), "B1": np.zeros(8, np.float32),
            "W2": he((16, 8, 3, 3), 72), "B2": np.zeros(16, np.float32),
            "W3": he((256, 10), 256), "B3": np.zeros(10, np.float32)}


def _forward(p: dict, x: np.ndarray):
    c1 = _im2col(x, 1)
    h1 = np.maximum(c1 @ p["W1"].reshape(8, -1).T + p["B1"], 0)  # (N, 8, 8, 8) NHWC
    a1 = h1.transpose(0, 3, 1, 2)
    c2 = _im2col(a1, 2)
    h2 = np.maximum(c2 @ p["W2"].reshape(16, -1).T + p["B2"], 0)  # (N, 4, 4, 16)
    flat = h2.transpose(0, 3, 1, 2).reshape(len(x), -1)  # NCHW flatten, as ONNX Flatten does
    return flat @ p["W3"] + p["B3"], (c1, h1, a1, c2, h2, flat)


def logits(p: dict, x: np.ndarray) -> np.ndarray:
    """The network's output on ``x`` (numpy FP32)."""
    return _forward(p, x)[0]


def _gradients(p: dict, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    out, (c1, h1, a1, c2, h2, flat) = _forward(p, x)
    prob = np.exp(out - out.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    prob[np.arange(len(y)), y] -= 1
    dout = prob / len(y)
    g = {"W3": flat.T @ dout, "B3": dout.sum(0)}
    dh2 = (dout @ p["W3"].T).reshape(len(x), 16, 4, 4).transpose(0, 2, 3, 1) * (h2 > 0)
    g["W2"] = (dh2.reshape(-1, 16).T @ c2.reshape(-1, c2.shape[-1])).reshape(p["W2"].shape)
    g["B2"] = dh2.sum(axis=(0, 1, 2))
    da1 = _col2im(dh2 @ p["W2"].reshape(16, -1), a1.shape, 2)
    dh1 = da1.transpose(0, 2, 3, 1) * (h1 > 0)
    g["W1"] = (dh1.reshape(-1, 8).T @ c1.reshape(-1, c1.shape[-1])).reshape(p["W1"].shape)
    g["B1"] = dh1.sum(axis=(0, 1, 2))
    return g


def train(x: np.ndarray, y: np.ndarray, epochs: int = 8, batch: int = 64, lr: float = 5e-3,
          seed: int = 0) -> dict[str, np.ndarray]:
    """Adam on softmax cross-entropy; returns the weights (float32)."""
    p = _init(seed)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    rng, step = np.random.default_rng(seed + 1), 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), batch):
            idx = order[start:start + batch]
            step += 1
            for k, g in _gradients(p, x[idx], y[idx]).items():
                m[k] = 0.9 * m[k] + 0.1 * g
                v[k] = 0.999 * v[k] + 0.001 * g * g
                mhat, vhat = m[k] / (1 - 0.9 ** step), v[k] / (1 - 0.999 ** step)
                p[k] = (p[k] - lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
    return p


def accuracy(predicted_logits: np.ndarray, y: np.ndarray) -> float:
    """Share of correct predictions, in percent."""
    return float(np.mean(np.argmax(predicted_logits, axis=1) == y) * 100)


def to_onnx(p: dict, batch: int = BATCH):
    """The trained network as an ONNX model: input ``x`` (batch, 1, 8, 8), output ``logits`` (batch, 10)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Flatten", ["r2"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "W3", "B3"], ["logits"], name="fc")]
    graph = helper.make_graph(nodes, "digits_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
                              [numpy_helper.from_array(a, name) for name, a in p.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def batches(x: np.ndarray, batch: int = BATCH) -> list[dict[str, np.ndarray]]:
    """``x`` cut into whole input batches for the exported model (a short tail is dropped)."""
    return [{"x": x[i:i + batch]} for i in range(0, len(x) - batch + 1, batch)]


def model_accuracy(model, x: np.ndarray, y: np.ndarray, batch: int = BATCH) -> float:
    """Accuracy of a compiled or loaded model (anything with ``run(inputs)``) on ``x``, batch by batch.

    The last partial batch is padded with zeros and its padding ignored, so every sample counts.
    """
    outputs = []
    for start in range(0, len(x), batch):
        chunk = x[start:start + batch]
        padded = np.zeros((batch,) + x.shape[1:], np.float32)
        padded[:len(chunk)] = chunk
        outputs.append(model.run({"x": padded})[0][:len(chunk)])
    return accuracy(np.concatenate(outputs), y)
