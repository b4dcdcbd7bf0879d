"""onnxruntime's quantized contrib operators (what ``quantize_static`` writes in its ``QOperator`` format
beside ``QLinearConv``) in the canonical QDQ form.

Each ``QLinear<Op>`` becomes ``DequantizeLinear`` of each quantized input, the float op, and
``QuantizeLinear`` of the result with the output's scale and zero point, as :mod:`.qlinear` does for
``QLinearConv``/``QLinearMatMul``; the QDQ passes then give the chains INT8 kernels where there are any and
compute the rest in float32 between a dequantize and a quantize, which is the operator's definition (a
result next to a rounding boundary may land one code away from onnxruntime's integer arithmetic):

- ``QLinearAdd``, ``QLinearMul``: ``A``, ``B`` dequantized, added or multiplied, quantized to ``C``;
- ``QLinearSigmoid``, ``QLinearLeakyRelu`` (``alpha``);
- ``QLinearGlobalAveragePool``, ``QLinearAveragePool`` (its pool attributes); ``channels_last`` inputs are
  transposed to NCHW and back;
- ``QLinearConcat`` (``axis``): ``Y_scale, Y_zero_point`` then one ``(X, X_scale, X_zero_point)`` per input;
- ``QGemm``: ``alpha * A' B' + C`` with the int32 ``C`` dequantized at ``alpha * a_scale * b_scale`` (per column
  where ``b_scale`` is), quantized to ``y`` when ``y_scale`` is given, float32 otherwise.

And what its optimizer makes of ``quantize_dynamic``'s chains, back in the chain's standard ops, which
:mod:`.integer_ops` then computes as a float MatMul on the dequantized operands:

- ``DynamicQuantizeMatMul(A, B, b_scale, b_zero_point, bias)``: ``DynamicQuantizeLinear(A)``,
  ``MatMulInteger``, ``Cast`` to float, ``Mul`` by ``a_scale * b_scale``, ``Add`` of the bias;
- ``MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias)``: the same from
  ``MatMulInteger`` on.

``DynamicQuantizeLSTM`` (``quantize_dynamic`` on an LSTM: int8 weights stored ``[directions, input, 4 *
hidden]``, a scale and zero point per direction or per gate row) becomes a standard ``LSTM`` on its weights
written as ``DequantizeLinear`` of the codes, transposed back to ``[directions, 4 * hidden, input]``; the LSTM
rewrite folds them, quantizes the input of its input projection at run time as onnxruntime does (an INT8
MatMul on the codes: :func:`.rnn_codes.quantized_projection`), and its whole-sequence kernel reads the
recurrent weight's codes. onnxruntime also quantizes the
hidden state at every step; tvmfuse keeps it float32, which is closer to the float model.

Scales and zero points are read by name, so they may be any tensor ``DequantizeLinear`` accepts.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UnsupportedOpError
from .normalize import node_attrs
from .rnn_codes import DYNAMIC_INPUT_ATTR

DOMAIN = "com.microsoft"
_UNARY = {"QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu", "QLinearGlobalAveragePool": "GlobalAveragePool",
          "QLinearAveragePool": "AveragePool"}
_BINARY = {"QLinearAdd": "Add", "QLinearMul": "Mul"}
OP_TYPES = frozenset(_UNARY) | frozenset(_BINARY) | {"QLinearConcat", "QGemm", "DynamicQuantizeMatMul",
                                                      "MatMulIntegerToFloat", "DynamicQuantizeLSTM"}


class _Emitter:
    def __init__(self, graph: onnx.GraphProto, node: onnx.NodeProto, taken: set):
        self.graph, self.node, self.taken = graph, node, taken
        self.prefix = node.name or node.output[0]
        self.nodes: list[onnx.NodeProto] = []

    def name(self, base: str) -> str:
        name, i = f"{self.prefix}/{base}", 1
        while name in self.taken:
            name, i = f"{self.prefix}/{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def add(self, op: str, inputs: list[str], base: str, output: str | None = None, **attrs) -> str:
        out = output or self.name(base)
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(f"{op.lower()}"), **attrs))
        return out

    def dq(self, data: str, scale: str, zero_point: str, **attrs) -> str:
        return self.add("DequantizeLinear", [data, scale] + ([zero_point] if zero_point else []), f"{data}_dq", **attrs)

    def q(self, data: str, scale: str, zero_point: str, output: str) -> str:
        return self.add("QuantizeLinear", [data, scale] + ([zero_point] if zero_point else []), "q", output)

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name


def _inputs(node: onnx.NodeProto, count: int) -> list[str]:
    return (list(node.input) + [""] * count)[:count]


def _unary(e: _Emitter, node: onnx.NodeProto) -> None:
    x, xs, xz, ys, yz = _inputs(node, 5)
    attrs = node_attrs(node)
    channels_last = int(attrs.pop("channels_last", 0))
    value = e.dq(x, xs, xz)
    if channels_last:
        value = e.add("Transpose", [value], "nchw", perm=[0, 3, 1, 2])
    value = e.add(_UNARY[node.op_type], [value], "float", **attrs)
    if channels_last:
        value = e.add("Transpose", [value], "nhwc", perm=[0, 2, 3, 1])
    e.q(value, ys, yz, node.output[0])


def _binary(e: _Emitter, node: onnx.NodeProto) -> None:
    a, a_s, a_z, b, b_s, b_z, c_s, c_z = _inputs(node, 8)
    value = e.add(_BINARY[node.op_type], [e.dq(a, a_s, a_z), e.dq(b, b_s, b_z)], "float")
    e.q(value, c_s, c_z, node.output[0])


def _concat(e: _Emitter, node: onnx.NodeProto) -> None:
    ys, yz, rest = node.input[0], node.input[1], list(node.input[2:])
    parts = [e.dq(*rest[i:i + 3]) for i in range(0, len(rest), 3)]
    e.q(e.add("Concat", parts, "float", axis=int(node_attrs(node)["axis"])), ys, yz, node.output[0])


def _qgemm(e: _Emitter, node: onnx.NodeProto, initializers: dict) -> None:
    a, a_s, a_z, b, b_s, b_z, c, ys, yz = _inputs(node, 9)
    attrs = node_attrs(node)
    alpha, trans_b = float(attrs.get("alpha", 1.0)), int(attrs.get("transB", 0))
    per_column = b_s in initializers and numpy_helper.to_array(initializers[b_s]).size > 1
    gemm_inputs = [e.dq(a, a_s, a_z), e.dq(b, b_s, b_z, **({"axis": 0 if trans_b else 1} if per_column else {}))]
    if c:
        if a_s not in initializers or b_s not in initializers:
            raise UnsupportedOpError(f"com.microsoft.QGemm node {e.prefix!r}: its bias C needs constant a_scale "
                                     "and b_scale")
        scale = (alpha * numpy_helper.to_array(initializers[a_s]).astype(np.float32)
                 * numpy_helper.to_array(initializers[b_s]).astype(np.float32)).astype(np.float32)
        zero = np.zeros(scale.shape, np.int32)
        gemm_inputs.append(e.dq(c, e.const("c_scale", scale), e.const("c_zero_point", zero),
                                **({"axis": 0} if scale.size > 1 else {})))
    out = node.output[0] if not ys else None
    value = e.add("Gemm", gemm_inputs, "float", out, alpha=alpha, beta=1.0, transA=int(attrs.get("transA", 0)),
                  transB=trans_b)
    if ys:
        e.q(value, ys, yz, node.output[0])


def _integer_matmul(e: _Emitter, node: onnx.NodeProto, a: str, b: str, a_s: str, b_s: str, a_z: str, b_z: str,
                    bias: str) -> None:
    """``MatMulInteger -> Cast(float) -> Mul(a_scale * b_scale) [-> Add(bias)]``: quantize_dynamic's chain."""
    product = e.add("MatMulInteger", [a, b, a_z, b_z] if b_z else ([a, b, a_z] if a_z else [a, b]), "int32")
    as_float = e.add("Cast", [product], "float", to=onnx.TensorProto.FLOAT)
    scale = e.add("Mul", [a_s, b_s], "scale")
    out = node.output[0]
    scaled = e.add("Mul", [as_float, scale], "scaled", None if bias else out)
    if bias:
        e.add("Add", [scaled, bias], "biased", out)


