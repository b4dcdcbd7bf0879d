"""Generic layers beyond :class:`~tvmfuse.zoo.builder.GraphBuilder`'s CNN basics.

Plain functions taking the builder as first argument; each writes the ONNX
nodes the way ``torch.onnx.export`` spells the corresponding PyTorch call,
records the static output shape and returns the output tensor name (which is
also the node name unless said otherwise). Shapes may carry a ``-1`` batch
dimension (Paddle-style inputs); it is propagated, never multiplied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from onnx import helper

from .builder import GraphBuilder

_I64 = np.int64
_F32 = np.float32


def multi_node(g: GraphBuilder, op: str, inputs: Sequence[str], name: str,
               shapes: Sequence[tuple[int, ...]], **attrs) -> list[str]:
    """A node with several outputs ``name.0``, ``name.1``, ... of the given shapes."""
    g._claim(name)
    outs = [g._claim(f"{name}.{i}") for i in range(len(shapes))]
    g._nodes.append(helper.make_node(op, list(inputs), outs, name=name, **attrs))
    for o, s in zip(outs, shapes):
        g._shapes[o] = tuple(int(d) for d in s)
    g._last = outs[-1]
    return outs


def unary(g: GraphBuilder, op: str, x: str, name: str | None = None, **attrs) -> str:
    """Shape-preserving single-input op (``Sigmoid``, ``Erf``, ``Sqrt``, ``Softmax``, ...)."""
    return g._node(op, [x], g._auto(op, name), g.shape(x), **attrs)


def broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    """Numpy broadcasting of static shapes where ``-1`` is a dynamic (batch) dimension."""
    rank = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (rank - len(s)) + tuple(s) for s in shapes]):
        fixed = {d for d in dims if d != 1 and d >= 0}
        if len(fixed) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(fixed.pop() if fixed else (-1 if -1 in dims else 1))
    return tuple(out)


def binary(g: GraphBuilder, op: str, a: str, b: str, name: str | None = None) -> str:
    """Broadcasting ``Add``/``Sub``/``Mul``/``Div``/``Pow``."""
    return g._node(op, [a, b], g._auto(op, name), broadcast(g.shape(a), g.shape(b)))


def scalar(g: GraphBuilder, name: str, value: float) -> str:
    """A float32 scalar ``Constant`` node (how torch.onnx writes Python number literals)."""
    return g._const(name, np.array(value, _F32))


def silu(g: GraphBuilder, x: str, name: str) -> str:
    """``nn.SiLU`` as torch exports it: ``Mul(x, Sigmoid(x))``."""
    return binary(g, "Mul", x, unary(g, "Sigmoid", x, f"{name}.sigmoid"), name)


def hardsigmoid(g: GraphBuilder, x: str, name: str | None = None) -> str:
    """``F.hardsigmoid``: ``HardSigmoid(alpha=1/6, beta=0.5)``."""
    return unary(g, "HardSigmoid", x, name, alpha=1.0 / 6.0, beta=0.5)


def gelu_erf(g: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU as torch's legacy exporter writes it: ``x * (1 + Erf(x / sqrt 2)) * 0.5``."""
    d = binary(g, "Div", x, scalar(g, f"{name}.sqrt2", math.sqrt(2.0)), f"{name}.div")
    e = unary(g, "Erf", d, f"{name}.erf")
    e = binary(g, "Add", e, scalar(g, f"{name}.one", 1.0), f"{name}.add")
    y = binary(g, "Mul", x, e, f"{name}.mul")
    return binary(g, "Mul", y, scalar(g, f"{name}.half", 0.5), name)


def concat(g: GraphBuilder, xs: Sequence[str], axis: int, name: str | None = None) -> str:
    """``Concat`` along ``axis``."""
    shapes = [g.shape(x) for x in xs]
    ax = axis % len(shapes[0])
    out = list(shapes[0])
    out[ax] = sum(s[ax] for s in shapes)
    return g._node("Concat", list(xs), g._auto("Concat", name), out, axis=axis)


