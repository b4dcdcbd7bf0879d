"""One time step of the LSTM, GRU and RNN cells as ONNX nodes, for :mod:`tvmfuse.frontend.rnn`.

Every step reads ``x``, the step's slice of the input projection ``X @ W^T + bias`` computed once for all
time steps ([batch, gates * hidden], gates in ONNX order), and the previous state (``None`` for the
zero initial state, which lets the first step skip its recurrent MatMul). Tensors are 2-D, [batch, hidden].
"""

from __future__ import annotations

import dataclasses

import numpy as np
from onnx import helper, numpy_helper


class Emitter:
    """Appends the nodes of one rewritten recurrent node, named ``<node name>/<tag>``.

    ``fresh(base)`` gives an unused tensor name; ``initializers`` collects the new constants.
    """

    def __init__(self, prefix: str, opset: int, dtype: np.dtype, fresh, initializers: list):
        self.prefix, self.opset, self.dtype = prefix, opset, np.dtype(dtype)
        self.fresh, self.initializers = fresh, initializers
        self.nodes: list = []
        self._int_consts: dict[tuple, str] = {}
        self._one: str | None = None
        self._bounds: list[str] | None = None

    def op(self, op_type: str, inputs: list[str], tag: str, out: str | None = None, **attrs) -> str:
        """Append one node and return its output (``out``, or a fresh name from ``tag``)."""
        out = out or self.fresh(f"{self.prefix}/{tag}")
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{self.prefix}/{tag}", **attrs))
        return out

    def const(self, tag: str, value, dtype=None) -> str:
        """A new initializer of the cell's float dtype (or ``dtype``)."""
        name = self.fresh(f"{self.prefix}/{tag}")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype or self.dtype), name))
        return name

    def ints(self, values) -> str:
        """An int64 vector initializer, shared by every node that needs the same values."""
        key = tuple(int(v) for v in values)
        if key not in self._int_consts:
            name = self.fresh(f"{self.prefix}/i64_{'_'.join(map(str, key)).replace('-', 'm')}")
            self.initializers.append(numpy_helper.from_array(np.array(key, np.int64), name))
            self._int_consts[key] = name
        return self._int_consts[key]

    def index(self, value: int) -> str:
        """A scalar int64 initializer (a Gather index that drops the axis)."""
        key = ("scalar", value)
        if key not in self._int_consts:
            name = self.fresh(f"{self.prefix}/index{value}")
            self.initializers.append(numpy_helper.from_array(np.array(value, np.int64), name))
            self._int_consts[key] = name
        return self._int_consts[key]

    def slice(self, x: str, starts, ends, axes, tag: str) -> str:
        if self.opset < 10:  # Slice-1: attributes
            return self.op("Slice", [x], tag, starts=list(starts), ends=list(ends), axes=list(axes))
        return self.op("Slice", [x, self.ints(starts), self.ints(ends), self.ints(axes)], tag)

    def cols(self, x: str, k: int, width: int, tag: str) -> str:
        """Columns ``[k * width, (k + 1) * width)`` of the 2-D ``x``."""
        return self.slice(x, [k * width], [(k + 1) * width], [1], tag)

    def add(self, a: str, b: str | None, tag: str) -> str:
        return a if b is None else self.op("Add", [a, b], tag)

    def clip(self, x: str, bound: float, tag: str) -> str:
        if self.opset < 11:  # Clip-6: attributes
            return self.op("Clip", [x], tag, min=-bound, max=bound)
        if self._bounds is None:
            self._bounds = [self.const("clip_min", -bound), self.const("clip_max", bound)]
        return self.op("Clip", [x] + self._bounds, tag)

    def one(self) -> str:
        if self._one is None:
            self._one = self.const("one", 1.0)
        return self._one

    def reshape(self, x: str, shape, tag: str, out: str | None = None) -> str:
        return self.op("Reshape", [x, self.ints(shape)], tag, out=out)


@dataclasses.dataclass
class Cell:
    """One direction's constants (initializer names) and settings."""

    hidden: int
    acts: tuple[str, ...]          # ONNX op types: LSTM (f, g, h), GRU (f, g), RNN (f,)
    clip: float | None
    rt: str = ""                   # R^T, [hidden, gates * hidden] (GRU with linear_before_reset=0: z and r only)
    rt_h: str = ""                 # GRU linear_before_reset=0: R_h^T, [hidden, hidden]
    rb_h: str | None = None        # GRU linear_before_reset=1: Rb_h, added before the reset gate's product
    peepholes: tuple[str, str, str] | None = None   # LSTM P split into (p_i, p_o, p_f)
    input_forget: bool = False     # LSTM: f = 1 - i
    linear_before_reset: bool = False
    zeros: str = ""                # GRU: the zero initial state, [batch, hidden]