def _dynamic_quantize_matmul(e: _Emitter, node: onnx.NodeProto) -> None:
    a, b, b_s, b_z, bias = _inputs(node, 5)
    q, a_s, a_z = e.name("a_quantized"), e.name("a_scale"), e.name("a_zero_point")
    e.nodes.append(helper.make_node("DynamicQuantizeLinear", [a], [q, a_s, a_z], name=e.name("dynamicquantize")))
    _integer_matmul(e, node, q, b, a_s, b_s, a_z, b_z, bias)


def _matmul_integer_to_float(e: _Emitter, node: onnx.NodeProto) -> None:
    a, b, a_s, b_s, a_z, b_z, bias = _inputs(node, 7)
    _integer_matmul(e, node, a, b, a_s, b_s, a_z, b_z, bias)


def _lstm_weight(e: _Emitter, initializers: dict, codes: str, scale: str, zero_point: str, base: str) -> str:
    """``[D, rows, 4H]`` integer codes with a scale (and zero point) per direction or per gate row, as the
    ``[D, 4H, rows]`` LSTM weight: ``DequantizeLinear`` of the transposed codes (per row of their
    ``[D * 4H, rows]`` view), reshaped. :mod:`.rnn` folds it, keeping the codes for the LSTM kernel."""
    missing = [n for n in (codes, scale) + ((zero_point,) if zero_point else ()) if n not in initializers]
    if missing:
        raise UnsupportedOpError(f"com.microsoft.DynamicQuantizeLSTM node {e.prefix!r}: {missing[0]!r} is computed "
                                 "at run time; tvmfuse needs constant weights, scales and zero points")
    q = numpy_helper.to_array(initializers[codes])
    s = numpy_helper.to_array(initializers[scale]).astype(np.float32)
    z = numpy_helper.to_array(initializers[zero_point]) if zero_point else np.zeros(s.shape, q.dtype)
    dirs, rows, width = q.shape
    per_row = (dirs, width) if s.ndim == 2 else (dirs, 1)
    s, z = (np.broadcast_to(a.reshape(per_row), (dirs, width)).reshape(-1) for a in (s, z))
    q_rows = e.const(f"{base}_codes", np.ascontiguousarray(q.transpose(0, 2, 1)).reshape(dirs * width, rows))
    value = e.add("DequantizeLinear", [q_rows, e.const(f"{base}_scale", np.ascontiguousarray(s)),
                                       e.const(f"{base}_zero_point", np.ascontiguousarray(z).astype(q.dtype))],
                  f"{base}_rows", axis=0)
    return e.add("Reshape", [value, e.const(f"{base}_shape", np.array([dirs, width, rows], np.int64))], base)