def split(g: GraphBuilder, x: str, sizes: Sequence[int], axis: int, name: str,
          const: bool = False) -> list[str]:
    """Opset-13..17 ``Split`` with the split sizes as a second input (initializer or ``Constant``)."""
    s = g.shape(x)
    ax = axis % len(s)
    if sum(sizes) != s[ax]:
        raise ValueError(f"{name}: split {list(sizes)} of axis size {s[ax]}")
    sz = (g._const if const else g._init)(f"{name}.split", np.array(sizes, _I64))
    shapes = [s[:ax] + (n,) + s[ax + 1:] for n in sizes]
    return multi_node(g, "Split", [x, sz], name, shapes, axis=axis)


def reshape(g: GraphBuilder, x: str, shape: Sequence[int], name: str, const: bool = False) -> str:
    """``Reshape`` to a constant target (initializer, or a ``Constant`` node): ``0`` copies a
    dim, one ``-1`` is inferred; a dynamic (``-1``) input dim may only be copied by a ``0``."""
    in_shape, shape = g.shape(x), list(shape)
    if any(i >= len(shape) or shape[i] != 0 for i, d in enumerate(in_shape) if d < 0):
        raise ValueError(f"{name}: cannot reshape {in_shape} to {shape} statically")
    out = [in_shape[i] if d == 0 else d for i, d in enumerate(shape)]
    total = math.prod(d for d in in_shape if d >= 0)
    known = math.prod(d for i, d in enumerate(out) if d >= 0 and shape[i] != -1)
    if -1 in shape:
        out[shape.index(-1)] = total // known
    elif known != total:
        raise ValueError(f"{name}: cannot reshape {in_shape} to {shape}")
    s = (g._const if const else g._init)(f"{name}.shape", np.array(shape, _I64))
    return g._node("Reshape", [x, s], name, out)


def transpose(g: GraphBuilder, x: str, perm: Sequence[int], name: str | None = None) -> str:
    """``Transpose``."""
    s = [g.shape(x)[p] for p in perm]
    return g._node("Transpose", [x], g._auto("Transpose", name), s, perm=list(perm))


def squeeze(g: GraphBuilder, x: str, axes: Sequence[int], name: str) -> str:
    """Opset-13+ ``Squeeze`` with the axes as a ``Constant`` input."""
    s = g.shape(x)
    axes_n = {a % len(s) for a in axes}
    ax = g._const(f"{name}.axes", np.array(axes, _I64))
    return g._node("Squeeze", [x, ax], name, [d for i, d in enumerate(s) if i not in axes_n])


def reduce_mean(g: GraphBuilder, x: str, axes: Sequence[int], name: str, keepdims: bool = True,
                opset: int = 17) -> str:
    """``ReduceMean``: axes as an attribute up to opset 17, as a ``Constant`` input from 18."""
    s = g.shape(x)
    axes_n = {a % len(s) for a in axes}
    shape = [1 if i in axes_n else d for i, d in enumerate(s) if keepdims or i not in axes_n]
    if opset >= 18:
        ax = g._const(f"{name}.axes", np.array(axes, _I64))
        return g._node("ReduceMean", [x, ax], name, shape, keepdims=int(keepdims))
    return g._node("ReduceMean", [x], name, shape, axes=list(axes), keepdims=int(keepdims))


def _affine(g: GraphBuilder, c: int, name: str, bshape: tuple[int, ...]) -> tuple[str, str]:
    w = g.rng.uniform(0.5, 1.5, c).reshape(bshape).astype(_F32)
    b = g.rng.normal(0.0, 0.05, c).reshape(bshape).astype(_F32)
    return g._init(f"{name}.weight", w), g._init(f"{name}.bias", b)


