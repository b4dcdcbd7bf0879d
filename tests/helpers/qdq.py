"""QDQ models for tests/frontend/test_qdq_import.py: hand-built with onnx.helper, and zoo models quantized by onnxruntime.

Hand-built models keep weight codes in [-64, 64] unless told otherwise: onnxruntime's AVX2 u8 x s8 kernel
adds pairs of products in int16 (``vpmaddubsw``) and saturates beyond that, which would make its INT8 output
differ from the exact integer result; with 7-bit weights it is exact, so the comparison can ask for equality.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

X_SCALE, Y_SCALE, W_SCALE = 0.05, 0.05, 0.01
ZERO_POINT = {"uint8": 128, "int8": 3}
ONNX_TYPE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


@dataclasses.dataclass
class Spec:
    """One QDQ chain: ``x -> Q -> DQ -> Conv|MatMul|Gemm (DQ weight) [+ DQ bias] [+ DQ(x codes)] [act] -> Q -> DQ``."""

    op: str = "Conv"  # Conv, MatMul or Gemm (transB=1)
    channels: int = 8
    group: int = 1
    act_dtype: str = "uint8"
    activation: str | None = None  # None, "Relu" or "Clip" (0, 6)
    residual: bool = False
    act_before_residual: bool = False
    weight_dtype: str = "int8"
    weight_zero_point: int = 0
    weight_low: int = -64  # smallest weight code
    weight_axis: int | None = None  # per-channel axis of the weight scales (None: the output channels)
    y_scale: float = Y_SCALE
    seed: int = 0

    def x_shape(self) -> list[int]:
        return [1, self.channels, 6, 6] if self.op == "Conv" else [4, self.channels]


def _init(value: np.ndarray, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _weight(spec: Spec, rng) -> tuple[np.ndarray, int]:
    """Weight codes in the model's layout and the axis of their output channels."""
    c = spec.channels
    shape, out_axis = {"Conv": ((c, c // spec.group, 3, 3), 0), "MatMul": ((c, c), 1), "Gemm": ((c, c), 0)}[spec.op]
    if spec.weight_dtype == "uint8":
        return rng.integers(0, 256, shape).astype(np.uint8), out_axis
    if spec.weight_low == -128:  # full range, half of the codes at -128: every VNNI/AVX2 pair hits the extreme
        codes = rng.integers(-128, 128, shape)
        codes[rng.random(shape) < 0.5] = -128
        return codes.astype(np.int8), out_axis
    return rng.integers(spec.weight_low, -spec.weight_low + 1, shape).astype(np.int8), out_axis


def qdq_model(spec: Spec) -> onnx.ModelProto:
    """The model of ``spec`` (opset 13), with float input ``x`` and float output ``y``."""
    rng = np.random.default_rng(spec.seed)
    dt, zp = spec.act_dtype, ZERO_POINT[spec.act_dtype]
    w, out_axis = _weight(spec, rng)
    channels = w.shape[out_axis]
    w_scale = (W_SCALE * (1 + rng.random(channels))).astype(np.float32)
    scale_axis = out_axis if spec.weight_axis is None else spec.weight_axis
    if scale_axis != out_axis:
        w_scale = np.full(w.shape[scale_axis], W_SCALE, np.float32)
    w_zp = np.full(w_scale.shape, spec.weight_zero_point, w.dtype)
    b_scale = (np.float32(X_SCALE) * w_scale).astype(np.float32)
    inits = [_init(np.float32(X_SCALE), "xs"), _init(np.array(zp, dt), "xz"), _init(np.float32(spec.y_scale), "ys"),
             _init(np.array(zp, dt), "yz"), _init(w, "w"), _init(w_scale, "ws"), _init(w_zp, "wz"),
             _init(rng.integers(-2000, 2000, channels).astype(np.int32), "b"), _init(b_scale, "bs"),
             _init(np.zeros(channels, np.int32), "bz")]
    if spec.activation == "Clip":
        inits += [_init(np.float32(0), "lo"), _init(np.float32(6), "hi")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=scale_axis),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0)]
    if spec.op == "Conv":
        nodes.append(helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 1, 1, 1], group=spec.group))
    elif spec.op == "Gemm":
        nodes.append(helper.make_node("Gemm", ["xd", "wd", "bd"], ["c"], transB=1))
    else:
        nodes += [helper.make_node("MatMul", ["xd", "wd"], ["m"]), helper.make_node("Add", ["m", "bd"], ["c"])]
    nodes += _epilogue(spec)
    nodes += [helper.make_node("QuantizeLinear", ["e", "ys", "yz"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    shape = spec.x_shape()
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _epilogue(spec: Spec) -> list:
    """Nodes from ``c`` to ``e``: residual add and activation in the spec's order."""
    steps = []
    if spec.residual:
        steps.append(lambda a, b: helper.make_node("Add", [a, "xd"], [b]))
    if spec.activation == "Relu":
        act = (lambda a, b: helper.make_node("Relu", [a], [b]))
    elif spec.activation == "Clip":
        act = (lambda a, b: helper.make_node("Clip", [a, "lo", "hi"], [b]))
    else:
        act = None
    if act is not None:
        steps.insert(0 if spec.act_before_residual else len(steps), act)
    nodes, prev = [], "c"
    for i, step in enumerate(steps):
        out = "e" if i == len(steps) - 1 else f"t{i}"
        nodes.append(step(prev, out))
        prev = out
    if not steps:
        nodes.append(helper.make_node("Identity", ["c"], ["e"]))
    return nodes


def x_input(spec: Spec, seed: int = 1) -> np.ndarray:
    """Input values spread over most of the activation codes."""
    return (np.random.default_rng(seed).standard_normal(spec.x_shape()) * 2.5).astype(np.float32)


class Reader:
    """onnxruntime CalibrationDataReader over a few seeded random batches (duck-typed: get_next / rewind)."""

    def __init__(self, name: str, shape, batches: int = 2, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.batches = [{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(batches)]
        self.index = 0

    def get_next(self):
        if self.index >= len(self.batches):
            return None
        self.index += 1
        return self.batches[self.index - 1]

    def rewind(self):
        self.index = 0


def ort_quantize(model: onnx.ModelProto, tmp_path, fmt: str = "qdq", **options) -> onnx.ModelProto:
    """``model`` prepared (batch-norm folded) and quantized by ``quantize_static``: QDQ or QOperator format,
    uint8 activations, int8 weights per channel, 7-bit weights (``reduce_range``) unless told otherwise."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    src, prepared, out = tmp_path / "fp32.onnx", tmp_path / "prepared.onnx", tmp_path / f"{fmt}.onnx"
    onnx.save(model, src)
    quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
    value = model.graph.input[0]
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    settings = dict(quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator, per_channel=True,
                    reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    settings.update(options)
    quantize_static(str(prepared), str(out), Reader(value.name, shape), **settings)
    return onnx.load(out)


def op_counts(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(node.op_type for node in model.graph.node)


def output_scale(model: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that produces the model's (first) output."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    assert node.op_type == "DequantizeLinear", f"the output comes from {node.op_type}, not a DequantizeLinear"
    return float(inits[node.input[1]])


def agreement(got: np.ndarray, ref: np.ndarray, scale: float) -> tuple[float, float]:
    """(max abs diff in output codes, share of exactly equal outputs)."""
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64)) / scale
    return float(diff.max()), float(np.mean(got == ref))
