"""Run ``ConvInteger`` / ``MatMulInteger`` whose int32 result is only cast to float32 as float32 ops.

That is what onnxruntime's ``quantize_dynamic`` writes for every Conv and MatMul::

    DynamicQuantizeLinear(x) -> ConvInteger(x_q, w_q, x_zp, w_zp) -> Cast(to=float) -> Mul(x_scale * w_scale)

A model may add its int32 bias (quantized at run time) before the cast: ``ConvInteger -> Add(b) -> Cast``
becomes ``Conv -> Add(float(b))``, exact under the same bound. The integer op's result is used only as a
float, so it is computed as one: ``Conv(float(x_q) - float(x_zp),
float(w_q - w_zp))``, with the weight converted once here. It then goes through the float32 conv and dense
kernels and their partitions (epilogues, blocked layout, tuning logs), not through an unscheduled int32
convolution (mobilenet_v2 dynamically quantized: 115 ms on int32 convs, against 45 ms for onnxruntime).

How exact it is: every operand is an integer below 2**8 in magnitude, so every product is exact in float32
and so is every partial sum below 2**24 -- for ``K * 255 * 128 < 2**24`` (a reduction length K under 514)
always, beyond that as long as the partial sums stay below 2**24, which dynamically quantized activations
(centred by their zero point) do by far. A Winograd or reordered sum then rounds like any float32
convolution. Either way the difference from onnxruntime is of the size of the float32 ops between two
quantizations (the Mul, a BatchNormalization), which already move an activation lying on a rounding tie by
one code: measured on mobilenet_v2, 1 to 3 codes of ~400,000 per layer, and 0.8% of the largest logit at
the output; ``tests/frontend/test_dynamic_quant.py`` states the bounds.

On a target whose INT8 kernels take them, :mod:`.integer_matmul` and :mod:`.integer_conv` take these ops first
(exact int32 on the INT8 kernels); this module handles the rest (CUDA, grouped convs, per-channel zero points).
Left to :mod:`.qlinear` (exact int32): an integer op whose result is read as int32, or whose weight is not
a constant, or whose ``a_zero_point`` is per row.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .graph import drop_unused_initializers
from .qlinear import Rewriter

#: op type -> (data, weight, data zero point, weight zero point) input positions
_ROLES = {"ConvInteger": (0, 1, 2, 3), "MatMulInteger": (0, 1, 2, 3)}


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _float_weight(node: onnx.NodeProto, initializers: dict) -> np.ndarray | None:
    """``w - w_zero_point`` in float32 (per output channel of a conv, per column of a matmul), None when
    either is computed at run time or their shapes do not fit."""
    weight, zp = _input(node, 1), _input(node, 3)
    if weight not in initializers or (zp and zp not in initializers):
        return None
    w = numpy_helper.to_array(initializers[weight]).astype(np.float32)
    if not zp:
        return w
    z = numpy_helper.to_array(initializers[zp]).astype(np.float32)
    if z.size == 1:
        return w - z.reshape(())
    if z.ndim != 1 or w.ndim < 2:
        return None
    axis = 0 if node.op_type == "ConvInteger" else w.ndim - 1
    if w.shape[axis] != z.size:
        return None
    shape = [1] * w.ndim
    shape[axis] = z.size
    return w - z.reshape(shape)


def _data_zero_point_fits(node: onnx.NodeProto, initializers: dict, shapes: dict) -> bool:
    """A single data zero point (constant or run-time); a per-row one of MatMulInteger stays integer."""
    zp = _input(node, 2)
    if not zp:
        return True
    if zp in initializers:
        return numpy_helper.to_array(initializers[zp]).size == 1
    shape = shapes.get(zp)
    return shape is not None and int(np.prod(shape)) == 1


def _int32_bias_add(consumers: list, result: str, readers: dict, outputs: set) -> onnx.NodeProto | None:
    """The ``Add(result, b)`` that is the integer op's only reader and the only reader of its own result is a
    ``Cast`` (a dynamically quantized model adding its run-time int32 bias before the cast, as ddddocr's
    ``common_old.onnx`` does); None otherwise."""
    if len(consumers) != 1 or consumers[0].op_type != "Add" or len(consumers[0].input) != 2:
        return None
    add = consumers[0]
    if list(add.input).count(result) != 1 or add.output[0] in outputs:
        return None
    after = readers.get(add.output[0], [])
    return add if len(after) == 1 and after[0].op_type == "Cast" else None


def rounded_bias(bias: str, producers: dict):
    """For a bias quantized at run time as ``[Reshape](Cast(to=int32)(q))`` with ``q`` a ``Floor``/``Round``/``Ceil``:
    ``(reshape or None, cast)``, ``q`` being ``cast.input[0]``, the same integers as float32; None otherwise."""
    reshape = producers.get(bias)
    if reshape is None or reshape.op_type != "Reshape":
        reshape = None
    cast = producers.get(reshape.input[0] if reshape is not None else bias)
    to = next((a.i for a in cast.attribute if a.name == "to"), None) if cast is not None else None
    rounded = producers.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
    if to != TensorProto.INT32 or rounded is None or rounded.op_type not in ("Floor", "Round", "Ceil"):
        return None
    return reshape, cast


def _float_bias(bias: str, out: str, producers: dict, name: str) -> tuple[list, list]:
    """Nodes writing ``bias`` (int32) as float32 to ``out``, and the nodes they bypass. A bias quantized at
    run time as ``[Reshape](Cast(to=int32)(q))`` with ``q`` a ``Floor``/``Round``/``Ceil`` is ``[Reshape](q)``:
    the same values for any ``|q| < 2**24``, without the float-to-int32 conversion, whose out-of-range
    handling TVM's importer spells as int64 arithmetic that, fused into the elementwise kernel after the conv,
    is recomputed for every output element (6 s of LLVM and 1.3 ms a layer on ddddocr's ``common_old``)."""
    found = rounded_bias(bias, producers)
    if found is None:
        return [helper.make_node("Cast", [bias], [out], to=TensorProto.FLOAT, name=name)], []
    reshape, cast = found
    if reshape is None:
        return [helper.make_node("Identity", [cast.input[0]], [out], name=name)], [cast]
    return [helper.make_node("Reshape", [cast.input[0], reshape.input[1]], [out], name=name)], [reshape, cast]


def _scale_factors(mul: onnx.NodeProto, cast_out: str, producers: dict, initializers: dict, shapes: dict,
                   weight: np.ndarray, axis: int):
    """For ``Mul(cast_out, S)`` with ``S = Mul(s_x, s_w)`` -- a single run-time value times a constant per
    tensor or per output channel, as ``quantize_dynamic`` writes it -- ``(s_x name, s_w broadcast to the
    weight)``; None otherwise."""
    if mul.op_type != "Mul" or list(mul.input).count(cast_out) != 1:
        return None
    scale = mul.input[1] if mul.input[0] == cast_out else mul.input[0]
    product = producers.get(scale)
    if product is None or product.op_type != "Mul" or len(product.input) != 2:
        return None
    for runtime, constant in (tuple(product.input), tuple(product.input)[::-1]):
        if runtime in initializers or constant not in initializers or shapes.get(runtime) not in ((), (1,)):
            continue
        s_w = numpy_helper.to_array(initializers[constant]).astype(np.float32)
        if s_w.size == 1:
            return runtime, s_w.reshape(())
        if s_w.ndim == 1 and s_w.size == weight.shape[axis]:
            shape = [1] * weight.ndim
            shape[axis] = s_w.size
            return runtime, s_w.reshape(shape)
    return None


def _float_nodes(node: onnx.NodeProto, out: str, weight_name: str, x_scale: str | None,
                 names) -> list[onnx.NodeProto]:
    """``float(x) - float(x_zp)`` [times ``x_scale``], then the float op writing ``out``."""
    prefix = node.name or node.output[0]
    data = names(f"{prefix}_x_f32")
    nodes = [helper.make_node("Cast", [node.input[0]], [data], to=TensorProto.FLOAT, name=f"{prefix}/cast_x")]
    zp = _input(node, 2)
    if zp:
        zp_f, shifted = names(f"{prefix}_x_zero_point_f32"), names(f"{prefix}_x_shifted")
        nodes += [helper.make_node("Cast", [zp], [zp_f], to=TensorProto.FLOAT, name=f"{prefix}/cast_x_zero_point"),
                  helper.make_node("Sub", [data, zp_f], [shifted], name=f"{prefix}/sub_x_zero_point")]
        data = shifted
    if x_scale is not None:
        scaled = names(f"{prefix}_x_dequantized")
        nodes.append(helper.make_node("Mul", [data, x_scale], [scaled], name=f"{prefix}/mul_x_scale"))
        data = scaled
    float_op = "Conv" if node.op_type == "ConvInteger" else "MatMul"
    op = helper.make_node(float_op, [data, weight_name], [out], name=prefix)
    op.attribute.extend(node.attribute)
    return nodes + [op]


def rewrite_integer_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Replace each ``ConvInteger`` / ``MatMulInteger`` + ``Cast(to=float)`` pair by float32 ops (in place).

    Run it after constant folding (weights and zero points become initializers) and before
    :func:`~tvmfuse.frontend.qlinear.rewrite_quantized_ops`, which takes the integer ops left.

    Returns
    -------
    tuple of (onnx.ModelProto, int)
        The model and the number of integer ops replaced.
    """
    graph = model.graph
    if not any(n.op_type in _ROLES and n.domain in ("", "ai.onnx") for n in graph.node):
        return model, 0
    rw = Rewriter(model, "<ModelProto>")  # its constants, shapes (-1: unknown) and fresh names
    initializers, shapes = rw.initializers, rw.shapes
    readers: dict[str, list] = {}
    for n in graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    outputs = {o.name for o in graph.output}
    producers = {o: n for n in graph.node for o in n.output}
    replace, read, replaced = {}, set(), 0
    for node in graph.node:
        if node.op_type not in _ROLES or node.domain not in ("", "ai.onnx") or node.output[0] in outputs:
            continue
        consumers = readers.get(node.output[0], [])
        bias_add = _int32_bias_add(consumers, node.output[0], readers, outputs)
        if bias_add is not None:
            consumers = readers[bias_add.output[0]]
        cast = consumers[0] if len(consumers) == 1 else None
        to = next((a.i for a in cast.attribute if a.name == "to"), None) if cast is not None else None
        if cast is None or cast.op_type != "Cast" or to != TensorProto.FLOAT:
            continue
        weight = _float_weight(node, initializers)
        if weight is None or not _data_zero_point_fits(node, initializers, shapes):
            continue
        out, x_scale, scaled = cast.output[0], None, readers.get(cast.output[0], [])
        axis = 0 if node.op_type == "ConvInteger" else weight.ndim - 1
        if bias_add is not None:
            # (x * w + b) as float32: the integer bias cast and added after the float op; the scale multiply
            # that follows stays as it is.
            summed = rw.fresh(f"{node.name or node.output[0]}_f32")
            bias = next(name for name in bias_add.input if name != node.output[0])
            bias_f = rw.fresh(f"{bias}_f32")
            nodes, bypassed = _float_bias(bias, bias_f, producers, f"{bias_add.name}/bias")
            replace[id(bias_add)] = nodes + [helper.make_node("Add", [summed, bias_f], [out], name=bias_add.name or out)]
            for old in bypassed:  # the int32 conversion (reader first), while nothing else reads it
                if any(len(readers.get(o, [])) != 1 or o in outputs for o in old.output):
                    break
                replace[id(old)] = []
            out, scaled = summed, []
        factors = (_scale_factors(scaled[0], out, producers, initializers, shapes, weight, axis)
                   if len(scaled) == 1 and out not in outputs else None)
        if factors is not None:
            # Dequantize the operands instead of the result: the scale multiply leaves the conv's epilogue,
            # which then holds what follows (bias, batch-norm, activation) as in the float model.
            (x_scale, s_w), out = factors, scaled[0].output[0]
            weight = weight * s_w
            replace[id(scaled[0])] = []
            scale = next(name for name in scaled[0].input if name != cast.output[0])
            if len(readers[scale]) == 1 and scale not in outputs:  # x_scale * w_scale: read by nothing else now
                replace[id(producers[scale])] = []
        weight_name = rw.initializer(f"{_input(node, 1)}_f32", weight.astype(np.float32))
        replace[id(node)] = _float_nodes(node, out, weight_name, x_scale, rw.fresh)
        replaced += 1
        replace[id(cast)] = []
        read.update(node.input[1:])
    if not replace:
        return model, 0
    nodes = [new for n in graph.node for new in replace.get(id(n), [n])]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(rw.new_initializers)
    drop_unused_initializers(graph, read)
    return model, replaced