def layer_norm(g: GraphBuilder, x: str, name: str, axis: int = -1, eps: float = 1e-6,
               spelt: bool = True, opset: int = 17) -> str:
    """LayerNorm over one axis with a learnable affine.

    ``spelt=True`` writes what torch's legacy exporter (or a hand-written LN
    such as ConvNeXt's channels-first one) produces::

        u = ReduceMean(x); d = x - u; v = ReduceMean(Pow(d, 2))
        y = d / Sqrt(v + eps) * weight + bias

    ``spelt=False`` writes the opset-17 ``LayerNormalization`` op (last axis
    only), as the dynamo exporter does.
    """
    s = g.shape(x)
    ax = axis % len(s)
    if not spelt:
        if ax != len(s) - 1:
            raise ValueError("LayerNormalization is used over the last axis only")
        w, b = _affine(g, s[ax], name, (s[ax],))
        return g._node("LayerNormalization", [x, w, b], name, s, axis=-1, epsilon=eps)
    u = reduce_mean(g, x, [axis], f"{name}.mean", opset=opset)
    d = binary(g, "Sub", x, u, f"{name}.sub")
    p = binary(g, "Pow", d, scalar(g, f"{name}.two", 2.0), f"{name}.pow")
    v = reduce_mean(g, p, [axis], f"{name}.var", opset=opset)
    v = binary(g, "Add", v, scalar(g, f"{name}.eps", eps), f"{name}.add_eps")
    y = binary(g, "Div", d, unary(g, "Sqrt", v, f"{name}.sqrt"), f"{name}.div")
    # Per-channel affine broadcast along `axis` ((C,) last axis, (C, 1, 1) for NCHW axis 1).
    w, b = _affine(g, s[ax], name, (s[ax],) + (1,) * (len(s) - 1 - ax))
    return binary(g, "Add", binary(g, "Mul", y, w, f"{name}.mul"), b, name)


def linear(g: GraphBuilder, x: str, out_features: int, name: str,
           output: str | None = None) -> str:
    """``nn.Linear`` on a >2-D input: ``MatMul`` by the transposed weight ``(in, out)``, then ``Add``."""
    fin = g.shape(x)[-1]
    bound = 1.0 / math.sqrt(fin)
    w = g._init(f"{name}.weight", g.rng.uniform(-bound, bound, (fin, out_features)).astype(_F32))
    b = g._init(f"{name}.bias", g.rng.uniform(-bound, bound, out_features).astype(_F32))
    y = g._node("MatMul", [x, w], f"{name}.matmul", g.shape(x)[:-1] + (out_features,))
    return g._node("Add", [y, b], name, g.shape(y), output=output)


def max_pool2d(g: GraphBuilder, x: str, kernel: Sequence[int], stride: Sequence[int],
               pads: Sequence[int] = (0, 0, 0, 0), name: str | None = None) -> str:
    """``MaxPool`` with a rectangular kernel and ONNX-order pads."""
    n, c, h, w = g.shape(x)
    oh = (h + pads[0] + pads[2] - kernel[0]) // stride[0] + 1
    ow = (w + pads[1] + pads[3] - kernel[1]) // stride[1] + 1
    return g._node("MaxPool", [x], g._auto("MaxPool", name), (n, c, oh, ow),
                   kernel_shape=list(kernel), strides=list(stride), pads=list(pads))


