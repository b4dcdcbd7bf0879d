"""Put nodes that TVM's importer converts wrongly into forms it converts right, or refuse them by name.

Checked against ONNX's own node tests (``tests/frontend/test_onnx_node_suite.py``): without this pass
TVM 0.27 silently returns wrong numbers for a downsampling ``Resize`` by scales and for a
``ConvTranspose`` with ``output_shape``, and crashes on ``Resize(axes=...)``. Runs after constant folding
(scales, sizes and exponents are initializers by then) and shape inference. What it does:

- ``Resize``: an ``axes`` attribute becomes full-rank scales/sizes; ``keep_aspect_ratio_policy`` becomes
  the sizes it implies; ``half_pixel_symmetric`` is ``half_pixel`` when every output size is whole.
  Refused: ``antialias`` when downsampling, scales whose output size is not ``scale * input`` exactly
  (ONNX maps pixels by the scale, TVM by the size ratio), an ``align_corners`` axis resized to one pixel.
- ``ConvTranspose``: ``output_shape`` becomes ``pads`` (and ``output_padding`` where the padding would be
  negative), as the spec defines it.
- ``Conv`` with ``auto_pad = SAME_UPPER / SAME_LOWER`` gets the explicit ``pads`` the spec defines. TVM's
  importer writes such padding as a separate pad kernel on the plain layout before a conv with none (two
  320x320 pads: 4.4 ms of PP-OCRv6 tiny det's 29 ms); with ``pads`` it is the conv's own padding.
- ``LayerNormalization`` whose ``Mean``/``InvStdDev`` outputs are used is refused (TVM drops them).
- ``Pow`` with an integer constant exponent on a float base gets a float exponent (exact); an integer
  base is refused.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UnsupportedOpError
from .graph import Constants


def node_attrs(node: onnx.NodeProto) -> dict:
    """A node's attributes by name, strings decoded."""
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _set_attrs(node: onnx.NodeProto, drop=(), **values) -> None:
    kept = [a for a in node.attribute if a.name not in set(drop) | set(values)]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in values.items()])


class _Graph:
    """Constants, static shapes and element types of the (folded, shape-inferred) graph."""

    def __init__(self, model: onnx.ModelProto, source: str):
        self.model, self.source = model, source
        self.consts = Constants(model.graph.initializer)
        self.shapes: dict[str, tuple[int, ...]] = {t.name: tuple(t.dims) for t in model.graph.initializer}
        self.types: dict[str, int] = {t.name: t.data_type for t in model.graph.initializer}
        g = model.graph
        for v in list(g.input) + list(g.value_info) + list(g.output):
            t = v.type.tensor_type
            self.types.setdefault(v.name, t.elem_type)
            if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
                self.shapes.setdefault(v.name, tuple(d.dim_value for d in t.shape.dim))
        self.used = {n for node in g.node for n in node.input} | {o.name for o in g.output}
        self.taken = set(self.consts) | {n for node in g.node for n in list(node.input) + list(node.output)}

    def error(self, node: onnx.NodeProto, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.source}: {node.op_type} node {node.name or node.output[0]!r}: {why}")

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def add_const(self, base: str, value: np.ndarray) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        self.consts[name] = value
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name


def _resize(g: _Graph, node: onnx.NodeProto) -> bool:
    """Normalize one Resize (opset >= 11 form); return whether it changed."""
    a = node_attrs(node)
    ins = list(node.input) + [""] * (4 - len(node.input))
    shape = g.shapes.get(ins[0])
    if shape is None or len(node.input) < 3:
        return False  # opset 10 form (X, scales) or unknown rank: TVM's converter handles it as is
    rank, changed = len(shape), False
    scales, sizes = g.const(ins[2]), g.const(ins[3])
    if scales is not None and scales.size == 0:
        scales = None
    if (scales is None and ins[2] and not ins[3]) or (ins[3] and sizes is None):
        raise g.error(node, "scales/sizes must be constants once the input shapes are fixed")
    axes = a.get("axes")
    if axes is not None:
        axes = [ax % rank for ax in axes]
        if scales is not None:
            full = np.ones(rank, np.float32)
            full[axes] = scales
            scales = full
        if sizes is not None:
            full_sizes = np.array(shape, np.int64)
            full_sizes[axes] = sizes
            sizes = full_sizes
        roi = g.const(ins[1])
        if roi is not None and roi.size:
            full_roi = np.concatenate([np.zeros(rank), np.ones(rank)]).astype(roi.dtype)
            full_roi[axes], full_roi[[rank + ax for ax in axes]] = roi[:len(axes)], roi[len(axes):]
            ins[1] = g.add_const(f"{node.name or node.output[0]}.roi", full_roi)
        changed = True
    policy = a.get("keep_aspect_ratio_policy", "stretch")
    if sizes is not None and policy != "stretch":
        pick = min if policy == "not_larger" else max
        axes_used = axes if axes is not None else list(range(rank))
        scale = pick(float(sizes[i]) / shape[i] for i in axes_used)
        sizes = np.array([int(np.floor(shape[i] * scale + 0.5)) if i in axes_used else shape[i]
                          for i in range(rank)], np.int64)
        changed = True
    mode, coord = a.get("mode", "nearest"), a.get("coordinate_transformation_mode", "half_pixel")
    if sizes is None:
        out = [int(np.floor(s * float(sc))) for s, sc in zip(shape, scales)]
        inexact = [i for i, (s, o, sc) in enumerate(zip(shape, out, scales)) if o * 1.0 != s * float(sc)]
        if inexact and coord != "tf_crop_and_resize":
            i = inexact[0]
            raise g.error(node, f"scale {float(scales[i]):g} on axis {i} maps {shape[i]} pixels to "
                          f"{shape[i] * float(scales[i]):g}, not a whole number; ONNX then samples by the scale and "
                          "TVM by the size ratio, which would give different numbers")
    else:
        out = [int(s) for s in sizes]
    if a.get("antialias", 0) and any(o < s for o, s in zip(out, shape)):
        raise g.error(node, "antialias=1 when downsampling is not supported")
    if coord == "half_pixel_symmetric":
        _set_attrs(node, coordinate_transformation_mode="half_pixel")
        changed = True
    if coord == "align_corners" and mode != "nearest" and any(o == 1 < s for o, s in zip(out, shape)):
        raise g.error(node, "align_corners resizing an axis to 1 pixel is not supported")
    if changed:
        node.input[:] = ins[:2] + ["", g.add_const(f"{node.name or node.output[0]}.sizes", np.array(out, np.int64))]
        _set_attrs(node, drop=("axes", "keep_aspect_ratio_policy"))
    return changed


