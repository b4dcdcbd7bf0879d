"""A recurrent weight given as integer codes: ``R = DequantizeLinear(codes, scale, zero_point)`` of constants
(possibly reshaped), as :mod:`.qlinear_contrib` writes a ``DynamicQuantizeLSTM``'s ``R``.

:mod:`.rnn` needs every weight's value; :func:`fold` computes it (the ONNX definition, ``(codes -
zero_point) * scale`` in float32) and keeps the codes, so a whole-sequence LSTM kernel can read them instead
of the float weight (:func:`tvmfuse.schedules.computes.recurrence.lstm_kernel` with ``codes``): a step of a
512-unit layer reads 1 MB of codes instead of 4 MB of floats.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper

#: ops folded when all their inputs are constants
FOLDED_OP_TYPES = ("DequantizeLinear", "Reshape")
#: set (to 1) on the LSTM :mod:`.qlinear_contrib` writes for a ``DynamicQuantizeLSTM``: the input projection
#: quantizes the input at run time, as that operator defines it (:func:`quantized_projection`)
DYNAMIC_INPUT_ATTR = "tvmfuse_dynamic_input"


@dataclasses.dataclass(frozen=True)
class Codes:
    """``value = (codes - zero_point) * scale`` elementwise, every array of the weight's shape."""

    codes: np.ndarray
    zero_point: np.ndarray
    scale: np.ndarray

    def reshaped(self, shape) -> "Codes":
        return Codes(*(a.reshape(shape) for a in (self.codes, self.zero_point, self.scale)))

    def gate_columns(self) -> tuple[np.ndarray, np.ndarray] | None:
        """For ONNX's ``R`` (``[D, G*H, H]``): ``(codes - zero_point)`` transposed to the kernel's ``[D, H, G*H]``,
        as int8 where every code fits, else int16, and the scale of each gate column ``[D, G*H]``; None when a
        scale or zero point varies along a gate's inputs (the kernel scales a column's sum once) or a code
        does not fit int16."""
        if self.codes.ndim != 3:
            return None
        first = (slice(None), slice(None), slice(0, 1))
        if not (np.all(self.scale == self.scale[first]) and np.all(self.zero_point == self.zero_point[first])):
            return None
        centred = self.codes.astype(np.int32) - self.zero_point.astype(np.int32)
        dtype = next((t for t in (np.int8, np.int16)
                      if np.iinfo(t).min <= centred.min() and centred.max() <= np.iinfo(t).max), None)
        if dtype is None:
            return None
        return (np.ascontiguousarray(centred.transpose(0, 2, 1)).astype(dtype),
                np.ascontiguousarray(self.scale[:, :, 0]).astype(np.float32))


    def input_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """For ONNX's ``W`` (``[D, G*H, I]``): the codes as ``[I, D*G*H]`` (their own dtype), and each column's
        zero point and scale; None when either varies along a gate's inputs."""
        if self.codes.ndim != 3:
            return None
        first = (slice(None), slice(None), slice(0, 1))
        if not (np.all(self.scale == self.scale[first]) and np.all(self.zero_point == self.zero_point[first])):
            return None
        rows = self.codes.shape[0] * self.codes.shape[1]
        return (np.ascontiguousarray(self.codes.reshape(rows, -1).T), self.zero_point[:, :, 0].reshape(-1),
                self.scale[:, :, 0].reshape(-1).astype(np.float32))


def quantized_projection(e, x_rows: str, codes: Codes) -> str | None:
    """``x_rows @ W^T`` as a ``DynamicQuantizeLSTM`` computes it: ``x`` quantized at run time
    (``DynamicQuantizeLinear``), ``MatMulInteger`` with the codes, then times both scales, which the INT8 dense
    kernel computes exactly (:mod:`.integer_matmul`). None (the float projection stays) when ``codes`` has no
    :meth:`Codes.input_columns`. ``e`` is the rewrite's :class:`.rnn_cells.Emitter`."""
    columns = codes.input_columns()
    if columns is None:
        return None
    q, zero, scale = columns
    quantized = [e.fresh(f"{e.prefix}/x_{what}") for what in ("quantized", "scale", "zero_point")]
    e.nodes.append(helper.make_node("DynamicQuantizeLinear", [x_rows], quantized, name=f"{e.prefix}/x_quantize"))
    inputs = [quantized[0], e.const("W_codes_T", q, q.dtype), quantized[2]]
    if np.any(zero):
        inputs.append(e.const("W_zero_point", zero, q.dtype))
    value = e.op("Cast", [e.op("MatMulInteger", inputs, "xW_int32")], "xW_int32_f32", to=onnx.TensorProto.FLOAT)
    return e.op("Mul", [value, e.op("Mul", [quantized[1], e.const("W_scale", scale)], "xW_scale")], "xW")


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Output name -> the node of :data:`FOLDED_OP_TYPES` (default domain) that writes it."""
    return {n.output[0]: n for n in graph.node
            if n.op_type in FOLDED_OP_TYPES and n.domain in ("", "ai.onnx") and len(n.output) == 1}


def fold(node: onnx.NodeProto, value_of) -> tuple[np.ndarray, Codes | None] | None:
    """The value of ``node``'s output, with its codes when it is dequantized ones; None when an input is
    computed at run time or the node is outside what is folded here. ``value_of(name)`` returns an input's
    ``(value, codes or None)``, or None."""
    inputs = [value_of(name) if name else None for name in node.input]
    if any(v is None for name, v in zip(node.input, inputs) if name):
        return None
    if node.op_type == "Reshape":
        (data, codes), (shape, _) = inputs[0], inputs[1]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("allowzero", 0) or any(int(d) == 0 for d in shape):
            return None
        value = data.reshape([int(d) for d in shape])
        return value, None if codes is None else codes.reshaped(value.shape)
    codes = inputs[0][0]
    if not np.issubdtype(codes.dtype, np.integer):
        return None
    scale = inputs[1][0].astype(np.float32)
    zero = inputs[2][0] if len(inputs) > 2 and inputs[2] is not None else np.zeros_like(scale, codes.dtype)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if scale.size > 1:
        if scale.ndim != 1 or attrs.get("block_size", 0):
            return None
        axis = int(attrs.get("axis", 1)) % max(codes.ndim, 1)
        shape = [1] * codes.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    scale, zero = np.broadcast_to(scale, codes.shape), np.broadcast_to(zero, codes.shape)
    value = ((codes.astype(np.float32) - zero.astype(np.float32)) * scale).astype(np.float32)
    return value, Codes(codes, np.ascontiguousarray(zero), np.ascontiguousarray(scale))


def drop_unread(graph: onnx.GraphProto, candidates: set[str], read_names) -> set[str]:
    """Remove the nodes of :data:`FOLDED_OP_TYPES` writing one of ``candidates`` (names a rewrite no longer
    reads) that nothing reads any more, then those that fed only them; return the names the removed nodes read."""
    removed: set[str] = set()
    while True:
        used = read_names(graph) | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in FOLDED_OP_TYPES and n.output and n.output[0] in candidates
                and n.output[0] not in used]
        if not dead:
            return removed
        for n in dead:
            removed.update(n.input)
            candidates = candidates | set(n.input)
        kept = [n for n in graph.node if all(n is not d for d in dead)]
        del graph.node[:]
        graph.node.extend(kept)
