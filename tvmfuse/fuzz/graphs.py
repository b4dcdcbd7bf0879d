"""Seeded random CNNs for differential fuzzing: ``random_cnn(seed)`` is a small float32 ONNX model.

Each graph is a batch-1 input ``x`` of 3-8 channels and 8-24 pixels a side, then a chain of about 3-14 nodes drawn
from the ops tvmfuse partitions and the ops around them: Conv (plain, depthwise with multiplier 1 or 2,
grouped, dilated, strides 1/2, kernels 1/3/5, symmetric, zero or asymmetric pads), ConvTranspose,
BatchNormalization, the activations of the pattern table (Relu, Clip as relu6 and with other bounds,
LeakyRelu, Sigmoid, HardSwish) and two it does not fuse (HardSigmoid, SiLU as ``x * Sigmoid(x)``), residual
Adds (one that tvmfuse may fold into the conv producing an operand, and joins it may not), MaxPool,
AveragePool, GlobalAveragePool, Concat of channels, Resize by 2 (nearest and linear, several coordinate
modes), and sometimes a Flatten + Gemm head. About a third of the graphs return a second output.

Weights are seeded float32 with a LeCun-style scale (standard deviation ``1 / sqrt(fan_in)``) so activations
stay O(1) and relative tolerances mean something. The same seed gives the same bytes (no clock, no
global random state, names from a counter). :func:`features` reads back from a model which of the kinds in
:data:`KINDS` it holds, for coverage checks.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MAX_CHANNELS = 16
MAX_SIZE = 32
# What a graph can hold, as :func:`features` names it.
ACTIVATIONS = ("relu", "relu6", "clip", "leakyrelu", "sigmoid", "hardswish", "hardsigmoid", "silu")
KINDS = (
    "conv", "conv_depthwise", "conv_grouped", "conv_dilated", "conv_asymmetric_pads", "conv_stride2",
    "conv_k1", "conv_k3", "conv_k5", "conv_transpose", "batchnorm", *ACTIVATIONS,
    "add_foldable", "add_unfoldable", "maxpool", "averagepool", "globalaveragepool", "concat",
    "resize_nearest", "resize_linear", "flatten", "gemm", "multi_output")


class _Graph:
    """The model under construction: nodes, initializers, the shape of every value, one counter for names."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.nodes: list = []
        self.inits: list = []
        self.shapes: dict[str, tuple] = {}
        self.count = 0

    def const(self, prefix: str, array) -> str:
        name = f"{prefix}_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], shape: tuple, **attrs) -> str:
        name = f"{op.lower()}_{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        self.shapes[name] = tuple(int(d) for d in shape)
        return name

    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)


# ----------------------------------------------------------------------------------------------- layers


