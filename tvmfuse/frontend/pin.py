"""Pinned inputs and the ``If`` nodes they decide.

A model may branch on an input that is fixed wherever it is deployed (an audio model's sample rate, a flag
chosen at export). ``--const NAME=VALUE`` (Python: ``consts={NAME: VALUE}``) turns such an input into a
constant (:func:`pin_inputs`); constant folding then turns an ``If``'s condition into a constant, and
:func:`inline_ifs` replaces the ``If`` by the branch it takes (its nodes inlined, reading outer names as
before; the other branch dropped), nested ``If`` too. An ``If`` whose condition still depends on data is
refused in one line naming the node and the inputs its condition reads. (``Loop`` and ``Scan`` are refused
by name: tvmfuse unrolls no loop.)
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import InputError, UnsupportedOpError
from .graph import subgraphs
from .load import graph_inputs


def _values(text_or_value, name: str) -> np.ndarray:
    if isinstance(text_or_value, str):
        try:
            return np.array([float(v) for v in text_or_value.split(",")], dtype=np.float64)
        except ValueError:
            raise InputError(f"--const {name}={text_or_value}: not a number or a comma-separated list of numbers") \
                from None
    return np.asarray(text_or_value)


def pin_inputs(model: onnx.ModelProto, consts: Mapping[str, object] | None) -> dict[str, dict]:
    """Make each input named in ``consts`` an initializer of the given value (in place); return, per pinned
    input, its ``shape``, ``dtype`` and ``value`` (a flat list) for the manifest. A value may be a number, a
    list, an array, or the text after ``--const NAME=``; it must fill the input's static shape (a dynamic
    one takes the value's)."""
    pinned: dict[str, dict] = {}
    if not consts:
        return pinned
    inputs = {v.name: v for v in graph_inputs(model)}
    unknown = sorted(set(consts) - set(inputs))
    if unknown:
        raise InputError(f"--const names unknown input(s) {unknown}; the model's inputs are {sorted(inputs)}")
    for name, given in consts.items():
        value = inputs[name]
        elem = value.type.tensor_type.elem_type
        dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else np.dtype(np.float32)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
        array = _values(given, name)
        if any(d is None for d in dims):
            shape = list(array.shape) if array.ndim == len(dims) else None
        else:
            shape = dims
        if shape is None or int(np.prod(shape, dtype=np.int64)) != array.size:
            raise InputError(f"--const {name}: input {name!r} has shape {tuple(d if d else '?' for d in dims)}; "
                             f"{array.size} value(s) given")
        cast = array.astype(dtype)
        if np.issubdtype(dtype, np.integer) and not np.array_equal(cast, array):
            raise InputError(f"--const {name}: input {name!r} is {np.dtype(dtype).name}; "
                             f"{array.ravel().tolist()} is not")
        model.graph.initializer.append(numpy_helper.from_array(cast.reshape(shape), name))
        kept = [v for v in model.graph.input if v.name != name]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        pinned[name] = {"shape": list(shape), "dtype": np.dtype(dtype).name, "value": cast.ravel().tolist()}
    return pinned


def _inputs_read(graph: onnx.GraphProto, name: str) -> list[str]:
    """The graph inputs whose values reach ``name``."""
    producers = {o: n for n in graph.node for o in n.output}
    inputs = {v.name for v in graph.input}
    found, stack, seen = set(), [name], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in inputs:
            found.add(current)
        node = producers.get(current)
        if node is not None:
            stack.extend(i for i in node.input if i)
    return sorted(found)


def _rename_in(graph: onnx.GraphProto, renamed: dict) -> None:
    """Rename references to ``renamed`` names in ``graph`` and the graphs nested in its nodes."""
    for node in graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        node.output[:] = [renamed.get(o, o) for o in node.output]
        for sub in subgraphs(node):
            _rename_in(sub, renamed)
    for out in graph.output:
        out.name = renamed.get(out.name, out.name)


def _inline(graph: onnx.GraphProto, position: int, node: onnx.NodeProto, taken: bool) -> None:
    """Replace ``graph.node[position]`` (``node``, an If) by the nodes of its ``then``/``else`` branch."""
    branch = next(helper.get_attribute_value(a) for a in node.attribute
                  if a.name == ("then_branch" if taken else "else_branch"))
    prefix = f"{node.name or node.output[0]}/{'then' if taken else 'else'}/"
    local = {t.name for t in branch.initializer} | {o for n in branch.node for o in n.output if o}
    renamed = {n: prefix + n for n in local}
    body = onnx.GraphProto()
    body.CopyFrom(branch)
    _rename_in(body, renamed)
    for init in body.initializer:
        init.name = renamed.get(init.name, init.name)
    nodes = list(body.node) + [helper.make_node("Identity", [out.name], [target], name=f"{prefix}out{i}")
                               for i, (out, target) in enumerate(zip(body.output, node.output)) if target]
    graph.initializer.extend(body.initializer)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(rest[:position] + nodes + rest[position + 1:])


def inline_ifs(model: onnx.ModelProto, fold: Callable[[onnx.ModelProto], tuple], source: str) -> int:
    """Inline every ``If`` of the main graph whose condition ``fold`` (constant folding) makes a constant,
    repeating for the ``If`` nodes an inlined branch brings; return how many were inlined."""
    inlined = 0
    while True:
        graph = model.graph
        found = [(i, n) for i, n in enumerate(graph.node) if n.op_type == "If" and n.domain in ("", "ai.onnx")]
        if not found:
            return inlined
        constants = {t.name: t for t in graph.initializer}
        for position, node in found:
            cond = constants.get(node.input[0])
            if cond is None:
                reads = _inputs_read(graph, node.input[0])
                where = f"input(s) {reads}" if reads else "values computed at run time"
                raise UnsupportedOpError(
                    f"{source}: If node {node.name or node.output[0]!r}: its condition depends on {where}; pin "
                    f"{'them' if len(reads) > 1 else 'it'} with --const NAME=VALUE (Python: consts=) if "
                    "fixed where the model is deployed")
            _inline(graph, position, node, bool(numpy_helper.to_array(cond).ravel()[0]))
            inlined += 1
            break  # positions moved: look again
        model_folded, _ = fold(model)
        model.CopyFrom(model_folded)
