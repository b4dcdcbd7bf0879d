"""Reading ONNX graphs in tests: shapes, constants (initializers and ``Constant`` nodes), producers and
consumers of a tensor, attributes, nodes by op, and onnxruntime runs with intermediate outputs."""

from __future__ import annotations

import numpy as np
import onnx


def shape_of(value_info: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in value_info.type.tensor_type.shape.dim)


def concrete(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if d == -1 else d for d in shape)


def constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and ``Constant``-node values (Paddle-style models use the latter)."""
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            consts[node.output[0]] = onnx.numpy_helper.to_array(node.attribute[0].t)
    return consts


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            out.setdefault(i, []).append(node)
    return out


def attr(node: onnx.NodeProto, name: str, default=None):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name),
                default)


def nodes(model: onnx.ModelProto, op: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op]


def run_ort(model: onnx.ModelProto, extra_outputs: list[str] = ()) -> dict[str, np.ndarray]:
    """Run on a seeded standard-normal input; returns every output by name."""
    for t in extra_outputs:
        model.graph.output.append(onnx.ValueInfoProto(name=t))
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    dims = concrete(shape_of(model.graph.input[0]))
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"input": x})))
