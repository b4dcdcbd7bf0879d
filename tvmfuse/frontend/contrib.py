"""onnxruntime's own float operators (domain ``com.microsoft``) spelt with standard ONNX ops.

Users hand over the file they already run, often the one onnxruntime's graph optimizer saved
(``SessionOptions.optimized_model_filepath``): its conv-activation fusion writes ``FusedConv``, its GELU
fusions ``Gelu``, ``BiasGelu``, ``FastGelu`` (and ``QuickGelu``), its MatMul fusions ``FusedMatMul``; its
transformers optimizer (``onnxruntime.transformers.optimizer``) ``SkipLayerNormalization`` and the RMSNorm forms
beside it (``SkipSimplifiedLayerNormalization``; ``SimplifiedLayerNormalization``, which onnxruntime registers
in the ONNX domain) and its self-attention ``Attention`` (:mod:`.contrib_attention`). Each becomes
the standard nodes it stands for, in the forms tvmfuse's partitioner already fuses (a conv with its bias,
residual add and activation; GELU through ``Erf`` or the tanh form; a MatMul with its scale). Other
``com.microsoft`` operators stay and are refused by name (``unsupported ONNX op: com.microsoft.X``).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UnsupportedOpError
from . import contrib_attention
from .normalize import node_attrs

DOMAIN = "com.microsoft"
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


class _Writer:
    """New nodes and constants with names no other node uses."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.taken = {t.name for t in graph.initializer} | {n for node in graph.node
                                                          for n in list(node.input) + list(node.output)}
        self.nodes: list[onnx.NodeProto] = []

    def name(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def const(self, base: str, value: float) -> str:
        name = self.name(base)
        self.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def ints(self, base: str, values: list[int]) -> str:
        name = self.name(base)
        self.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def node(self, op: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        out = output or self.name(f"{inputs[0]}/{op.lower()}")
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out


def _activation(w: _Writer, node: onnx.NodeProto, x: str, out: str, kind: str, params: list[float]) -> str:
    if kind == "Relu" or kind == "Sigmoid" or kind == "Tanh":
        return w.node(kind, [x], out)
    if kind == "LeakyRelu":
        return w.node("LeakyRelu", [x], out, alpha=float(params[0]) if params else 0.01)
    if kind == "Clip":
        lo, hi = (params + [-math.inf, math.inf])[:2] if params else (-math.inf, math.inf)
        return w.node("Clip", [x, w.const(f"{out}/min", lo), w.const(f"{out}/max", hi)], out)
    if kind == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5])[:2] if params else (0.2, 0.5)
        return w.node("HardSigmoid", [x], out, alpha=float(alpha), beta=float(beta))
    raise UnsupportedOpError(f"com.microsoft.FusedConv node {node.name or node.output[0]!r}: activation "
                             f"{kind!r} is not supported")


def _fused_conv(w: _Writer, node: onnx.NodeProto) -> None:
    a = node_attrs(node)
    conv_attrs = {k: v for k, v in a.items() if k in _CONV_ATTRS}
    inputs = list(node.input)
    kind = a.get("activation", "")
    y = node.output[0]
    conv_out = y if not kind and len(inputs) < 4 else w.name(f"{y}/conv")
    x = w.node("Conv", [i for i in inputs[:3]], conv_out, **conv_attrs)
    if len(inputs) > 3 and inputs[3]:  # Z: added to the conv's output before the activation
        x = w.node("Add", [x, inputs[3]], y if not kind else None)
    if kind:
        _activation(w, node, x, y, kind, list(a.get("activation_params", [])))


def _gelu_erf(w: _Writer, x: str, out: str) -> None:
    scaled = w.node("Div", [x, w.const(f"{x}/sqrt2", math.sqrt(2.0))])
    erf = w.node("Add", [w.node("Erf", [scaled]), w.const(f"{x}/one", 1.0)])
    w.node("Mul", [w.node("Mul", [x, erf]), w.const(f"{x}/half", 0.5)], out)


def _gelu_tanh(w: _Writer, x: str, out: str) -> None:
    cube = w.node("Mul", [w.node("Mul", [x, x]), x])
    inner = w.node("Add", [x, w.node("Mul", [cube, w.const(f"{x}/k", 0.044715)])])
    t = w.node("Tanh", [w.node("Mul", [inner, w.const(f"{x}/c", math.sqrt(2.0 / math.pi))])])
    w.node("Mul", [w.node("Mul", [x, w.node("Add", [t, w.const(f"{x}/one", 1.0)])]), w.const(f"{x}/half", 0.5)], out)


def _biased(w: _Writer, node: onnx.NodeProto) -> str:
    x = node.input[0]
    return w.node("Add", [x, node.input[1]]) if len(node.input) > 1 and node.input[1] else x


