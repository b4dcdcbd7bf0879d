"""onnxruntime's ``com.microsoft.Attention`` (what its transformers optimizer writes for a BERT-style self-attention)
spelt with standard ONNX ops, for :mod:`.contrib`.

``Attention(input [B, S, D], weights [D, Dq + Dk + Dv], bias?, mask_index?)`` with ``num_heads`` N: the packed
projection ``input @ weights + bias``, split into Q, K, V at the ``qkv_hidden_sizes`` (equal thirds by default),
each ``[B, S, N, d]`` moved to ``[B, N, S, d]``; ``softmax(Q K^T * scale + mask) V`` (``scale`` 1/sqrt(d) unless the
attribute sets it), back to ``[B, S, Dv]``. The mask: none, or the raw 2-D ``[B, S]`` form (1 attends, 0 does
not), added as ``(1 - mask) * mask_filter_value`` (-10000 by default). Refused by name: the other mask forms
(key lengths, 3-D, 4-D), ``past``/``present``, ``unidirectional``, rotary embeddings, an attention bias.
The reshapes keep the batch and sequence dims as they are (``0`` in ONNX's ``Reshape``), so no shape is needed.
"""

from __future__ import annotations

import math

import onnx

from ..errors import UnsupportedOpError
from .normalize import node_attrs

OP_TYPE = "Attention"


def _where(node: onnx.NodeProto) -> str:
    return f"com.microsoft.Attention node {node.name or node.output[0]!r}"


def _check(node: onnx.NodeProto, attrs: dict, ranks: dict) -> None:
    ins = list(node.input) + [""] * 8
    unsupported = [what for what, present in (
        ("past", ins[4]), ("relative_position_bias / attention_bias", ins[5]), ("past_sequence_length", ins[6]),
        ("the present output", len(node.output) > 1 and node.output[1]),
        ("unidirectional", attrs.get("unidirectional", 0)), ("do_rotary", attrs.get("do_rotary", 0))) if present]
    if unsupported:
        raise UnsupportedOpError(f"{_where(node)}: {unsupported[0]} is not supported")
    if ins[3] and ranks.get(ins[3]) != 2:
        raise UnsupportedOpError(f"{_where(node)}: mask_index of rank {ranks.get(ins[3], 'unknown')} is not "
                                 "supported (the raw [batch, sequence] mask only)")


def spell(w, node: onnx.NodeProto, ranks: dict, weight_shape: tuple[int, ...] | None, opset: int) -> None:
    """Append the standard nodes of ``node`` to ``w`` (:class:`.contrib._Writer`); ``weight_shape`` is the packed
    weight's shape when it is a constant."""
    attrs = node_attrs(node)
    _check(node, attrs, ranks)
    if opset < 11:
        raise UnsupportedOpError(f"{_where(node)}: needs opset 11 or later (the model has {opset})")
    heads = int(attrs["num_heads"])
    sizes = [int(s) for s in attrs.get("qkv_hidden_sizes", [])]
    if not sizes:
        if weight_shape is None or weight_shape[-1] % 3:
            raise UnsupportedOpError(f"{_where(node)}: the Q, K, V sizes need qkv_hidden_sizes or a constant weight")
        sizes = [weight_shape[-1] // 3] * 3
    if any(s % heads for s in sizes) or sizes[0] != sizes[1]:
        raise UnsupportedOpError(f"{_where(node)}: qkv_hidden_sizes {sizes} do not split into {heads} heads")
    ins = list(node.input) + [""] * 4
    y = node.output[0]
    qkv = w.node("MatMul", ins[:2])
    if ins[2]:
        qkv = w.node("Add", [qkv, ins[2]])
    bounds = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    parts = []
    for i, perm in enumerate(([0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3])):  # Q, K transposed, V
        part = w.node("Slice", [qkv, w.ints(f"{y}/start{i}", [bounds[i]]), w.ints(f"{y}/end{i}", [bounds[i + 1]]),
                                w.ints(f"{y}/axis", [-1])])
        heads_shape = w.ints(f"{y}/heads{i}", [0, 0, heads, sizes[i] // heads])
        parts.append(w.node("Transpose", [w.node("Reshape", [part, heads_shape])], perm=perm))
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(sizes[0] // heads)
    scores = w.node("Mul", [w.node("MatMul", parts[:2]), w.const(f"{y}/scale", scale)])
    if ins[3]:
        keep = w.node("Cast", [ins[3]], to=onnx.TensorProto.FLOAT)
        dropped = w.node("Sub", [w.const(f"{y}/one", 1.0), keep])
        filter_value = float(attrs.get("mask_filter_value", -10000.0))
        bias = w.node("Mul", [dropped, w.const(f"{y}/mask_filter_value", filter_value)])
        if opset >= 13:
            bias = w.node("Unsqueeze", [bias, w.ints(f"{y}/mask_axes", [1, 2])])
        else:
            bias = w.node("Unsqueeze", [bias], axes=[1, 2])
        scores = w.node("Add", [scores, bias])
    probs = w.node("Softmax", [scores], axis=-1)
    out = w.node("Transpose", [w.node("MatMul", [probs, parts[2]])], perm=[0, 2, 1, 3])
    w.node("Reshape", [out, w.ints(f"{y}/merged", [0, 0, sizes[2]])], y)
