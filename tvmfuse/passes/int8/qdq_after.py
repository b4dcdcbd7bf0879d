"""FuseQDQ: what ONNX Runtime's quantizer writes after a chain's quantize that the INT8 kernels can still take
on codes: a residual add, and a max-pool.

ONNX Runtime quantizes each input of an Add on its own, so a ResNet's residual add is ::

    conv ... -> Q (y codes) -> DQ ----\\
                                       Add [-> Relu | Clip] -> Q (sum codes)
    r codes -------------------> DQ --/

Computed as written, each add is a float kernel that reads both tensors' codes, and the conv writes its codes
in NCHW for it. :func:`added_after` finds the add so that the chain's kernel computes it in its epilogue
(:class:`tvmfuse.schedules.computes.int8_epilogue.Requantized`): ``y``'s codes as the model rounds them, both
dequantized and added in float32, the sum quantized as QuantizeLinear does. No value in between is read by
anything else, so nothing is lost; ONNX Runtime itself runs the same add as a QLinearAdd.

A max-pool between two quantizes with the same parameters (``DQ -> MaxPool -> Q``, the quantizer gives both
sides one scale) is a max-pool of the codes, the same integers (dequantizing is increasing, and the padding's
-inf is the codes' minimum): :func:`code_pools` finds them, and the rewrite pools the codes, NCHW16c where
its input is.
"""

from __future__ import annotations

import dataclasses

from tvm import relax

from .match import AddedAfter, clip_bounds
from .qdq_graph import Graph, Refused, codes_of, ints, op_name, qparams


@dataclasses.dataclass
class Added:
    """A residual add after a chain's quantize: the sum's quantize (var and call), the residual's codes var and
    parameters, the partition's :class:`AddedAfter` and the ops, named as in composites."""

    end: relax.Var
    quantize: relax.Call
    residual: tuple
    after: AddedAfter
    ops: list


def added_after(graph: Graph, end: relax.Var, codes, anchor_name: str) -> Added | None:
    """The residual add reading the chain's codes ``end`` (parameters ``codes``), or None where the model has
    none that the kernel can take (it then stays a float kernel, as the model wrote it)."""
    try:
        dq_var, dq = graph.next_binding(end, anchor_name)
        if op_name(dq) != "relax.dequantize" or qparams(dq, str(end.ty.dtype), "the dequantize") != codes:
            return None
        var, add = graph.next_binding(dq_var, anchor_name)
        if op_name(add) != "relax.add" or ints(add.ty.shape) != ints(end.ty.shape):
            return None
        other = add.args[1] if add.args[0].same_as(dq_var) else add.args[0]
        if not isinstance(other.ty, relax.TensorType) or ints(other.ty.shape) != ints(end.ty.shape):
            return None
        residual, ops, clip = codes_of(graph, other, "the residual operand"), ["dequantize", "add"], None
        prev, (var, call) = var, graph.next_binding(var, anchor_name)
        if op_name(call) in ("relax.nn.relu", "relax.clip"):
            clip = (0.0, None) if op_name(call) == "relax.nn.relu" else clip_bounds(call)
            ops.append(op_name(call).replace("relax.nn.", "").replace("relax.", ""))
            prev, (var, call) = var, graph.next_binding(var, anchor_name)
        if op_name(call) != "relax.quantize" or not call.args[0].same_as(prev):
            return None
        qparams(call, str(call.attrs.out_dtype), "the sum's quantize")
    except Refused:
        return None
    return Added(var, call, residual, AddedAfter(codes, clip), ops)


@dataclasses.dataclass
class CodePool:
    """A max-pool of codes: its input codes var, the pool call, and the quantize var it replaces."""

    data: relax.Var
    pool: relax.Call
    end: relax.Var


def code_pools(graph: Graph, func: relax.Function) -> list[CodePool]:
    """Every ``DQ(codes) -> max_pool2d (NCHW) -> Q`` of ``main`` whose quantize has the dequantize's parameters."""
    found = []
    for block in func.body.blocks:
        for binding in block.bindings:
            pool = binding.value
            if op_name(pool) != "relax.nn.max_pool2d" or str(pool.attrs.layout) != "NCHW" \
                    or str(pool.attrs.out_layout) != "NCHW":
                continue
            try:
                data, params = codes_of(graph, pool.args[0], "the pool's input")
                var, call = graph.next_binding(binding.var, "max_pool2d")
                if op_name(call) == "relax.quantize" and call.args[0].same_as(binding.var) \
                        and qparams(call, str(call.attrs.out_dtype), "the pool's quantize") == params:
                    found.append(CodePool(data, pool, var))
            except Refused:
                continue
    return found