def _split_pad(total: int, auto_pad: str, begin: list, end: list) -> None:
    """Append ``total`` padding pixels split in half to ``begin`` / ``end``: the odd one at the end for
    ``SAME_UPPER``, at the beginning otherwise."""
    half = total // 2
    begin.append(half if auto_pad == "SAME_UPPER" else total - half)
    end.append(total - half if auto_pad == "SAME_UPPER" else half)


def _conv_transpose(g: _Graph, node: onnx.NodeProto) -> bool:
    a = node_attrs(node)
    if "output_shape" not in a:
        return False
    x, w = g.shapes.get(node.input[0]), g.shapes.get(node.input[1])
    if x is None or w is None:
        raise g.error(node, "output_shape needs static input and weight shapes")
    spatial = len(x) - 2
    strides = a.get("strides", [1] * spatial)
    dil = a.get("dilations", [1] * spatial)
    kernel = a.get("kernel_shape", list(w[2:]))
    out_pad = list(a.get("output_padding", [0] * spatial))
    target = list(a["output_shape"])[-spatial:]
    begin, end = [], []
    for i in range(spatial):
        total = strides[i] * (x[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - target[i]
        if total < 0:
            out_pad[i] -= total
            total = 0
        _split_pad(total, a.get("auto_pad", "NOTSET"), begin, end)
    _set_attrs(node, drop=("output_shape", "auto_pad"), pads=begin + end, output_padding=out_pad)
    return True


def _conv_auto_pad(g: _Graph, node: onnx.NodeProto) -> bool:
    """``auto_pad = SAME_*``: output size ``ceil(in / stride)``, the padding it needs split in half, the odd
    pixel at the end (UPPER) or the beginning (LOWER)."""
    a = node_attrs(node)
    mode = a.get("auto_pad", "NOTSET")
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        return False
    x, w = g.shapes.get(node.input[0]), g.shapes.get(node.input[1])
    if x is None or w is None:
        return False  # TVM's importer pads it itself
    spatial = len(x) - 2
    strides, dil = a.get("strides", [1] * spatial), a.get("dilations", [1] * spatial)
    kernel = a.get("kernel_shape", list(w[2:]))
    begin, end = [], []
    for i in range(spatial):
        out = -(-x[2 + i] // strides[i])
        _split_pad(max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - x[2 + i]), mode, begin, end)
    _set_attrs(node, drop=("auto_pad",), pads=begin + end)
    return True


def _layer_norm(g: _Graph, node: onnx.NodeProto) -> bool:
    if any(o and o in g.used for o in node.output[1:]):
        raise g.error(node, "its Mean/InvStdDev outputs (training statistics) are not supported")
    return False


def _pow(g: _Graph, node: onnx.NodeProto) -> bool:
    base_type, exp = g.types.get(node.input[0]), g.const(node.input[1])
    base_float = base_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    if base_type and not base_float:
        raise g.error(node, f"Pow of {helper.tensor_dtype_to_np_dtype(base_type)} tensors is not supported (float only)")
    if exp is not None and exp.dtype.kind in "iu" and base_float:
        dtype = helper.tensor_dtype_to_np_dtype(base_type)
        node.input[1] = g.add_const(f"{node.input[1]}.as_{np.dtype(dtype).name}", exp.astype(dtype))
        return True
    return False


_RULES = {"Resize": _resize, "ConvTranspose": _conv_transpose, "Conv": _conv_auto_pad,
          "LayerNormalization": _layer_norm, "Pow": _pow}


def normalize_nodes(model: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, int]:
    """Apply the rules above in place; return the model and the number of nodes changed."""
    if not any(n.op_type in _RULES for n in model.graph.node):
        return model, 0
    g = _Graph(model, source)
    changed = sum(_RULES[n.op_type](g, n) for n in model.graph.node
                  if n.op_type in _RULES and n.domain in ("", "ai.onnx"))
    return model, changed