def _out_size(size: int, before: int, after: int, kernel: int, stride: int, dilation: int) -> int:
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def _conv_geometry(g: _Graph, h: int, w: int, same: bool):
    """(kernel, stride, dilation, pads) for a conv on an ``h`` x ``w`` map; ``same`` keeps the size."""
    k = g.choice((1, 3, 3, 5)) if min(h, w) >= 5 else g.choice((1, 3))
    dilation = 2 if k > 1 and min(h, w) >= 2 * k + 1 and g.chance(0.2) else 1
    stride = 1 if same or min(h, w) < 8 else g.choice((1, 1, 2))
    span = dilation * (k - 1)
    if same:
        pads = [span // 2, span // 2, span - span // 2, span - span // 2]
    else:
        style = g.choice(("same", "same", "zero", "asymmetric"))
        if style == "same" or (style == "zero" and span >= min(h, w)):
            pads = [span // 2] * 4
        elif style == "zero":
            pads = [0] * 4
        else:
            pads = [int(p) for p in g.rng.integers(0, span + 1 if span else 2, 4)]
    oh, ow = _out_size(h, pads[0], pads[2], k, stride, dilation), _out_size(w, pads[1], pads[3], k, stride, dilation)
    if oh < 1 or ow < 1:
        pads, stride = [span // 2] * 4, 1
    return k, stride, dilation, pads


def conv(g: _Graph, x: str, out_channels: int | None = None, same: bool = False, plain: bool = False) -> str:
    """Conv (+ BatchNormalization with probability 0.3) with a random grouping and geometry.

    ``out_channels`` fixes the output channels (then groups are 1 or depthwise with multiplier 1);
    ``same`` keeps the spatial size (stride 1, padding ``dilation * (k - 1)`` split evenly, the odd pixel
    at the end); ``plain`` forces groups = 1.
    """
    _, c, h, w = g.shapes[x]
    divisors = [d for d in range(2, c) if c % d == 0]
    grouping = "plain" if plain else g.choice(("plain", "plain", "depthwise", "grouped"))
    if grouping == "grouped" and (not divisors or out_channels is not None):
        grouping = "plain"
    if grouping == "depthwise" and out_channels not in (None, c):
        grouping = "plain"
    if grouping == "depthwise":
        groups, out = c, c * (2 if out_channels is None and 2 * c <= MAX_CHANNELS and g.chance(0.3) else 1)
    elif grouping == "grouped":
        groups = g.choice(divisors)
        out = groups * int(g.rng.integers(1, max(1, MAX_CHANNELS // groups) + 1))
    else:
        groups, out = 1, out_channels or int(g.rng.integers(3, MAX_CHANNELS + 1))
    k, stride, dilation, pads = _conv_geometry(g, h, w, same)
    weight = g.normal((out, c // groups, k, k), 1.0 / np.sqrt(c // groups * k * k))
    inputs = [x, g.const("w", weight)]
    if g.chance(0.7):
        inputs.append(g.const("b", g.normal((out,), 0.1)))
    shape = (1, out, _out_size(h, pads[0], pads[2], k, stride, dilation),
             _out_size(w, pads[1], pads[3], k, stride, dilation))
    y = g.node("Conv", inputs, shape, kernel_shape=[k, k], strides=[stride] * 2, dilations=[dilation] * 2,
               pads=pads, group=groups)
    return batchnorm(g, y) if g.chance(0.3) else y


def conv_transpose(g: _Graph, x: str) -> str:
    """ConvTranspose, kernel 2-4, stride 1 or 2 (the output at most 32 a side), optional output_padding."""
    _, c, h, w = g.shapes[x]
    stride = 2 if 2 * max(h, w) + 2 <= MAX_SIZE and g.chance(0.6) else 1
    k = g.choice((2, 3, 4))
    pads = [int(p) for p in g.rng.integers(0, k // 2 + 1, 4)] if g.chance(0.5) else [0] * 4
    output_padding = [1, 1] if stride == 2 and g.chance(0.3) else [0, 0]
    out = int(g.rng.integers(3, MAX_CHANNELS + 1))
    weight = g.normal((c, out, k, k), 1.0 / np.sqrt(max(1.0, c * k * k / stride ** 2)))
    inputs = [x, g.const("w", weight)] + ([g.const("b", g.normal((out,), 0.1))] if g.chance(0.5) else [])
    shape = (1, out, (h - 1) * stride - pads[0] - pads[2] + k + output_padding[0],
             (w - 1) * stride - pads[1] - pads[3] + k + output_padding[1])
    if min(shape[2:]) < 1 or max(shape[2:]) > MAX_SIZE:
        pads, output_padding = [0] * 4, [0, 0]
        shape = (1, out, (h - 1) * stride + k, (w - 1) * stride + k)
    return g.node("ConvTranspose", inputs, shape, kernel_shape=[k, k], strides=[stride] * 2, pads=pads,
                  output_padding=output_padding)


def batchnorm(g: _Graph, x: str) -> str:
    c = g.shapes[x][1]
    params = [g.rng.uniform(0.5, 1.5, c), g.normal((c,), 0.1), g.normal((c,), 0.1), g.rng.uniform(0.5, 1.5, c)]
    return g.node("BatchNormalization", [x] + [g.const(p, v) for p, v in zip(("gamma", "beta", "mean", "var"), params)],
                  g.shapes[x], epsilon=1e-5)


def activation(g: _Graph, x: str, kind: str | None = None) -> str:
    """One of :data:`ACTIVATIONS` (random when ``kind`` is None)."""
    kind = kind or g.choice(ACTIVATIONS)
    shape = g.shapes[x]
    if kind in ("relu6", "clip"):
        lo, hi = (0.0, 6.0) if kind == "relu6" else (g.choice((-1.0, -0.5, 0.0)), g.choice((0.5, 1.0, 2.0)))
        return g.node("Clip", [x, g.const("lo", lo), g.const("hi", hi)], shape)
    if kind == "silu":
        return g.node("Mul", [x, g.node("Sigmoid", [x], shape)], shape)
    ops = {"relu": ("Relu", {}), "leakyrelu": ("LeakyRelu", {"alpha": float(g.choice((0.01, 0.1, 0.2)))}),
           "sigmoid": ("Sigmoid", {}), "hardswish": ("HardSwish", {}),
           "hardsigmoid": ("HardSigmoid", {"alpha": float(g.choice((0.2, 1 / 6))), "beta": 0.5})}
    op, attrs = ops[kind]
    return g.node(op, [x], shape, **attrs)


def residual(g: _Graph, x: str, pool: list[str], outputs: list[str]) -> str:
    """An Add joining two same-shape branches.

    ``foldable``: ``conv(x) [+ bn] + x``, which tvmfuse may fold into the conv. ``activation``: the conv's
    output goes through an activation first (the add is not a conv epilogue). ``shared``: the conv's output
    is also a graph output (folding would lose it). ``join``: two earlier tensors of the same shape.
    """
    shape = g.shapes[x]
    partners = [t for t in pool if t != x and g.shapes[t] == shape]
    variant = g.choice(("foldable", "foldable", "activation", "shared") + (("join",) if partners else ()))
    if variant == "join":
        other = g.choice(partners)
    else:
        other = conv(g, x, out_channels=shape[1], same=True)
        if variant == "activation":
            other = activation(g, other)
        elif variant == "shared":
            outputs.append(other)
    operands = [x, other] if g.chance(0.5) else [other, x]
    y = g.node("Add", operands, shape)
    return activation(g, y, "relu") if g.chance(0.4) else y


def pooling(g: _Graph, x: str) -> str:
    """MaxPool or AveragePool (kernel 2/3, stride 1/2, optional pads and count_include_pad), or global."""
    _, c, h, w = g.shapes[x]
    op = g.choice(("MaxPool", "MaxPool", "AveragePool", "AveragePool", "GlobalAveragePool"))
    if op == "GlobalAveragePool" or min(h, w) < 3:
        return g.node("GlobalAveragePool", [x], (1, c, 1, 1))
    k = g.choice((2, 3))
    stride = g.choice((1, 2)) if min(h, w) >= 6 else 1
    pads = [int(p) for p in g.rng.integers(0, k // 2 + 1, 4)] if g.chance(0.4) else [0] * 4
    attrs = {"kernel_shape": [k, k], "strides": [stride] * 2, "pads": pads}
    if op == "AveragePool":
        attrs["count_include_pad"] = int(g.chance(0.5))
    shape = (1, c, _out_size(h, pads[0], pads[2], k, stride, 1), _out_size(w, pads[1], pads[3], k, stride, 1))
    return g.node(op, [x], shape, **attrs)


def concat(g: _Graph, x: str, pool: list[str]) -> str:
    """Concat along channels of ``x`` and an earlier tensor of the same size, or a new conv branch of ``x``."""
    _, c, h, w = g.shapes[x]
    partners = [t for t in pool if t != x and g.shapes[t][2:] == (h, w) and g.shapes[t][1] + c <= 2 * MAX_CHANNELS]
    other = g.choice(partners) if partners and g.chance(0.5) else conv(g, x, out_channels=int(g.rng.integers(3, 9)),
                                                                        same=True, plain=True)
    operands = [x, other] if g.chance(0.5) else [other, x]
    return g.node("Concat", operands, (1, c + g.shapes[other][1], h, w), axis=1)


def resize(g: _Graph, x: str) -> str:
    """Resize by 2 (the output at most 32 a side): nearest or linear, in one of the common coordinate modes."""
    _, c, h, w = g.shapes[x]
    mode = g.choice(("nearest", "linear"))
    if mode == "nearest":
        coords, nearest = g.choice((("asymmetric", "floor"), ("half_pixel", "round_prefer_floor")))
        attrs = {"coordinate_transformation_mode": coords, "nearest_mode": nearest}
    else:
        attrs = {"coordinate_transformation_mode": g.choice(("half_pixel", "align_corners", "asymmetric",
                                                             "pytorch_half_pixel"))}
    scales = g.const("scales", [1.0, 1.0, 2.0, 2.0])
    return g.node("Resize", [x, "", scales], (1, c, 2 * h, 2 * w), mode=mode, **attrs)


def head(g: _Graph, x: str) -> str:
    """[GlobalAveragePool] -> Flatten -> Gemm [-> activation -> Gemm]: a classifier head (2-D output)."""
    _, c, h, w = g.shapes[x]
    if c * h * w > 512 or g.chance(0.5):
        x = g.node("GlobalAveragePool", [x], (1, c, 1, 1))
        h = w = 1
    y = g.node("Flatten", [x], (1, c * h * w), axis=1)
    for layer in range(2 if g.chance(0.3) else 1):
        if layer:
            y = activation(g, y, g.choice(("relu", "relu6", "sigmoid", "leakyrelu", "hardswish")))
        features, out = g.shapes[y][1], int(g.rng.integers(4, 17))
        trans = g.chance(0.5)
        weight = g.normal((out, features) if trans else (features, out), 1.0 / np.sqrt(features))
        inputs = [y, g.const("w", weight)] + ([g.const("b", g.normal((out,), 0.1))] if g.chance(0.8) else [])
        y = g.node("Gemm", inputs, (1, out), transB=int(trans))
    return y


# ----------------------------------------------------------------------------------------------- graphs


STEPS = (("conv", 6), ("residual", 3), ("pool", 2), ("concat", 2), ("resize", 2), ("conv_transpose", 1),
         ("batchnorm", 1), ("activation", 2))


def _step(g: _Graph, kind: str, x: str, pool: list[str], outputs: list[str]) -> str:
    _, c, h, w = g.shapes[x]
    if kind == "conv":
        y = conv(g, x)
        return activation(g, y) if g.chance(0.7) else y
    if kind == "residual":
        return residual(g, x, pool, outputs)
    if kind == "pool":
        return pooling(g, x)
    if kind == "concat" and c <= MAX_CHANNELS:
        return concat(g, x, pool)
    if kind == "resize" and 2 * max(h, w) <= MAX_SIZE:
        return resize(g, x)
    if kind == "conv_transpose":
        return conv_transpose(g, x)
    if kind == "batchnorm":
        return batchnorm(g, x)
    return activation(g, x)


def random_cnn(seed: int) -> onnx.ModelProto:
    """A small random CNN, the same bytes for the same ``seed``: input ``x`` [1, C, H, W], outputs ``y0``
    (and sometimes ``y1``), opset 17. See the module docstring for what it may hold."""
    g = _Graph(seed)
    in_shape = (1, int(g.rng.integers(3, 9)), int(g.rng.integers(8, 25)), int(g.rng.integers(8, 25)))
    if g.chance(0.5):
        in_shape = in_shape[:3] + (in_shape[2],)
    g.shapes["x"] = in_shape
    budget = int(g.rng.integers(2, 9))
    names, weights = [k for k, _ in STEPS], np.array([w for _, w in STEPS], float)
    x, pool, outputs = "x", ["x"], []
    while len(g.nodes) < budget:
        if g.shapes[x][2] * g.shapes[x][3] == 1 and g.chance(0.7):
            break  # a 1x1 map: only 1x1 work is left to do
        x = _step(g, names[int(g.rng.choice(len(names), p=weights / weights.sum()))], x, pool, outputs)
        pool.append(x)
    if g.chance(0.3):
        x = head(g, x)
    if not outputs and g.chance(0.2):
        outputs.append(g.choice([t for t in pool[1:-1] if t != x] or [x]))
    outputs = [x] + [t for t in dict.fromkeys(outputs) if t != x][:1]
    return _model(g, outputs)


def _model(g: _Graph, outputs: list[str]) -> onnx.ModelProto:
    """The ModelProto; outputs are renamed ``y0``, ``y1`` through Identity nodes."""
    named = []
    for i, t in enumerate(outputs):
        g.nodes.append(helper.make_node("Identity", [t], [f"y{i}"], name=f"output_{i}"))
        named.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, list(g.shapes[t])))
    graph = helper.make_graph(g.nodes, f"fuzz_{g.seed}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(g.shapes["x"]))],
                              named, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9,
                             producer_name="tvmfuse.fuzz")


# ----------------------------------------------------------------------------------------------- features


def _producers(graph) -> dict:
    return {out: node for node in graph.node for out in node.output}


def _consumers(graph) -> collections.Counter:
    counts = collections.Counter(i for node in graph.node for i in node.input)
    counts.update(o.name for o in graph.output)
    return counts


def _foldable_operand(name: str, producers: dict, consumers: collections.Counter) -> bool:
    """``name`` is a conv's output (batch-norm folded in) read only by the add: the conv may take the add."""
    node = producers.get(name)
    if node is not None and node.op_type == "BatchNormalization" and consumers[name] == 1:
        name, node = node.input[0], producers.get(node.input[0])
    return node is not None and node.op_type == "Conv" and consumers[name] == 1


def _is_sigmoid_of(node, name: str) -> bool:
    return node is not None and node.op_type == "Sigmoid" and node.input[0] == name


def features(model: onnx.ModelProto) -> collections.Counter:
    """How many of each kind in :data:`KINDS` ``model`` holds, read from its nodes and initializers.

    A Conv counts once as ``conv`` and once per property (depthwise, grouped, dilated, asymmetric pads,
    stride 2, kernel size); an Add of two tensors as ``add_foldable`` when an operand is a conv's
    (batch-norm folded in) output read by nothing else, ``add_unfoldable`` otherwise.
    """
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producers, consumers = _producers(graph), _consumers(graph)
    found = collections.Counter()
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        op = node.op_type
        if op == "Conv":
            weight = inits[node.input[1]]
            groups, pads = attrs.get("group", 1), list(attrs.get("pads", [0] * 4))
            found["conv"] += 1
            found["conv_depthwise"] += groups > 1 and weight.shape[1] == 1
            found["conv_grouped"] += groups > 1 and weight.shape[1] > 1
            found["conv_dilated"] += max(attrs.get("dilations", [1])) > 1
            found["conv_asymmetric_pads"] += pads[:2] != pads[2:]
            found["conv_stride2"] += max(attrs.get("strides", [1])) == 2
            found[f"conv_k{weight.shape[2]}"] += 1
        elif op == "Clip":
            bounds = (float(inits[node.input[1]]), float(inits[node.input[2]]))
            found["relu6" if bounds == (0.0, 6.0) else "clip"] += 1
        elif op == "Mul" and _is_sigmoid_of(producers.get(node.input[1]), node.input[0]):
            found["silu"] += 1
            found["sigmoid"] -= 1  # counted as its own kind
        elif op == "Add" and not any(i in inits for i in node.input):
            folds = any(_foldable_operand(i, producers, consumers) for i in node.input)
            found["add_foldable" if folds else "add_unfoldable"] += 1
        elif op == "Resize":
            found[f"resize_{attrs['mode'].decode()}"] += 1
        else:
            simple = {"ConvTranspose": "conv_transpose", "BatchNormalization": "batchnorm", "Relu": "relu",
                      "LeakyRelu": "leakyrelu", "Sigmoid": "sigmoid", "HardSwish": "hardswish",
                      "HardSigmoid": "hardsigmoid", "MaxPool": "maxpool", "AveragePool": "averagepool",
                      "GlobalAveragePool": "globalaveragepool", "Concat": "concat", "Flatten": "flatten",
                      "Gemm": "gemm"}
            if op in simple:
                found[simple[op]] += 1
    found["multi_output"] += len(graph.output) > 1
    return +found