def _fused_matmul(w: _Writer, node: onnx.NodeProto, ranks: dict) -> None:
    a = node_attrs(node)
    if a.get("transBatchA") or a.get("transBatchB"):
        raise UnsupportedOpError(f"com.microsoft.FusedMatMul node {node.name or node.output[0]!r}: transBatchA/B "
                                 "is not supported")
    operands = []
    for name, flag in zip(node.input[:2], ("transA", "transB")):
        if a.get(flag):
            rank = ranks.get(name)
            if rank is None:
                raise UnsupportedOpError(f"com.microsoft.FusedMatMul node {node.name or node.output[0]!r}: {flag} "
                                         f"needs the rank of {name!r}")
            name = w.node("Transpose", [name], perm=list(range(rank - 2)) + [rank - 1, rank - 2])
        operands.append(name)
    alpha = float(a.get("alpha", 1.0))
    if alpha == 1.0:
        w.node("MatMul", operands, node.output[0])
    else:
        w.node("Mul", [w.node("MatMul", operands), w.const(f"{node.output[0]}/alpha", alpha)], node.output[0])


_NORMS = {  # op -> (skip input, simplified: RMS without the mean)
    "SimplifiedLayerNormalization": (False, True), "SkipLayerNormalization": (True, False),
    "SkipSimplifiedLayerNormalization": (True, True)}
# onnxruntime registers SimplifiedLayerNormalization in the ONNX domain (its optimizer writes it there)
_ONNX_DOMAIN_OPS = {"SimplifiedLayerNormalization"}


def _ours(node: onnx.NodeProto, known: set) -> bool:
    return node.op_type in known and (node.domain == DOMAIN or (node.op_type in _ONNX_DOMAIN_OPS
                                                                and node.domain in ("", "ai.onnx")))


def _layer_norm(w: _Writer, node: onnx.NodeProto, opset: int) -> None:
    """onnxruntime's LayerNorm forms over the last axis: the skip (and bias) added first, its sum an output of its
    own when named; then ``LayerNormalization`` where the model's opset has it (17), else spelt out as
    :mod:`tvmfuse.passes.layer_norm` matches it; the RMS forms spelt out."""
    skip, simplified = _NORMS[node.op_type]
    a = node_attrs(node)
    where = f"com.microsoft.{node.op_type} node {node.name or node.output[0]!r}"
    if int(a.get("axis", -1)) != -1:
        raise UnsupportedOpError(f"{where}: axis {a['axis']} is not supported (the last axis only)")
    outputs = list(node.output) + [""] * 4
    stats = outputs[1:3]
    if any(stats):
        raise UnsupportedOpError(f"{where}: its mean / inverse-std outputs are not supported")
    ins = list(node.input) + [""] * 5
    x, eps = ins[0], float(a.get("epsilon", 1e-5))
    if skip:
        rest = ins[2:5] if not simplified else [ins[2], "", ins[3]]  # gamma, beta, bias
        summed = w.node("Add", [x, ins[1]], outputs[3] if not rest[2] else None)
        x = w.node("Add", [summed, rest[2]], outputs[3] or None) if rest[2] else summed
        gamma, beta = rest[0], rest[1]
    else:
        gamma, beta = ins[1], ("" if simplified else ins[2])
    y = outputs[0]
    if not simplified and opset >= 17:
        w.node("LayerNormalization", [x, gamma] + ([beta] if beta else []), y, axis=-1, epsilon=eps)
        return

    def mean(t):
        if opset >= 18:
            return w.node("ReduceMean", [t, w.ints(f"{y}/axes", [-1])], keepdims=1)
        return w.node("ReduceMean", [t], axes=[-1], keepdims=1)

    centred = x if simplified else w.node("Sub", [x, mean(x)])
    root = w.node("Sqrt", [w.node("Add", [mean(w.node("Mul", [centred, centred])), w.const(f"{y}/eps", eps)])])
    scaled = w.node("Mul", [w.node("Div", [centred, root]), gamma], None if beta else y)
    if beta:
        w.node("Add", [scaled, beta], y)


def rewrite_contrib_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Rewrite the ``com.microsoft`` float operators above in place; return the model and how many."""
    graph = model.graph
    known = {"FusedConv", "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "FusedMatMul", contrib_attention.OP_TYPE} \
        | set(_NORMS)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if not any(_ours(n, known) for n in graph.node):
        return model, 0
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in list(graph.input) + list(graph.value_info)
             if v.type.tensor_type.HasField("shape")}
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    ranks.update({name: len(dims) for name, dims in shapes.items()})
    w = _Writer(graph)
    count = 0
    for node in list(graph.node):
        if not _ours(node, known):
            w.nodes.append(node)
            continue
        count += 1
        if node.op_type == "FusedConv":
            _fused_conv(w, node)
        elif node.op_type in ("Gelu", "BiasGelu"):
            _gelu_erf(w, _biased(w, node), node.output[0])
        elif node.op_type == "FastGelu":
            _gelu_tanh(w, _biased(w, node), node.output[0])
        elif node.op_type == "QuickGelu":
            alpha = float(node_attrs(node).get("alpha", 1.702))
            x = node.input[0]
            w.node("Mul", [x, w.node("Sigmoid", [w.node("Mul", [x, w.const(f"{x}/alpha", alpha)])])], node.output[0])
        elif node.op_type in _NORMS:
            _layer_norm(w, node, opset)
        elif node.op_type == contrib_attention.OP_TYPE:
            weight = shapes.get(node.input[1]) if len(node.input) > 1 else None
            contrib_attention.spell(w, node, ranks, weight, opset)
        else:
            _fused_matmul(w, node, ranks)
    del graph.node[:]
    graph.node.extend(w.nodes)
    return model, count