def _dynamic_quantize_lstm(e: _Emitter, node: onnx.NodeProto, initializers: dict) -> None:
    x, w, r, b, lens, h0, c0, p, w_s, w_z, r_s, r_z = _inputs(node, 12)
    weights = [_lstm_weight(e, initializers, w, w_s, w_z, "W"), _lstm_weight(e, initializers, r, r_s, r_z, "R")]
    inputs = [x] + weights + [b, lens, h0, c0, p]
    while inputs and not inputs[-1]:
        inputs.pop()
    lstm = helper.make_node("LSTM", inputs, list(node.output), name=e.name("lstm"))
    lstm.attribute.extend(node.attribute)
    lstm.attribute.append(helper.make_attribute(DYNAMIC_INPUT_ATTR, 1))
    e.nodes.append(lstm)


def rewrite_qlinear_contrib_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Rewrite the operators above in place; return the model and how many were rewritten."""
    graph = model.graph
    if not any(n.domain == DOMAIN and n.op_type in OP_TYPES for n in graph.node):
        return model, 0
    initializers = {t.name: t for t in graph.initializer}
    taken = set(initializers) | {n for node in graph.node for n in list(node.input) + list(node.output)}
    nodes, count = [], 0
    for node in list(graph.node):
        if node.domain != DOMAIN or node.op_type not in OP_TYPES:
            nodes.append(node)
            continue
        e = _Emitter(graph, node, taken)
        if node.op_type in _UNARY:
            _unary(e, node)
        elif node.op_type in _BINARY:
            _binary(e, node)
        elif node.op_type == "QLinearConcat":
            _concat(e, node)
        elif node.op_type == "DynamicQuantizeMatMul":
            _dynamic_quantize_matmul(e, node)
        elif node.op_type == "MatMulIntegerToFloat":
            _matmul_integer_to_float(e, node)
        elif node.op_type == "DynamicQuantizeLSTM":
            _dynamic_quantize_lstm(e, node, initializers)
        else:
            _qgemm(e, node, initializers)
        nodes.extend(e.nodes)
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return model, count
