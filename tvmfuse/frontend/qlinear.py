"""Express ONNX's already-quantized ops with ops TVM's importer handles (an ONNX-graph rewrite).

TVM 0.27's ONNX importer has no converter for QLinearConv, QLinearMatMul or ConvInteger. Before import,
each such node is replaced here by standard ONNX nodes:

- ``QLinearConv`` / ``QLinearMatMul`` become the canonical QDQ form that ONNX Runtime's QDQ models use
  and that an INT8 partitioner matches: ``DequantizeLinear`` of every quantized input (the weight per output
  channel along axis 0 when its scale is a vector; a per-column ``b`` along its last axis), ``Conv`` /
  ``MatMul`` in float32, ``QuantizeLinear``. The int32 bias of QLinearConv becomes
  ``DequantizeLinear(B, x_scale * w_scale, 0)``, the Conv's third input. The spec's result is an exact
  integer accumulation requantized once; the QDQ form accumulates the dequantized values in float32, so
  an output next to a rounding boundary can land one unit off. Measured on x86-host: 0 of the 9 ONNX
  node-test cases; 6 of 1,354,752 outputs (4e-6, never more than 1) over seven ResNet-like layers with
  random full-range weights against an int64 accumulation (``tests/frontend/test_frontend_qlinear.py`` prints
  the share per case with ``-s``).
- ``ConvInteger`` must be exact (int32 output): ``Cast`` to int32, ``Sub`` the zero points, ``Conv`` on int32
  tensors. TVM's conv2d on int32 is exact (checked up to K = 4608 at the extremes 255 and -128); float32 is
  not once ``K * 255 * 255 > 2**24``.
- ``MatMulInteger`` is left alone: TVM's converter already computes it in int32, exactly.
- ``DynamicQuantizeLinear`` (what onnxruntime's ``quantize_dynamic`` puts before every ``ConvInteger`` /
  ``MatMulInteger``) becomes the standard ops of its definition, with onnxruntime's arithmetic: the range
  ``[min(0, min x), max(0, max x)]``, ``scale = range / 255`` (1 when the range is empty, where TVM's own
  converter divides by zero), ``zero_point = round(clip(-min / scale, 0, 255))`` rounding half to even,
  then ``QuantizeLinear``. The run-time zero point then feeds ``ConvInteger``'s ``Sub`` as a tensor.

Apart from ``ConvInteger``'s single ``x_zero_point``, scales and zero points must be constants (initializers,
or Constant nodes that ``fold_constants`` turned into initializers), since they are read here to broadcast and
combine them. float16 scales are widened to
float32 (exactly) so that everything in between is float32. Not supported (UnsupportedOpError naming the
node): runtime scales or zero points, a per-row ``a_scale``/``y_scale`` of QLinearMatMul, vectors that
do not match the weight's channels. In opset 10-12 models a per-axis DequantizeLinear carries an ``axis``
attribute those opsets lack: TVM's importer reads it (checked against onnxruntime), ONNX's checker would not.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UnsupportedOpError
from .graph import drop_unused_initializers

#: Op types (default domain) this module replaces; ``check_ops`` accepts them.
REWRITTEN_OP_TYPES = frozenset({"QLinearConv", "QLinearMatMul", "ConvInteger", "DynamicQuantizeLinear"})

_INPUT_NAMES = {
    "QLinearConv": ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "B"),
    "QLinearMatMul": ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point"),
    "ConvInteger": ("x", "w", "x_zero_point", "w_zero_point"),
}


class Rewriter:
    """What the per-op rewrites share: constants, shapes, fresh names, new initializers, error messages.

    Inputs are named by their role in the op's schema (``"x_scale"``), not by position.
    """

    def __init__(self, model: onnx.ModelProto, source: str):
        graph = model.graph
        self.source = source
        self.initializers = {t.name: t for t in graph.initializer}
        # Static shapes where known (-1 for an unknown dim); fold_constants ran shape inference before.
        self.shapes = {t.name: tuple(t.dims) for t in graph.initializer}
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            if value.name not in self.shapes and value.type.tensor_type.HasField("shape"):
                self.shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else -1
                                                for d in value.type.tensor_type.shape.dim)
        for node in graph.node:  # a scale and zero point computed at run time are scalars, whatever value_info says
            if node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx"):
                self.shapes.update({out: () for out in node.output[1:] if out})
        self.names = set(self.initializers) | {v.name for v in graph.input} | {v.name for v in graph.output}
        self.names |= {n for node in graph.node for n in list(node.input) + list(node.output)}
        self.new_initializers: list[onnx.TensorProto] = []

    def error(self, node: onnx.NodeProto, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.source}: {node.op_type} node {node.name or node.output[0]!r}: {why}")

    def input(self, node: onnx.NodeProto, role: str) -> str:
        """The tensor name feeding ``role`` ("" when the optional input is absent)."""
        index = _INPUT_NAMES[node.op_type].index(role)
        return node.input[index] if index < len(node.input) else ""

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def constant(self, node: onnx.NodeProto, role: str) -> np.ndarray | None:
        """The constant value of input ``role`` (None when the optional input is absent)."""
        name = self.input(node, role)
        if not name:
            return None
        if name not in self.initializers:
            raise self.error(node, f"{role} {name!r} is computed at run time; tvmfuse needs constant scales "
                                   "and zero points (initializers or foldable Constant nodes)")
        return numpy_helper.to_array(self.initializers[name])

    def required(self, node: onnx.NodeProto, role: str) -> np.ndarray:
        value = self.constant(node, role)
        if value is None:
            raise self.error(node, f"required input {role} is missing")
        return value

    def per_tensor(self, node: onnx.NodeProto, role: str) -> np.ndarray:
        """Input ``role`` as a scalar constant; a 1-element tensor counts as per-tensor."""
        value = self.required(node, role)
        if value.size != 1:
            raise self.error(node, f"{role} has shape {value.shape}; only a per-tensor (single value) {role} "
                                   "is supported")
        return value.reshape(())

    def shape(self, node: onnx.NodeProto, role: str) -> tuple[int, ...]:
        name = self.input(node, role)
        shape = self.shapes.get(name)
        if shape is None or -1 in shape:
            raise self.error(node, f"the shape of {role} {name!r} is unknown (give the model static input shapes)")
        return shape

    def initializer(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.new_initializers.append(numpy_helper.from_array(np.array(value), name))
        return name


def _scale(value: np.ndarray) -> np.ndarray:
    # float16 -> float32 is exact; keeping every scale float32 keeps the QDQ form's float tensors float32.
    return value.astype(np.float32)


def _per_channel(rw: Rewriter, node: onnx.NodeProto, prefix: str, weight_axis: int):
    """``(scale, zero point, per_channel)`` of weight ``prefix`` (``"w"`` or ``"b"``).

    Both are single values, or both vectors along ``weight_axis`` of the weight (a single value is
    broadcast to the other's length).
    """
    scale, zp = rw.required(node, f"{prefix}_scale"), rw.required(node, f"{prefix}_zero_point")
    sizes = {a.size for a in (scale, zp) if a.size != 1}
    if len(sizes) > 1 or any(a.ndim > 1 for a in (scale, zp) if a.size != 1):
        raise rw.error(node, f"{prefix}_scale {scale.shape} and {prefix}_zero_point {zp.shape} must be single "
                             "values or 1-D vectors of one length")
    if not sizes:
        return _scale(scale).reshape(()), zp.reshape(()), False
    channels = sizes.pop()
    _check_channels(rw, node, prefix, weight_axis, channels, f"{prefix}_scale")
    return (np.broadcast_to(_scale(scale).reshape(-1), (channels,)),
            np.broadcast_to(zp.reshape(-1), (channels,)), True)


def _check_channels(rw: Rewriter, node: onnx.NodeProto, weight: str, axis: int, channels: int, what: str):
    # A vector shorter than the weight's axis would be read out of bounds by the compiled kernel.
    shape = rw.shape(node, weight)
    if len(shape) < 2 or shape[axis] != channels:
        raise rw.error(node, f"{what} has {channels} values but {weight} {rw.input(node, weight)!r} has shape {shape}")


def _dequantize(rw: Rewriter, node: onnx.NodeProto, role: str, scale: np.ndarray,
                zp: np.ndarray, axis: int | None = None) -> tuple[onnx.NodeProto, str]:
    base = f"{node.output[0]}_{role}"
    out = rw.fresh(f"{base}_dq")
    inputs = [rw.input(node, role), rw.initializer(f"{base}_scale", scale), rw.initializer(f"{base}_zero_point", zp)]
    # An explicit axis only for per-axis parameters: opset 10-12 DequantizeLinear has no such attribute.
    attrs = {} if axis is None else {"axis": axis}
    return helper.make_node("DequantizeLinear", inputs, [out], name=f"{node.name or node.output[0]}/dq_{role}",
                            **attrs), out


def _quantize(rw: Rewriter, node: onnx.NodeProto, data: str) -> onnx.NodeProto:
    base = node.output[0]
    scale, zp = _scale(rw.per_tensor(node, "y_scale")), rw.per_tensor(node, "y_zero_point")
    inputs = [data, rw.initializer(f"{base}_y_scale", scale), rw.initializer(f"{base}_y_zero_point", zp)]
    return helper.make_node("QuantizeLinear", inputs, [node.output[0]], name=f"{node.name or base}/q_y")


def _qlinear_conv(rw: Rewriter, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    x_scale = _scale(rw.per_tensor(node, "x_scale"))
    w_scale, w_zp, per_channel = _per_channel(rw, node, "w", 0)
    axis = 0 if per_channel else None
    dq_x, x = _dequantize(rw, node, "x", x_scale, rw.per_tensor(node, "x_zero_point"))
    dq_w, w = _dequantize(rw, node, "w", w_scale, w_zp, axis)
    nodes, conv_inputs = [dq_x, dq_w], [x, w]
    if rw.input(node, "B"):
        # The int32 bias is in accumulator units: scale x_scale * w_scale, zero point 0.
        bias_scale = (x_scale * w_scale).astype(np.float32)
        dq_b, b = _dequantize(rw, node, "B", bias_scale, np.zeros(bias_scale.shape, np.int32), axis)
        nodes.append(dq_b)
        conv_inputs.append(b)
    y = rw.fresh(f"{node.output[0]}_conv")
    conv = helper.make_node("Conv", conv_inputs, [y], name=node.name or node.output[0])
    conv.attribute.extend(node.attribute)
    return nodes + [conv, _quantize(rw, node, y)]


def _qlinear_matmul(rw: Rewriter, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    a_scale = _scale(rw.per_tensor(node, "a_scale"))
    b_scale, b_zp, per_column = _per_channel(rw, node, "b", -1)
    # Per column of b = along its last axis; ONNX's DequantizeLinear wants that axis non-negative in opset 10-12.
    axis = len(rw.shape(node, "b")) - 1 if per_column else None
    dq_a, a = _dequantize(rw, node, "a", a_scale, rw.per_tensor(node, "a_zero_point"))
    dq_b, b = _dequantize(rw, node, "b", b_scale, b_zp, axis)
    y = rw.fresh(f"{node.output[0]}_matmul")
    matmul = helper.make_node("MatMul", [a, b], [y], name=node.name or node.output[0])
    return [dq_a, dq_b, matmul, _quantize(rw, node, y)]


def _to_int32(rw: Rewriter, node: onnx.NodeProto, role: str, zp: np.ndarray | str | None,
              zp_shape: tuple[int, ...]) -> tuple[list[onnx.NodeProto], str]:
    """``Cast(input, int32)`` minus the zero point: a constant (left out when it is absent or zero) or the
    name of a single value computed at run time (``DynamicQuantizeLinear``'s)."""
    base, prefix = f"{node.output[0]}_{role}", node.name or node.output[0]
    out = rw.fresh(f"{base}_i32")
    nodes = [helper.make_node("Cast", [rw.input(node, role)], [out], to=TensorProto.INT32, name=f"{prefix}/cast_{role}")]
    zp_name = None
    if isinstance(zp, str):
        zp_name = rw.fresh(f"{base}_zero_point_i32")
        nodes.append(helper.make_node("Cast", [zp], [zp_name], to=TensorProto.INT32, name=f"{prefix}/cast_{role}_zp"))
    elif zp is not None and np.any(zp):
        zp_name = rw.initializer(f"{base}_zero_point", zp.astype(np.int32).reshape(zp_shape))
    if zp_name is not None:
        shifted = rw.fresh(f"{base}_shifted")
        nodes.append(helper.make_node("Sub", [out, zp_name], [shifted], name=f"{prefix}/sub_{role}_zero_point"))
        out = shifted
    return nodes, out


def _runtime_zero_point(rw: Rewriter, node: onnx.NodeProto) -> str:
    """The name of ConvInteger's x_zero_point computed at run time, which must be a single value."""
    name = rw.input(node, "x_zero_point")
    shape = rw.shapes.get(name)
    if shape is not None and int(np.prod(shape)) != 1:
        raise rw.error(node, f"x_zero_point {name!r} has shape {shape}; the spec allows a single value")
    return name


def _conv_integer(rw: Rewriter, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    name = rw.input(node, "x_zero_point")
    x_zp = _runtime_zero_point(rw, node) if name and name not in rw.initializers else rw.constant(node, "x_zero_point")
    w_zp = rw.constant(node, "w_zero_point")
    if isinstance(x_zp, np.ndarray) and x_zp.size != 1:
        raise rw.error(node, f"x_zero_point has shape {x_zp.shape}; the spec allows a single value")
    w_zp_shape: tuple[int, ...] = ()
    if w_zp is not None and w_zp.size != 1:
        if w_zp.ndim != 1:
            raise rw.error(node, f"w_zero_point has shape {w_zp.shape}; expected a single value or a 1-D vector")
        _check_channels(rw, node, "w", 0, w_zp.size, "w_zero_point")
        # Broadcast along the weight's output channels (axis 0 of [M, C/group, k...]).
        w_zp_shape = (w_zp.size,) + (1,) * (len(rw.shape(node, "w")) - 1)
    x_nodes, x = _to_int32(rw, node, "x", x_zp, ())
    w_nodes, w = _to_int32(rw, node, "w", w_zp, w_zp_shape)
    conv = helper.make_node("Conv", [x, w], [node.output[0]], name=node.name or node.output[0])
    conv.attribute.extend(node.attribute)
    return x_nodes + w_nodes + [conv]


def _dynamic_quantize(rw: Rewriter, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """DynamicQuantizeLinear as onnxruntime computes it (see the module docstring)."""
    x, (y, scale, zero_point) = node.input[0], (list(node.output) + ["", "", ""])[:3]
    prefix = node.name or node.output[0]
    scale = scale or rw.fresh(f"{y}_scale")
    zero_point = zero_point or rw.fresh(f"{y}_zero_point")
    consts = {v: rw.initializer(f"{y}_{k}", np.float32(v)) for k, v in (("zero", 0.0), ("one", 1.0), ("qmax", 255.0))}
    nodes = []

    def op(op_type, inputs, out=None, **attrs):
        out = out or rw.fresh(f"{y}_{op_type.lower()}")
        nodes.append(helper.make_node(op_type, inputs, [out], name=f"{prefix}/{op_type.lower()}_{len(nodes)}", **attrs))
        return out

    low = op("Min", [op("ReduceMin", [x], keepdims=0), consts[0.0]])
    high = op("Max", [op("ReduceMax", [x], keepdims=0), consts[0.0]])
    op("Where", [op("Equal", [high, low]), consts[1.0], op("Div", [op("Sub", [high, low]), consts[255.0]])], scale)
    initial = op("Sub", [consts[0.0], op("Div", [low, scale])])
    clipped = op("Min", [op("Max", [initial, consts[0.0]]), consts[255.0]])
    op("Cast", [op("Round", [clipped])], zero_point, to=TensorProto.UINT8)
    op("QuantizeLinear", [x, scale, zero_point], y)
    return nodes


_REWRITES = {"QLinearConv": _qlinear_conv, "QLinearMatMul": _qlinear_matmul, "ConvInteger": _conv_integer,
             "DynamicQuantizeLinear": _dynamic_quantize}


def rewrite_quantized_ops(model: onnx.ModelProto, source: str = "<ModelProto>") -> tuple[onnx.ModelProto, int]:
    """Replace QLinearConv, QLinearMatMul and ConvInteger nodes by ops TVM's importer handles (in place).

    Run it after :func:`~tvmfuse.frontend.fold.fold_constants`, which turns computed scales and zero
    points into initializers.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; its graph is edited in place.
    source : str
        The model's description for error messages.

    Returns
    -------
    tuple of (onnx.ModelProto, int)
        The model and the number of nodes replaced.

    Raises
    ------
    UnsupportedOpError
        Naming the node and the reason, for scales or zero points that are not constants, a per-row
        ``a_scale``/``y_scale`` of QLinearMatMul, or parameters whose shapes do not fit the weight.
    """
    graph = model.graph
    if not any(n.op_type in _REWRITES and n.domain in ("", "ai.onnx") for n in graph.node):
        return model, 0
    rw = Rewriter(model, source)
    nodes, replaced, read = [], 0, set()
    for node in graph.node:
        if node.op_type in _REWRITES and node.domain in ("", "ai.onnx"):
            nodes.extend(_REWRITES[node.op_type](rw, node))
            read.update(node.input)
            replaced += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(rw.new_initializers)
    drop_unused_initializers(graph, read)
    return model, replaced
