"""A 1-D ``Conv`` (audio front ends, STFT as a strided conv, temporal conv stacks) as a 2-D conv of height 1.

tvmfuse's conv families, their x86 templates and CUDA rules are 2-D; TVM compiles a ``conv1d`` it is given with
no schedule at all (plain loops, one thread): Silero VAD's four conv1d took 400 of its 510 us per chunk on a
Zen 4, against onnxruntime's 94 for the whole model. Each one becomes ``Unsqueeze(axis 2) -> Conv (1 x K
window, the weight reshaped (O, C/g, 1, K) at compile time) -> Squeeze(axis 2)``, so the partitioner sees a
conv2d with its epilogue, and the layout passes drop the reshapes between two such convs where they can.
Runs after ``auto_pad`` became explicit pads (:mod:`.normalize`); a conv whose weight is not a constant or
whose padding is still implicit is left as it is.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _axes_node(op: str, data: str, out: str, axes_name: str, opset: int, name: str) -> onnx.NodeProto:
    if opset >= 13:
        return helper.make_node(op, [data, axes_name], [out], name=name)
    return helper.make_node(op, [data], [out], name=name, axes=[2])


def conv1d_as_conv2d(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Rewrite every 1-D Conv with a constant weight in place; return the model and how many changed."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    ones = [n for n in graph.node if n.op_type == "Conv" and n.domain in ("", "ai.onnx") and len(n.input) > 1
            and n.input[1] in weights and len(weights[n.input[1]].dims) == 3]
    if not ones:
        return model, 0
    opset = _opset(model)
    axes = "tvmfuse_conv1d_axis2"
    if opset >= 13 and axes not in weights:
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axes))
    rewritten, count = [], 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        auto_pad = attrs.get("auto_pad", b"NOTSET")
        if node not in ones or (auto_pad not in (b"NOTSET", b"VALID")):
            rewritten.append(node)
            continue
        label = node.name or node.output[0]
        weight = numpy_helper.to_array(weights[node.input[1]])
        weight_2d = f"{node.input[1]}/as_2d"
        if weight_2d not in weights:
            graph.initializer.append(numpy_helper.from_array(weight[:, :, None, :], weight_2d))
            weights[weight_2d] = graph.initializer[-1]
        pads = attrs.get("pads", [0, 0])
        conv_attrs = {"kernel_shape": [1, int(weight.shape[2])], "strides": [1, *attrs.get("strides", [1])],
                      "dilations": [1, *attrs.get("dilations", [1])], "pads": [0, pads[0], 0, pads[1]],
                      "group": int(attrs.get("group", 1))}
        x2d, y2d = f"{label}/input_2d", f"{label}/output_2d"
        rewritten += [_axes_node("Unsqueeze", node.input[0], x2d, axes, opset, f"{label}/unsqueeze"),
                      helper.make_node("Conv", [x2d, weight_2d, *node.input[2:]], [y2d], name=label, **conv_attrs),
                      _axes_node("Squeeze", y2d, node.output[0], axes, opset, f"{label}/squeeze")]
        count += 1
    del graph.node[:]
    graph.node.extend(rewritten)
    return model, count
