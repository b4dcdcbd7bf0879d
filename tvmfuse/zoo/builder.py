"""A small ONNX graph builder used by the zoo model definitions.

The builder tracks static shapes itself (every zoo model has a fixed input
shape, at most with a ``-1`` batch dimension that is carried through), so
layers such as TF-style "SAME" padding can be computed at build time exactly
as the original frameworks do it. More layers live in :mod:`.layers`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Opset every zoo model is exported with.
OPSET = 17
#: IR version 8 is what torch.onnx writes for opset 17 and every ORT >= 1.10 reads.
IR_VERSION = 8

# torch.onnx spells "slice to the very beginning" with -INT64_MAX in its flip().
_INT64_MAX = 2**63 - 1


class GraphBuilder:
    """Build a single-input, single-output float32 ONNX CNN graph.

    Parameters
    ----------
    seed : int
        Seed for ``numpy.random.default_rng``; all weights are drawn from it in
        call order, so a model definition always produces identical bytes.
    input_shape : sequence of int
        Static NCHW shape of the graph input.
    input_name : str
        Name of the graph input.
    bn_eps : float
        Epsilon written on every ``BatchNormalization`` node.
    const_weights : bool
        Write weights as ``Constant`` nodes instead of initializers, as
        paddle2onnx does.

    Notes
    -----
    Each layer method returns the name of its output tensor, which is also the
    node name, so graphs read like the ``state_dict`` of the source model
    (``layer1.0.conv1`` with initializer ``layer1.0.conv1.weight``).
    """

    def __init__(
        self,
        seed: int,
        input_shape: Sequence[int] = (1, 3, 224, 224),
        input_name: str = "input",
        bn_eps: float = 1e-5,
        const_weights: bool = False,
    ) -> None:
        self.rng = np.random.default_rng(seed)
        self.bn_eps = float(bn_eps)
        self.const_weights = bool(const_weights)
        self.input_name = input_name
        self._nodes: list[onnx.NodeProto] = []
        self._inits: list[onnx.TensorProto] = []
        self._shapes: dict[str, tuple[int, ...]] = {input_name: tuple(input_shape)}
        # Node names, tensor names and initializer names share one namespace so
        # a typo in a model definition fails loudly instead of aliasing tensors.
        self._taken: set[str] = {input_name}
        self._counters: dict[str, int] = {}
        self._clip_bounds: tuple[str, str] | None = None
        self._last = input_name

    def shape(self, x: str) -> tuple[int, ...]:
        """Return the static shape of tensor ``x``."""
        return self._shapes[x]

    def _claim(self, name: str) -> str:
        if name in self._taken:
            raise ValueError(f"duplicate name in graph: {name!r}")
        self._taken.add(name)
        return name

    def _auto(self, op: str, name: str | None) -> str:
        if name is not None:
            return name
        while True:
            i = self._counters.get(op, 0)
            self._counters[op] = i + 1
            if f"{op}_{i}" not in self._taken:
                return f"{op}_{i}"

    def _init(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        if self.const_weights:
            return self._const(name, array)
        self._claim(name)
        self._inits.append(numpy_helper.from_array(array, name))
        self._shapes[name] = array.shape
        return name

    def _node(
        self,
        op: str,
        inputs: Sequence[str],
        name: str,
        shape: tuple[int, ...] | None,
        output: str | None = None,
        **attrs,
    ) -> str:
        out = output or name
        self._claim(name)
        if out != name:
            self._claim(out)
        self._nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        if shape is not None:
            self._shapes[out] = tuple(int(d) for d in shape)
        self._last = out
        return out

    def _const(self, name: str, value: np.ndarray) -> str:
        # Constant *nodes* rather than initializers: that is what torch.onnx
        # emits inside shape arithmetic, and what a frontend must fold.
        value, last = np.asarray(value), self._last
        out = self._node("Constant", [], name, value.shape,
                         value=numpy_helper.from_array(value, name))
        self._last = last  # a constant is never the result of a layer
        return out

    def conv(
        self,
        x: str,
        out_ch: int,
        k: int,
        stride: int = 1,
        groups: int = 1,
        pad: int | Sequence[int] | None = None,
        bias: bool = False,
        name: str | None = None,
        dilation: int = 1,
        gain: float = 1.0,
        output: str | None = None,
    ) -> str:
        """2-D convolution with He-normal weights.

        Parameters
        ----------
        x : str
            Input tensor (NCHW).
        out_ch, k, stride, groups : int
            Output channels, square kernel size, stride and group count.
        pad : int or sequence of 4 int, optional
            Symmetric padding, or ONNX-order ``(top, left, bottom, right)``.
            Defaults to ``dilation * (k - 1) // 2`` on every side (PyTorch style).
        bias : bool
            Whether to add a bias input (initialised small, like PyTorch).
        name : str, optional
            Node name; initializers are ``name.weight`` / ``name.bias``.
        dilation : int
            Dilation (atrous rate) of the kernel.
        gain : float
            Extra factor on the He-normal scale, for activations whose second
            moment differs from ReLU's (SiLU: about 1.19).
        output : str, optional
            Name of the result tensor when it must differ from the node name.

        Returns
        -------
        str
            Output tensor name.
        """
        name = self._auto("Conv", name)
        n, c, h, w = self.shape(x)
        if c % groups or out_ch % groups:
            raise ValueError(f"{name}: channels {c}->{out_ch} not divisible by groups={groups}")
        if pad is None:
            pad = dilation * (k - 1) // 2
        pads = [int(pad)] * 4 if isinstance(pad, int) else [int(p) for p in pad]
        fan_in = c // groups * k * k
        # He-normal keeps the second moment constant through conv+ReLU pairs.
        scale = gain * math.sqrt(2.0 / fan_in)
        weight = self.rng.standard_normal((out_ch, c // groups, k, k)) * scale
        inputs = [x, self._init(f"{name}.weight", weight.astype(np.float32))]
        if bias:
            b = self.rng.uniform(-0.1, 0.1, out_ch)
            inputs.append(self._init(f"{name}.bias", b.astype(np.float32)))
        ek = dilation * (k - 1) + 1
        oh = (h + pads[0] + pads[2] - ek) // stride + 1
        ow = (w + pads[1] + pads[3] - ek) // stride + 1
        return self._node(
            "Conv", inputs, name, (n, out_ch, oh, ow), output=output,
            kernel_shape=[k, k], strides=[stride, stride], pads=pads,
            dilations=[dilation, dilation], group=groups,
        )

    def batch_norm(
        self,
        x: str,
        name: str | None = None,
        gamma: tuple[float, float] = (0.5, 1.5),
    ) -> str:
        """Inference-mode ``BatchNormalization`` with plausible statistics.

        ``gamma`` is the uniform range of the scale: pass a small one (0.1..0.3)
        for the last BN of a residual branch so the skip stream stays O(1).
        Initializers are ``name.{weight,bias,running_mean,running_var}``.
        """
        name = self._auto("BatchNormalization", name)
        c = self.shape(x)[1]
        rng = self.rng
        params = {
            "weight": rng.uniform(gamma[0], gamma[1], c),
            "bias": rng.normal(0.0, 0.05, c),
            "running_mean": rng.normal(0.0, 0.05, c),
            "running_var": rng.uniform(0.75, 1.25, c),
        }
        inputs = [x] + [self._init(f"{name}.{k}", v.astype(np.float32)) for k, v in params.items()]
        return self._node("BatchNormalization", inputs, name, self.shape(x), epsilon=self.bn_eps)

    def relu(self, x: str, name: str | None = None) -> str:
        """``Relu``."""
        return self._node("Relu", [x], self._auto("Relu", name), self.shape(x))

    def relu6(self, x: str, name: str | None = None) -> str:
        """ReLU6 as ``Clip(x, 0, 6)`` with min/max as initializer inputs (opset >= 11)."""
        if self._clip_bounds is None:
            # One shared pair, as torch.onnx does after constant deduplication.
            self._clip_bounds = (
                self._init("relu6.min", np.array(0.0, dtype=np.float32)),
                self._init("relu6.max", np.array(6.0, dtype=np.float32)),
            )
        return self._node("Clip", [x, *self._clip_bounds], self._auto("Clip", name), self.shape(x))

    def hardswish(self, x: str, name: str | None = None) -> str:
        """``HardSwish`` (opset 14)."""
        return self._node("HardSwish", [x], self._auto("HardSwish", name), self.shape(x))

    def add(self, a: str, b: str, name: str | None = None) -> str:
        """Elementwise ``Add`` of two same-shaped tensors."""
        if self.shape(a) != self.shape(b):
            raise ValueError(f"Add shape mismatch: {self.shape(a)} vs {self.shape(b)}")
        return self._node("Add", [a, b], self._auto("Add", name), self.shape(a))

    def max_pool(self, x: str, k: int, stride: int, pad: int = 0, name: str | None = None) -> str:
        """Square ``MaxPool`` with symmetric padding."""
        n, c, h, w = self.shape(x)
        oh = (h + 2 * pad - k) // stride + 1
        ow = (w + 2 * pad - k) // stride + 1
        return self._node("MaxPool", [x], self._auto("MaxPool", name), (n, c, oh, ow),
                          kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def global_avg_pool(self, x: str, name: str | None = None) -> str:
        """``GlobalAveragePool`` to ``(N, C, 1, 1)``."""
        n, c = self.shape(x)[:2]
        return self._node("GlobalAveragePool", [x], self._auto("GlobalAveragePool", name),
                          (n, c, 1, 1))

    def flatten(self, x: str, name: str | None = None) -> str:
        """``Flatten`` with ``axis=1``."""
        s = self.shape(x)
        return self._node("Flatten", [x], self._auto("Flatten", name),
                          (s[0], int(np.prod(s[1:]))), axis=1)

    def gemm(self, x: str, out_features: int, name: str | None = None,
             output: str | None = None) -> str:
        """Fully connected ``Gemm(transB=1)``, weight ``(out, in)``, PyTorch ``Linear`` init.

        ``output`` names the result tensor when it must differ from the node name.
        """
        name = self._auto("Gemm", name)
        n, fin = self.shape(x)
        bound = 1.0 / math.sqrt(fin)
        w = self.rng.uniform(-bound, bound, (out_features, fin)).astype(np.float32)
        b = self.rng.uniform(-bound, bound, out_features).astype(np.float32)
        inputs = [x, self._init(f"{name}.weight", w), self._init(f"{name}.bias", b)]
        return self._node("Gemm", inputs, name, (n, out_features), output=output,
                          alpha=1.0, beta=1.0, transB=1)

    def pad_same(self, x: str, k: int, stride: int, name: str | None = None) -> str:
        """TF "SAME" padding as a ``Pad`` node, spelled the way torch.onnx exports ``F.pad``.

        The pad amounts follow TensorFlow: ``total = max((ceil(H/s) - 1) * s + k - H, 0)``,
        ``before = total // 2``, ``after = total - before`` (so the extra pixel goes
        bottom/right). The ``pads`` input is not a plain initializer but the
        constant subgraph torch emits for a computed pad list::

            Constant [l, r, t, b] -> Concat(ConstantOfShape [0]*4) -> Reshape(-1, 2)
            -> Slice(step -1) -> Transpose -> Reshape(-1) -> Cast(int64) -> Pad

        Parameters
        ----------
        x : str
            NCHW input tensor.
        k, stride : int
            Kernel size and stride of the convolution that follows.
        name : str, optional
            Prefix for the emitted nodes; the ``Pad`` node itself is ``name``.

        Returns
        -------
        str
            Output tensor of the ``Pad`` node.
        """
        name = self._auto("Pad", name)
        n, c, h, w = self.shape(x)

        def same(size: int) -> tuple[int, int]:
            total = max((math.ceil(size / stride) - 1) * stride + k - size, 0)
            return total // 2, total - total // 2

        (top, bottom), (left, right) = same(h), same(w)
        i64 = np.int64
        # torch F.pad order: last dim first, (begin, end) pairs.
        torch_pads = self._const(f"{name}.pad_list", np.array([left, right, top, bottom], i64))
        zeros = self._node(
            "ConstantOfShape", [self._const(f"{name}.ext_len", np.array([4], i64))],
            f"{name}.ext", None, value=numpy_helper.from_array(np.zeros(1, i64), "value"))
        cat = self._node("Concat", [torch_pads, zeros], f"{name}.concat", None, axis=0)
        pairs = self._node("Reshape", [cat, self._const(f"{name}.pairs_shape", np.array([-1, 2], i64))],
                           f"{name}.pairs", None)
        flipped = self._node(
            "Slice",
            [pairs,
             self._const(f"{name}.flip_starts", np.array([-1], i64)),
             self._const(f"{name}.flip_ends", np.array([-_INT64_MAX], i64)),
             self._const(f"{name}.flip_axes", np.array([0], i64)),
             self._const(f"{name}.flip_steps", np.array([-1], i64))],
            f"{name}.flip", None)
        tr = self._node("Transpose", [flipped], f"{name}.transpose", None, perm=[1, 0])
        flat = self._node("Reshape", [tr, self._const(f"{name}.flat_shape", np.array([-1], i64))],
                          f"{name}.flat", None)
        onnx_pads = self._node("Cast", [flat], f"{name}.cast", None, to=TensorProto.INT64)
        value = self._const(f"{name}.value", np.array(0.0, np.float32))
        return self._node("Pad", [x, onnx_pads, value], name,
                          (n, c, h + top + bottom, w + left + right), mode="constant")

    def build(self, name: str, output: str | None = None, doc: str = "",
              opset: int = OPSET) -> onnx.ModelProto:
        """Assemble an IR-8 model (opset 17 unless told); ``output`` defaults to the last tensor made."""
        output = output or self._last
        graph = helper.make_graph(
            self._nodes, name,
            [helper.make_tensor_value_info(self.input_name, TensorProto.FLOAT,
                                           self.shape(self.input_name))],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, self.shape(output))],
            initializer=self._inits, doc_string=doc,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                 producer_name="tvmfuse.zoo", ir_version=IR_VERSION)

    def conv_bn(
        self,
        x: str,
        out_ch: int,
        k: int,
        stride: int = 1,
        groups: int = 1,
        conv_name: str | None = None,
        bn_name: str | None = None,
        act: str | None = None,
        act_name: str | None = None,
        pad: int | Sequence[int] | None = None,
        gamma: tuple[float, float] = (0.5, 1.5),
        dilation: int = 1,
    ) -> str:
        """Bias-free conv, BN and an optional activation (``"relu"``, ``"relu6"``, ``"hardswish"``)."""
        y = self.conv(x, out_ch, k, stride, groups, pad=pad, name=conv_name, dilation=dilation)
        y = self.batch_norm(y, name=bn_name, gamma=gamma)
        if act == "relu":
            y = self.relu(y, name=act_name)
        elif act == "relu6":
            y = self.relu6(y, name=act_name)
        elif act == "hardswish":
            y = self.hardswish(y, name=act_name)
        elif act is not None:
            raise ValueError(f"unknown activation {act!r}")
        return y
