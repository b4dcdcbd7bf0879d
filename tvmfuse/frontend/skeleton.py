"""ONNX's checker and shape inference, run on the model without the data of its large weights.

Both hand the whole model to C++ serialized, and shape inference parses its result back: on ResNet-50's
100 MB of weights that took 0.25 s and 0.29 s, once per check and once per folding round. Neither needs a large
weight's data: the checker does not compare data with dims (:func:`.load._check_initializers` does), and shape
inference reads the values only of shape-like constants (a Reshape's shape, a Pad's pads, a Resize's scales),
which are small. So both run on a skeleton whose large initializers are graph inputs of the same type and shape.
Floats over 64 elements count as large too: the shape-like float constants are a Resize's scales, a Range's
bounds, a Pad's value, where a batch-normalized model has four vectors per conv (MobileNetV3: 240 of up to 960
values, 15 ms of each serialization).
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

# Elements above which an initializer's data is left out: shape-like constants hold one value per axis.
LARGE = 1024
LARGE_FLOAT = 64  # the same for a float initializer
_INTEGERS = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT16, onnx.TensorProto.INT8,
             onnx.TensorProto.UINT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT16, onnx.TensorProto.UINT8,
             onnx.TensorProto.BOOL}


def check_model(model: onnx.ModelProto) -> None:
    """``onnx.checker.check_model`` on :func:`skeleton` of ``model`` (raises what it raises)."""
    onnx.checker.check_model(skeleton(model))


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with ``onnx.shape_inference.infer_shapes``'s value_info and output types, found on
    :func:`skeleton` (``model`` itself is updated and returned: its weights are not copied)."""
    inferred = onnx.shape_inference.infer_shapes(skeleton(model)).graph
    graph = model.graph
    del graph.value_info[:]
    graph.value_info.extend(inferred.value_info)
    del graph.output[:]
    graph.output.extend(inferred.output)
    return model


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers over :data:`LARGE` elements (:data:`LARGE_FLOAT` for other than
    integers) are graph inputs instead (``model`` itself where it has none)."""
    graph = model.graph
    large = [t for t in graph.initializer if _large(t)]
    if not large:
        return model
    out = onnx.ModelProto()
    _copy_fields(model, out, skip={"graph"})
    _copy_fields(graph, out.graph, skip={"initializer"})
    out.graph.initializer.extend(t for t in graph.initializer if not _large(t))
    # as inputs typed by the weight itself: an input that lists an initializer (IR 3) may declare no shape
    typed = {t.name: helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in large}
    for i, value in enumerate(out.graph.input):
        if value.name in typed:
            out.graph.input[i].CopyFrom(typed.pop(value.name))
    out.graph.input.extend(typed.values())
    return out


def _large(t: onnx.TensorProto) -> bool:
    return math.prod(t.dims) > (LARGE if t.data_type in _INTEGERS else LARGE_FLOAT)


def _copy_fields(source, target, skip: set[str]) -> None:
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        if _repeated(field):
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _repeated(field) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf 6+, where ``label`` is gone
        return field.is_repeated
    return field.label == field.LABEL_REPEATED
