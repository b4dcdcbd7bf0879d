"""An ``Einsum`` that is a matrix product, written as one: ``Reshape -> MatMul -> Reshape``.

TensorFlow exports attention's output projection as ``Einsum("abcd,cde->abe", heads, weight)``; TVM's importer
turns an Einsum into a generic ``einsum`` kernel, which no tvmfuse rule schedules (g2p-id's BERT: a third of its
time in it). When the summed letters are the trailing axes of the first operand and the leading axes of the second,
in the same order, and the output is the first operand's other axes then the second's, the Einsum is

    Reshape(A, [0, ..., 0, K]) @ Reshape(B, [K, -1])  -> Reshape(.., [0, ..., 0, f1, f2, ...])

(``0`` keeps an axis; ``K`` the product of the summed axes, ``f`` the second operand's other axes, all known from
its static shape), a MatMul the dense rules take. Other equations stay as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .normalize import node_attrs


def _plan(equation: str, b_shape) -> tuple[int, list[int], list[int]] | None:
    """``(free axes of A, summed sizes, free sizes of B)`` for an equation of the product form above; None
    otherwise."""
    if "..." in equation or "->" not in equation:
        return None
    inputs, out = equation.replace(" ", "").split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        return None
    a, b = parts
    if len(set(a)) != len(a) or len(set(b)) != len(b) or len(b) != len(b_shape):
        return None
    summed = [c for c in b if c in a and c not in out]
    k = len(summed)
    if k == 0 or a[len(a) - k:] != "".join(summed) or b[:k] != "".join(summed) or out != a[:len(a) - k] + b[k:]:
        return None
    return len(a) - k, [int(d) for d in b_shape[:k]], [int(d) for d in b_shape[k:]]


def rewrite_einsums(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Replace each ``Einsum`` of the product form by Reshape/MatMul/Reshape (in place); return the model and
    how many were replaced. Needs the second operand's static shape (an initializer, or the value_info)."""
    graph = model.graph
    if not any(n.op_type == "Einsum" and n.domain in ("", "ai.onnx") for n in graph.node):
        return model, 0
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    for v in list(graph.input) + list(graph.value_info):
        dims = v.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            shapes.setdefault(v.name, tuple(d.dim_value for d in dims))
    taken = {name for n in graph.node for name in list(n.input) + list(n.output)} | set(shapes)
    nodes, new, count = [], [], 0

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        taken.add(name)
        return name

    def ints(base: str, values) -> str:
        name = fresh(base)
        new.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    for node in graph.node:
        plan = None
        if node.op_type == "Einsum" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
            b_shape = shapes.get(node.input[1])
            plan = _plan(str(node_attrs(node).get("equation", "")), b_shape) if b_shape else None
        if plan is None:
            nodes.append(node)
            continue
        free_a, summed, free_b = plan
        size, prefix = int(np.prod(summed)), node.name or node.output[0]
        a2, b2, product = fresh(f"{prefix}/a_rows"), fresh(f"{prefix}/b_matrix"), fresh(f"{prefix}/product")
        nodes += [helper.make_node("Reshape", [node.input[0], ints(f"{prefix}/a_shape", [0] * free_a + [size])],
                                   [a2], name=f"{prefix}/reshape_a"),
                  helper.make_node("Reshape", [node.input[1], ints(f"{prefix}/b_shape", [size, -1])], [b2],
                                   name=f"{prefix}/reshape_b"),
                  helper.make_node("MatMul", [a2, b2], [product], name=f"{prefix}/matmul"),
                  helper.make_node("Reshape", [product, ints(f"{prefix}/out_shape", [0] * free_a + free_b)],
                                   list(node.output), name=prefix)]
        count += 1
    if count:
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(new)
    return model, count