def conv_transpose(g: GraphBuilder, x: str, out_ch: int, k: int, stride: int, name: str,
                   pad: int = 0, output_padding: int = 0, groups: int = 1,
                   bias: bool = True) -> str:
    """``ConvTranspose`` (weight ``(C_in, C_out / groups, k, k)``, as ``nn.ConvTranspose2d``)."""
    n, c, h, w = g.shape(x)
    if c % groups or out_ch % groups:
        raise ValueError(f"{name}: channels {c}->{out_ch} not divisible by groups={groups}")
    # Each output pixel sums about c/groups * k*k / stride^2 taps; no ReLU gain (no activation
    # follows an upsampler), so random activations do not grow level after level.
    fan = c // groups * k * k / (stride * stride)
    wt = g.rng.standard_normal((c, out_ch // groups, k, k)) * math.sqrt(1.0 / fan)
    inputs = [x, g._init(f"{name}.weight", wt.astype(_F32))]
    if bias:
        inputs.append(g._init(f"{name}.bias", g.rng.uniform(-0.1, 0.1, out_ch).astype(_F32)))
    oh = (h - 1) * stride - 2 * pad + k + output_padding
    ow = (w - 1) * stride - 2 * pad + k + output_padding
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                 dilations=[1, 1], group=groups)
    if output_padding:
        attrs["output_padding"] = [output_padding, output_padding]
    return g._node("ConvTranspose", inputs, name, (n, out_ch, oh, ow), **attrs)


def _rnn(g: GraphBuilder, op: str, gates: int, x: str, hidden: int, name: str,
         bidirectional: bool, **attrs) -> str:
    t, n, fin = g.shape(x)
    d = 2 if bidirectional else 1

    def u(bound: float, *shape: int) -> np.ndarray:
        return g.rng.uniform(-bound, bound, shape).astype(_F32)

    # torch draws everything from U(+-1/sqrt(H)); the input weights use 1/sqrt(C) here so gate
    # pre-activations stay O(1) (unsaturated) for a wide input. ONNX stacks the directions
    # first and orders gates its own way (LSTM iofc, GRU zrh); moot for random weights.
    w = g._init(f"{name}.W", u(1.0 / math.sqrt(fin), d, gates * hidden, fin))
    r = g._init(f"{name}.R", u(1.0 / math.sqrt(hidden), d, gates * hidden, hidden))
    b = g._init(f"{name}.B", u(1.0 / math.sqrt(hidden), d, 2 * gates * hidden))
    return g._node(op, [x, w, r, b], name, (t, d, n, hidden), hidden_size=hidden,
                   direction="bidirectional" if bidirectional else "forward", **attrs)


def lstm(g: GraphBuilder, x: str, hidden: int, name: str, bidirectional: bool = True) -> str:
    """``LSTM`` on ``(T, N, C)`` without initial states; returns ``Y`` ``(T, dirs, N, H)``."""
    return _rnn(g, "LSTM", 4, x, hidden, name, bidirectional)


def gru(g: GraphBuilder, x: str, hidden: int, name: str, bidirectional: bool = True) -> str:
    """``GRU`` with ``linear_before_reset=1`` (PyTorch's formulation); returns ``Y``."""
    return _rnn(g, "GRU", 3, x, hidden, name, bidirectional, linear_before_reset=1)


def rnn_to_sequence(g: GraphBuilder, y: str, name: str, const: bool = False) -> str:
    """PyTorch's post-processing of an RNN ``Y``: ``(T, D, N, H)`` -> Transpose -> Reshape ``(T, N, D*H)``."""
    y = transpose(g, y, [0, 2, 1, 3], f"{name}.transpose")
    return reshape(g, y, [0, 0, -1], name, const=const)


def resize(g: GraphBuilder, x: str, name: str, mode: str, ctm: str,
           scales: Sequence[float] | None = None, sizes: str | Sequence[int] | None = None,
           out_shape: Sequence[int] | None = None, output: str | None = None) -> str:
    """Opset-13+ ``Resize`` with an empty roi, as torch writes ``F.interpolate``.

    Give either constant ``scales`` (an initializer), constant ``sizes`` (a
    tuple, written as an initializer), or ``sizes`` as the name of a tensor
    computed in the graph (then ``out_shape`` is required). ``output`` names
    the result tensor when it must differ from the node name.
    """
    if scales is not None:
        inputs = [x, "", g._init(f"{name}.scales", np.array(scales, _F32))]
        out_shape = [int(math.floor(d * f)) for d, f in zip(g.shape(x), scales)]
    elif isinstance(sizes, str):
        if out_shape is None:
            raise ValueError("out_shape is required with computed sizes")
        inputs = [x, "", "", sizes]
    else:
        inputs = [x, "", "", g._init(f"{name}.sizes", np.array(sizes, _I64))]
        out_shape = list(sizes)
    return g._node("Resize", inputs, name, out_shape, output=output, mode=mode,
                   coordinate_transformation_mode=ctm, cubic_coeff_a=-0.75, nearest_mode="floor")
