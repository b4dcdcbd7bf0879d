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
-inf is the codes' minimum): :func:`ops_on_codes` finds them, and the rewrite pools the codes, NCHW16c where
its input is.

A squeeze-and-excitation block's spatial mean (``DQ -> ReduceMean/GlobalAveragePool -> Q``) and its channel
gate (``DQ(x) * DQ(gate) -> Q``, the gate one value per channel) of uint8 codes run as the kernels tvmfuse's
own quantization uses for them (:mod:`tvmfuse.schedules.computes.int8_se`: the mean's sum exact in int32, one
float32 multiply each, halves rounded up where QuantizeLinear rounds them to even), NCHW16c where their input
is: :func:`ops_on_codes` finds them too. So does a channel concat of uint8 codes (``DQ(a), DQ(b), ... -> Concat
-> Q``: an FPN neck's, a CSP block's) as :mod:`tvmfuse.schedules.computes.int8_concat`'s kernel, each input
requantized to the output's parameters (copied where they are the same), NCHW16c where every input fills whole
blocks of 16 channels.
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

    @property
    def inputs(self) -> list:
        return [self.data]


@dataclasses.dataclass
class CodeSqueeze:
    """A spatial mean (``gate`` None) or a channel gate of codes: the input codes var and parameters, the gate's
    float value (a ``[N, C, 1, 1]`` expression), the quantize var it replaces and the output parameters."""

    data: relax.Var
    params: object
    gate: object
    end: relax.Var
    out: object

    @property
    def inputs(self) -> list:
        return [self.data]


def _squeeze(graph: Graph, var, call) -> CodeSqueeze | None:
    """The mean or gate bound to ``var`` as a :class:`CodeSqueeze`, or None."""
    shape = ints(var.ty.shape) if isinstance(var.ty, relax.TensorType) and var.ty.ndim == 4 else None
    if shape is None:
        return None
    if op_name(call) == "relax.mean":
        axes = sorted(int(a) % 4 for a in call.attrs.axis) if call.attrs.axis is not None else []
        if axes != [2, 3] or not call.attrs.keepdims:
            return None
        data, gate = call.args[0], None
    elif op_name(call) == "relax.multiply":
        small = [a for a in call.args if ints(a.ty.shape) == shape[:2] + [1, 1]]
        if len(small) != 1 or shape[2:] == [1, 1] or not all(ints(a.ty.shape) in (shape, shape[:2] + [1, 1])
                                                             for a in call.args):
            return None
        gate = small[0]
        data = call.args[1] if call.args[0].same_as(gate) else call.args[0]
        if op_name(graph.value(gate)) != "relax.dequantize":
            return None
    else:
        return None
    codes, params = codes_of(graph, data, "the input")
    end, quantize = graph.next_binding(var, op_name(call))
    if op_name(quantize) != "relax.quantize" or not quantize.args[0].same_as(var) or params.dtype != "uint8":
        return None
    out = qparams(quantize, str(quantize.attrs.out_dtype), "the quantize")
    return CodeSqueeze(codes, params, gate, end, out) if out.dtype == "uint8" else None


@dataclasses.dataclass
class CodeConcat:
    """A channel concat of codes: its inputs' codes vars and parameters, the quantize var it replaces and the
    output parameters."""

    parts: list
    params: list
    end: relax.Var
    out: object

    @property
    def inputs(self) -> list:
        return list(self.parts)


def _concat(graph: Graph, var, call) -> CodeConcat | None:
    if op_name(call) != "relax.concat" or not isinstance(call.args[0], relax.Tuple):
        return None
    if not isinstance(var.ty, relax.TensorType) or var.ty.ndim != 4 or int(call.attrs.axis) % 4 != 1:
        return None
    found = [codes_of(graph, part, "a concat input") for part in call.args[0].fields]
    end, quantize = graph.next_binding(var, "concat")
    if op_name(quantize) != "relax.quantize" or not quantize.args[0].same_as(var):
        return None
    out = qparams(quantize, str(quantize.attrs.out_dtype), "the quantize")
    if out.dtype != "uint8" or any(params.dtype != "uint8" for _, params in found):
        return None
    return CodeConcat([codes for codes, _ in found], [params for _, params in found], end, out)


def _pool(graph: Graph, var, pool) -> CodePool | None:
    if op_name(pool) != "relax.nn.max_pool2d" or str(pool.attrs.layout) != "NCHW":
        return None
    if str(pool.attrs.out_layout) != "NCHW":
        return None
    data, params = codes_of(graph, pool.args[0], "the pool's input")
    end, call = graph.next_binding(var, "max_pool2d")
    if op_name(call) == "relax.quantize" and call.args[0].same_as(var) \
            and qparams(call, str(call.attrs.out_dtype), "the pool's quantize") == params:
        return CodePool(data, pool, end)
    return None


def ops_on_codes(graph: Graph, func: relax.Function) -> dict:
    """The ops of ``main`` that can run on codes, in binding order, by the var of the quantize each replaces:
    every ``DQ(codes) -> max_pool2d (NCHW) -> Q`` whose quantize has the dequantize's parameters
    (:class:`CodePool`), spatial mean (axes 2 and 3, kept) and channel gate (:class:`CodeSqueeze`) and channel
    concat (:class:`CodeConcat`) of uint8 codes quantized to uint8."""
    found = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            for match in (_pool, _squeeze, _concat):
                try:
                    op = match(graph, binding.var, binding.value)
                except Refused:
                    continue
                if op is not None:
                    found[op.end] = op
                    break
    return found
