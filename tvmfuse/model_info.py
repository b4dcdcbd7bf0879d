"""Static facts about an ONNX model: inputs/outputs, op histogram, parameter count and FLOPs (no TVM)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
from onnx import helper

from .frontend import prepare
from .frontend.skeleton import skeleton
from .tensors import TensorInfo


@dataclasses.dataclass
class ModelInfo:
    """What ``tvmfuse info`` prints."""

    source: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    op_histogram: dict[str, int]
    parameters: int
    flops: int
    flops_by_op: dict[str, int]

    def format(self) -> str:
        lines = [f"model: {self.source}"]
        lines += [f"input:  {i}" for i in self.inputs] + [f"output: {o}" for o in self.outputs]
        lines.append(f"parameters: {self.parameters:,}")
        lines.append(f"FLOPs: {self.flops:,} ({self.flops / 1e9:.3f} GFLOP; 2 per multiply-add, conv/gemm/matmul)")
        for op, f in sorted(self.flops_by_op.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {op:<12} {f / 1e9:8.3f} GFLOP")
        lines.append(f"ops (after constant folding and Pad+Conv fusion): {sum(self.op_histogram.values())} nodes")
        for op, n in sorted(self.op_histogram.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {op:<24} {n}")
        return "\n".join(lines)


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    model = onnx.shape_inference.infer_shapes(skeleton(model))  # large weights as inputs: their dims kept
    g = model.graph
    out = {t.name: tuple(t.dims) for t in g.initializer}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        t = v.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[v.name] = tuple(d.dim_value for d in t.shape.dim)
    return out


def node_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """FLOPs of one Conv/ConvInteger/QLinearConv/Gemm/MatMul node (2 per multiply-add); 0 for other ops."""
    op = node.op_type
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        w_index = 3 if op == "QLinearConv" else 1
        out, w = shapes.get(node.output[0]), shapes.get(node.input[w_index])
        if out is None or w is None:
            return 0
        # Weight (Cout, Cin/groups, kh, kw): each output element takes prod(w[1:]) multiply-adds.
        return 2 * int(np.prod(out)) * int(np.prod(w[1:]))
    if op in ("Gemm", "MatMul", "MatMulInteger", "QLinearMatMul"):
        a, out = shapes.get(node.input[0]), shapes.get(node.output[0])
        if a is None or out is None or not a:
            return 0
        trans_a = any(x.name == "transA" and x.i for x in node.attribute)
        k = a[-2] if (op == "Gemm" and trans_a) else a[-1]
        return 2 * int(np.prod(out)) * int(k)
    return 0


def parameter_count(model: onnx.ModelProto) -> int:
    """Learned parameters: float (and int8) initializer elements, less batch-norm running statistics and
    scalars (clip bounds, pad values), which are constants, not parameters."""
    stats = {n.input[i] for n in model.graph.node if n.op_type == "BatchNormalization" for i in (3, 4)
             if len(n.input) > i}
    total = 0
    for t in model.graph.initializer:
        if t.name in stats or int(np.prod(t.dims)) <= 1:
            continue
        if np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).kind == "f" or t.data_type == onnx.TensorProto.INT8:
            total += int(np.prod(t.dims))
    return total


def info(model, shapes=None, consts=None) -> ModelInfo:
    """Collect :class:`ModelInfo` for a path, ModelProto or ``zoo:NAME`` (static shapes needed for FLOPs;
    ``consts``: pinned inputs, see ``tvmfuse.compile``)."""
    proto, source, inputs, _, _ = prepare(model, shapes, consts=consts)
    shape_of = _shapes(proto)
    flops_by_op: dict[str, int] = collections.Counter()
    for node in proto.graph.node:
        f = node_flops(node, shape_of)
        if f:
            flops_by_op[node.op_type] += f
    outputs = [TensorInfo(o.name, shape_of.get(o.name, ()),
                          np.dtype(helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type)).name)
               for o in proto.graph.output]
    hist = collections.Counter(n.op_type for n in proto.graph.node)
    return ModelInfo(source, inputs, outputs, dict(hist), parameter_count(proto), sum(flops_by_op.values()),
                     dict(flops_by_op))