def _act(e: Emitter, cell: Cell, k: int, x: str, tag: str, clip: bool = True) -> str:
    if clip and cell.clip is not None:
        x = e.clip(x, cell.clip, f"{tag}_clip")
    return e.op(cell.acts[k], [x], tag)


def _recurrent(e: Emitter, h: str | None, rt: str, tag: str) -> str | None:
    return None if h is None else e.op("MatMul", [h, rt], tag)


def lstm_step(e: Emitter, cell: Cell, tag: str, x: str, h: str | None, c: str | None) -> tuple[str, str]:
    """``(H_t, C_t)``; gates i, o, f, c; optional peepholes, clip and coupled input/forget gates.

    ``clip`` bounds the inputs of the gates' activations but not C_t before h(), as onnxruntime does.
    """
    n = cell.hidden
    gates = e.add(x, _recurrent(e, h, cell.rt, f"{tag}/hR"), f"{tag}/gates")
    i, o, f, g = (None if name == "f" and cell.input_forget else e.cols(gates, k, n, f"{tag}/{name}_pre")
                  for k, name in enumerate("iofc"))
    if cell.peepholes is not None and c is not None:
        p_i, _, p_f = cell.peepholes
        i = e.op("Add", [i, e.op("Mul", [c, p_i], f"{tag}/pi_c")], f"{tag}/i_peep")
        if not cell.input_forget:
            f = e.op("Add", [f, e.op("Mul", [c, p_f], f"{tag}/pf_c")], f"{tag}/f_peep")
    i = _act(e, cell, 0, i, f"{tag}/i")
    f = e.op("Sub", [e.one(), i], f"{tag}/f") if cell.input_forget else _act(e, cell, 0, f, f"{tag}/f")
    g = _act(e, cell, 1, g, f"{tag}/g")
    ig = e.op("Mul", [i, g], f"{tag}/i_g")
    c_new = ig if c is None else e.op("Add", [e.op("Mul", [f, c], f"{tag}/f_c"), ig], f"{tag}/c")
    if cell.peepholes is not None:
        o = e.op("Add", [o, e.op("Mul", [c_new, cell.peepholes[1]], f"{tag}/po_c")], f"{tag}/o_peep")
    o = _act(e, cell, 0, o, f"{tag}/o")
    return e.op("Mul", [o, _act(e, cell, 2, c_new, f"{tag}/h_c", clip=False)], f"{tag}/h"), c_new


def gru_step(e: Emitter, cell: Cell, tag: str, x: str, h: str | None) -> str:
    """``H_t``; gates z, r, h; ``linear_before_reset`` puts R_h (and Rb_h) inside the reset gate's product."""
    n = cell.hidden
    h = h or cell.zeros
    hr = e.op("MatMul", [h, cell.rt], f"{tag}/hR")
    z = _act(e, cell, 0, e.op("Add", [e.cols(x, 0, n, f"{tag}/xz"), e.cols(hr, 0, n, f"{tag}/hz")],
                              f"{tag}/z_pre"), f"{tag}/z")
    r = _act(e, cell, 0, e.op("Add", [e.cols(x, 1, n, f"{tag}/xr"), e.cols(hr, 1, n, f"{tag}/hr")],
                              f"{tag}/r_pre"), f"{tag}/r")
    if cell.linear_before_reset:
        hh = e.add(e.cols(hr, 2, n, f"{tag}/hh"), cell.rb_h, f"{tag}/hh_b")
        reset = e.op("Mul", [r, hh], f"{tag}/r_hh")
    else:
        reset = e.op("MatMul", [e.op("Mul", [r, h], f"{tag}/r_h"), cell.rt_h], f"{tag}/r_h_R")
    cand = _act(e, cell, 1, e.op("Add", [e.cols(x, 2, n, f"{tag}/xh"), reset], f"{tag}/n_pre"), f"{tag}/n")
    # H_t = (1 - z) * n + z * H_{t-1} = n + z * (H_{t-1} - n)
    update = e.op("Mul", [z, e.op("Sub", [h, cand], f"{tag}/h_n")], f"{tag}/z_h_n")
    return e.op("Add", [cand, update], f"{tag}/h")


def rnn_step(e: Emitter, cell: Cell, tag: str, x: str, h: str | None) -> str:
    """``H_t = f(x + H_{t-1} @ R^T)``."""
    return _act(e, cell, 0, e.add(x, _recurrent(e, h, cell.rt, f"{tag}/hR"), f"{tag}/pre"), f"{tag}/h")
