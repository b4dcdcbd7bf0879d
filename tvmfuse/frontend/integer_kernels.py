"""The integer ops of a dynamically quantized model on tvmfuse's INT8 kernels: ``MatMulInteger``
(:mod:`.integer_matmul`, where the arithmetic is explained) and ``ConvInteger`` (:mod:`.integer_conv`)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from . import integer_conv, integer_matmul
from .graph import drop_unused_initializers
from .qlinear import Rewriter


def rewrite_integer_kernels(model: onnx.ModelProto, packing: str) -> tuple[onnx.ModelProto, int]:
    """Replace each ``MatMulInteger`` and ``ConvInteger`` that :mod:`.integer_matmul` and :mod:`.integer_conv` take
    by an ``IntegerMatMul`` / ``IntegerConv`` node (in place), the weight packed for ``packing`` (the target
    backend's ``int8_weights``; nothing is replaced for one not in :data:`.integer_matmul.PACKINGS`). Run it
    after constant folding, before :func:`.integer_ops.rewrite_integer_ops`."""
    graph = model.graph
    makers = {"MatMulInteger": integer_matmul.node, "ConvInteger": integer_conv.node}
    if packing not in integer_matmul.PACKINGS or not any(n.op_type in makers and n.domain in ("", "ai.onnx")
                                                         for n in graph.node):
        return model, 0
    rw = Rewriter(model, "<ModelProto>")
    rw.dtypes = {v.name: v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.value_info)}
    rw.dtypes.update({t.name: t.data_type for t in graph.initializer})
    for n in graph.node:  # DynamicQuantizeLinear writes uint8 codes; value_info may not say so
        if n.op_type == "DynamicQuantizeLinear" and n.domain in ("", "ai.onnx"):
            rw.dtypes[n.output[0]] = TensorProto.UINT8
    rw.producers = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    outputs = {o.name for o in graph.output}
    replace, new, read, replaced = {}, [], set(), 0
    for n in graph.node:
        made = makers[n.op_type](rw, n, packing, readers, outputs) \
            if n.op_type in makers and n.domain in ("", "ai.onnx") else None
        if made is None:
            continue
        op, inits, old = made
        for gone in old[:-1]:
            replace[id(gone)] = []
        replace[id(old[-1])] = [op]  # where the last replaced node was: every input of the new one exists there
        new.extend(inits)
        read.update(n.input[1:])
        replaced += 1
    if replaced:
        nodes = [m for n in graph.node for m in replace.get(id(n), [n])]
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(new)
        if not any(o.domain == integer_matmul.DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(integer_matmul.DOMAIN, 1))
        drop_unused_initializers(graph, read)
    return model, replaced
