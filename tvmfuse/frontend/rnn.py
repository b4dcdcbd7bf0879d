"""Unroll ONNX's recurrent ops (LSTM, GRU, RNN) into basic ops TVM's importer handles (an ONNX-graph rewrite),
or, with ``fused`` (CPU targets), write a layer whose cells have one as a whole-sequence kernel node (every
direction in one, :mod:`.rnn_fused`) after the same input projection.

TVM 0.27's ONNX importer has no converter for LSTM, GRU or RNN. Before import, each such node (default
domain, top-level graph) is replaced here by a subgraph unrolled over the time steps, which needs a static
sequence length and batch size (fixed input shapes; the shape of X comes from the value_info or from ONNX
shape inference):

- The input projection of every time step and both directions is one MatMul,
  ``reshape(X, [seq * batch, input]) @ concat_d(W_d^T) + (Wb + Rb)``, as fast LSTM implementations do it;
  each step then slices its rows and columns and adds ``H_{t-1} @ R^T`` (one MatMul per step and direction).
  The weights are transposed, split and summed in numpy here and stored as new initializers named after the
  node; the old W, R, B and P become unused and are removed.
- The cell equations are the ONNX spec's (:mod:`.rnn_cells`): LSTM gates i, o, f, c with peepholes P,
  ``clip`` (bounding the gates' pre-activations but not C_t before h(), as onnxruntime does) and
  ``input_forget``; GRU gates z, r, h with ``linear_before_reset`` 0 and 1; RNN. Directions
  forward, reverse and bidirectional; ``layout`` 0 and 1; ``initial_h``/``initial_c`` (absent: zeros; LSTM's and
  RNN's first step then skips its recurrent MatMul); outputs Y, Y_h, Y_c, any of them absent (name "").
- New nodes are named ``<node>/<direction>/step<t>/<what>``, so an error inside them points at the node.

Not supported (UnsupportedOpError naming the node): a dynamic sequence length or batch size, weights that
are not constants (initializers or Constant nodes), ``sequence_lens`` other than the full length for every
batch entry (padded batches), and activations other than Sigmoid, Tanh and Relu.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UnsupportedOpError, spelled
from .graph import drop_unused_constant_nodes, drop_unused_initializers, names_read
from . import rnn_codes, rnn_fused, skeleton
from .rnn_cells import Cell, Emitter, gru_step, lstm_step, rnn_step

#: Op types (default domain) this module replaces; ``check_ops`` accepts them.
REWRITTEN_OP_TYPES = frozenset({"LSTM", "GRU", "RNN"})

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_ACTS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
_DIRECTIONS = ("forward", "reverse", "bidirectional")
# Inputs by position: X, W, R, B, sequence_lens, initial_h, then LSTM's initial_c and P.
_X, _W, _R, _B, _SEQ_LENS, _INITIAL_H, _INITIAL_C, _P = range(8)


class _Rewriter:
    """What the rewrites share: constant values, static shapes, fresh names, new initializers, errors."""

    def __init__(self, model: onnx.ModelProto, source: str):
        graph = model.graph
        self.model, self.source = model, source
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.constants = {t.name: t for t in graph.initializer}
        self.constant_nodes = {}
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
                self.constant_nodes[node.output[0]] = node
        self._shapes: dict[str, tuple] | None = None
        self._inferred = False
        self.names = {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
        self.names |= set(self.constants) | {n for node in graph.node for n in list(node.input) + list(node.output)}
        self.names |= {node.name for node in graph.node}
        self.new_initializers: list[onnx.TensorProto] = []
        self.producers = rnn_codes.producers(graph)
        self.codes: dict[str, rnn_codes.Codes] = {}  # weights given as DequantizeLinear of integer codes

    def error(self, node: onnx.NodeProto, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.source}: {node.op_type} node {_node_name(node)!r}: {why}")

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def constant(self, node: onnx.NodeProto, index: int, role: str,
                 needs: str = "tvmfuse needs constant weights (initializers or Constant nodes)") -> np.ndarray | None:
        """The value of input ``index`` (None when absent); raises when it is computed at run time."""
        name = node.input[index] if index < len(node.input) else ""
        if not name:
            return None
        found = self._folded(name)
        if found is not None:
            return found[0]
        raise self.error(node, f"{role} {name!r} is computed at run time; {needs}")

    def _folded(self, name: str) -> tuple[np.ndarray, rnn_codes.Codes | None] | None:
        """``(value, codes)`` of a constant, or of a DequantizeLinear / Reshape of constants; None otherwise."""
        if name in self.constants:
            return numpy_helper.to_array(self.constants[name]), None
        if name in self.constant_nodes:
            value = _constant_node_value(self.constant_nodes[name])
            return None if value is None else (value, None)
        found = rnn_codes.fold(self.producers[name], self._folded) if name in self.producers else None
        if found is not None and found[1] is not None:
            self.codes[name] = found[1]
        return found

    def shape(self, name: str) -> tuple | None:
        """The shape of ``name`` from the model's value_info, else from ONNX shape inference (None = unknown dim)."""
        if self._shapes is None:
            self._shapes = {t.name: tuple(t.dims) for t in self.model.graph.initializer}
            self._merge_shapes(self.model.graph)
        if not _static(self._shapes.get(name)) and not self._inferred:
            self._inferred = True
            try:
                self._merge_shapes(onnx.shape_inference.infer_shapes(skeleton.skeleton(self.model)).graph)
            except Exception:  # noqa: BLE001 - inference is best effort; the value_info is still used
                pass
        return self._shapes.get(name)

    def _merge_shapes(self, graph: onnx.GraphProto) -> None:
        for value in list(graph.input) + list(graph.value_info) + list(graph.output):
            shape = _value_shape(value)
            if shape is not None and (value.name not in self._shapes or _static(shape)):
                self._shapes[value.name] = shape


def _value_shape(value: onnx.ValueInfoProto) -> tuple | None:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)


def _static(shape: tuple | None) -> bool:
    return shape is not None and None not in shape


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    if attr.name in ("value_float", "value_floats"):
        return np.array(helper.get_attribute_value(attr), np.float32)
    if attr.name in ("value_int", "value_ints"):
        return np.array(helper.get_attribute_value(attr), np.int64)
    return None


def _node_name(node: onnx.NodeProto) -> str:
    return node.name or next((o for o in node.output if o), node.op_type)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


def _activations(rw: _Rewriter, node: onnx.NodeProto, attrs: dict, directions: int) -> list[tuple[str, ...]]:
    """The activation op types of each direction."""
    default = _DEFAULT_ACTS[node.op_type]
    names = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
    if not names:
        return [default] * directions
    if len(names) not in (len(default), len(default) * directions):
        raise rw.error(node, f"activations {names} should list {len(default)} functions per direction")
    unknown = [a for a in names if a.lower() not in _ACTS]
    if unknown:
        raise rw.error(node, f"activation {unknown[0]!r} is not supported (only Sigmoid, Tanh and Relu)")
    ops = tuple(_ACTS[a.lower()] for a in names)
    n = len(default)
    return [ops[d * n:(d + 1) * n] if len(ops) > n else ops for d in range(directions)]


def _static_dims(rw: _Rewriter, node: onnx.NodeProto, layout: int) -> tuple[int, int]:
    """``(sequence length, batch size)`` from the shape of X; raises when either is not static."""
    name = node.input[_X]
    shape = rw.shape(name)
    fix = spelled("pass shapes= for the model's inputs", "pass --shape for the model's inputs")
    if shape is None or len(shape) != 3:
        raise rw.error(node, f"input {name!r} has an unknown shape; it needs a static sequence length and "
                             f"batch size; {fix}")
    seq, batch = (shape[1], shape[0]) if layout else (shape[0], shape[1])
    shown = "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
    if seq is None:
        raise rw.error(node, f"input {name!r} needs a static sequence length (shape {shown}); {fix}")
    if batch is None:
        raise rw.error(node, f"input {name!r} needs a static batch size (shape {shown}); {fix}")
    return seq, batch


def _check_sequence_lens(rw: _Rewriter, node: onnx.NodeProto, seq: int) -> None:
    lens = rw.constant(node, _SEQ_LENS, "sequence_lens", "only full-length sequences are supported (a constant "
                                                         f"sequence_lens equal to {seq} for every batch entry)")
    if lens is not None and lens.size and np.any(lens != seq):
        raise rw.error(node, f"sequence_lens {lens.tolist()} differ from the sequence length {seq}; only "
                             "full-length sequences are supported")


def _weights(rw: _Rewriter, node: onnx.NodeProto, directions: int):
    """``(W, R, B, P)`` as arrays of shapes [D, G*H, I], [D, G*H, H], [D, 2*G*H] and [D, 3*H] (B, P or None)."""
    gates = _GATES[node.op_type]
    w, r = (rw.constant(node, i, role) for i, role in ((_W, "W"), (_R, "R")))
    if w is None or r is None:
        raise rw.error(node, "inputs W and R are required")
    hidden = r.shape[-1] if r.ndim == 3 else -1
    size = _attrs(node).get("hidden_size", hidden)
    b = rw.constant(node, _B, "B")
    p = rw.constant(node, _P, "P") if node.op_type == "LSTM" else None
    expected = {"W": (w, (directions, gates * hidden, w.shape[-1] if w.ndim else -1)),
                "R": (r, (directions, gates * hidden, hidden)),
                "B": (b, (directions, 2 * gates * hidden)), "P": (p, (directions, 3 * hidden))}
    for role, (value, shape) in expected.items():
        if value is not None and value.shape != shape:
            raise rw.error(node, f"{role} has shape {value.shape}, expected {shape} (hidden_size {hidden})")
    if size != hidden:
        raise rw.error(node, f"hidden_size {size} does not match R's shape {r.shape}")
    return w, r, b, p


def _initial_state(e: Emitter, node: onnx.NodeProto, index: int, layout: int, d: int, what: str) -> str | None:
    """Direction ``d`` of initial_h / initial_c ([D, B, H], or [B, D, H] with layout 1) as [B, H]."""
    name = _input(node, index)
    if not name:
        return None
    return e.op("Gather", [name, e.index(d)], f"{what}{d}", axis=layout)


def _rewrite(rw: _Rewriter, node: onnx.NodeProto, fused: bool) -> list[onnx.NodeProto]:
    op, attrs = node.op_type, _attrs(node)
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction not in _DIRECTIONS:
        raise rw.error(node, f"direction {direction!r} is not one of {', '.join(_DIRECTIONS)}")
    layout = attrs.get("layout", 0)
    if layout not in (0, 1):
        raise rw.error(node, f"layout {layout} is not 0 or 1")
    dirs = 2 if direction == "bidirectional" else 1
    acts = _activations(rw, node, attrs, dirs)
    w, r, b, p = _weights(rw, node, dirs)
    seq, batch = _static_dims(rw, node, layout)
    _check_sequence_lens(rw, node, seq)
    gates, hidden, dtype = _GATES[op], r.shape[-1], w.dtype
    width = gates * hidden
    lbr = op == "GRU" and bool(attrs.get("linear_before_reset", 0))
    e = Emitter(_node_name(node), rw.opset, dtype, rw.fresh, rw.new_initializers)

    # The input projection of all steps and directions: [seq * batch, input] @ [input, D * G * H] + bias.
    x = node.input[_X]
    if layout:
        x = e.op("Transpose", [x], "x_seq_major", perm=[1, 0, 2])
    x = e.reshape(x, [seq * batch, w.shape[-1]], "x_rows")
    w_codes = rw.codes.get(node.input[_W]) if attrs.get(rnn_codes.DYNAMIC_INPUT_ATTR) else None
    xw = (w_codes and rnn_codes.quantized_projection(e, x, w_codes)) or \
        e.op("MatMul", [x, e.const("W_T", np.concatenate([w[d].T for d in range(dirs)], axis=1))], "xW")
    if b is not None:
        bias = b[:, :width] + b[:, width:]
        if lbr:  # Rb_h stays inside the reset gate's product
            bias = np.concatenate([bias[:, :2 * hidden], b[:, :width][:, 2 * hidden:]], axis=1)
        xw = e.op("Add", [xw, e.const("bias", bias.reshape(-1))], "xW_b")

    if fused and all(rnn_fused.fusable(op, attrs, acts[d], None if p is None else p[d]) for d in range(dirs)):
        codes = rw.codes.get(node.input[_R]) if op == "LSTM" else None
        return _fused(e, node, layout, direction, xw, seq, batch, r, b, lbr, codes and codes.gate_columns())
    hs: list[list[str]] = []  # hs[d][t]: H_t of direction d, in time order
    last_h, last_c = [], []
    for d in range(dirs):
        tag = _tag(d, dirs, direction)
        cell = _cell(e, node, attrs, acts[d], tag, r[d], None if b is None else b[d], None if p is None else p[d],
                     lbr)
        h = _initial_state(e, node, _INITIAL_H, layout, d, f"{tag}/h")
        if h is None and op == "GRU":  # its first step needs H_0 for the reset gate's product
            cell.zeros = e.const(f"{tag}/zeros", np.zeros((batch, hidden)))
        c = _initial_state(e, node, _INITIAL_C, layout, d, f"{tag}/c") if op == "LSTM" else None
        reverse = direction == "reverse" or d == 1
        states = [""] * seq
        for t in (reversed(range(seq)) if reverse else range(seq)):
            step = f"{tag}/step{t}"
            x_t = e.slice(xw, [t * batch, d * width], [(t + 1) * batch, (d + 1) * width], [0, 1], f"{step}/x")
            if op == "LSTM":
                h, c = lstm_step(e, cell, step, x_t, h, c)
            else:
                h = (gru_step if op == "GRU" else rnn_step)(e, cell, step, x_t, h)
            states[t] = h
        hs.append(states)
        last_h.append(h)
        last_c.append(c)

    if node.output and node.output[0]:
        order = [hs[d][t] for t in range(seq) for d in range(dirs)]
        shape = [batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden]
        _stack(e, order, layout, shape, "Y", node.output[0])
    _last_states(e, node, last_h, last_c, layout, batch, hidden)
    return e.nodes


def _tag(d: int, dirs: int, direction: str) -> str:
    """Direction ``d``'s name in new nodes' names: ``fw`` or ``bw``."""
    return ("fw", "bw")[d] if dirs == 2 else ("fw" if direction == "forward" else "bw")


def _last_states(e: Emitter, node: onnx.NodeProto, last_h: list, last_c: list, layout: int, batch: int,
                 hidden: int) -> None:
    """ONNX's Y_h and Y_c (those the node names) from each direction's last ``[B, H]`` states."""
    outputs = list(node.output) + [""] * 3
    shape = [batch, len(last_h), hidden] if layout else [len(last_h), batch, hidden]
    for name, states, what in ((outputs[1], last_h, "Y_h"), (outputs[2], last_c, "Y_c")):
        if name:
            _stack(e, states, layout, shape, what, name)


def _fused(e: Emitter, node: onnx.NodeProto, layout: int, direction: str, xw: str, seq: int, batch: int,
           r: np.ndarray, b: np.ndarray | None, lbr: bool, codes=None) -> list[onnx.NodeProto]:
    """Every direction as one whole-sequence kernel (:mod:`.rnn_fused`) writing ONNX's outputs (reading ``R``'s
    codes where it has them: :meth:`.rnn_codes.Codes.gate_columns`)."""
    hidden = r.shape[-1]
    states = []
    for index, what in ((_INITIAL_H, "h0"), (_INITIAL_C, "c0")):
        name = _input(node, index) if node.op_type == "LSTM" or index == _INITIAL_H else ""
        if name and layout:  # [B, D, H] -> [D, B, H]
            name = e.op("Transpose", [name], f"{what}_direction_major", perm=[1, 0, 2])
        states.append(name or None)
    rb_h = b[:, 5 * hidden:] if lbr and b is not None else None
    rnn_fused.emit_layer(e, node.op_type, xw, seq, batch, r, rb_h, states[0], states[1], direction == "reverse",
                         lbr, layout, list(node.output), codes)
    return e.nodes


def _cell(e: Emitter, node: onnx.NodeProto, attrs: dict, acts: tuple[str, ...], tag: str, r: np.ndarray,
          b: np.ndarray | None, p: np.ndarray | None, lbr: bool) -> Cell:
    """One direction's constants: R^T (split for GRU), Rb_h, peepholes."""
    hidden = r.shape[-1]
    cell = Cell(hidden=hidden, acts=acts, clip=attrs.get("clip"), linear_before_reset=lbr,
                input_forget=bool(attrs.get("input_forget", 0)))
    if node.op_type == "GRU" and not lbr:
        cell.rt = e.const(f"{tag}/R_zr_T", r[:2 * hidden].T)
        cell.rt_h = e.const(f"{tag}/R_h_T", r[2 * hidden:].T)
    else:
        cell.rt = e.const(f"{tag}/R_T", r.T)
    if lbr and b is not None:
        cell.rb_h = e.const(f"{tag}/Rb_h", b[5 * hidden:])
    if p is not None:
        cell.peepholes = tuple(e.const(f"{tag}/P_{g}", p[k * hidden:(k + 1) * hidden]) for k, g in enumerate("iof"))
    return cell


def _stack(e: Emitter, states: list[str], layout: int, shape: list[int], what: str, out: str) -> None:
    """Concatenate [B, H] states into ``out`` of ``shape``: along the rows (layout 0) or columns (layout 1)."""
    joined = states[0] if len(states) == 1 else e.op("Concat", states, f"{what}_concat", axis=1 if layout else 0)
    e.reshape(joined, shape, what, out=out)


def rewrite_recurrent_ops(model: onnx.ModelProto, source: str = "<ModelProto>",
                          fused: bool = False) -> tuple[onnx.ModelProto, int]:
    """Replace LSTM, GRU and RNN nodes by their unrolled equivalent in basic ops (in place); with ``fused``,
    the directions that have one by a whole-sequence kernel node each (:mod:`.rnn_fused`).

    Run it after the input shapes are fixed and constants folded: the sequence length and batch size
    must be static, and the weights constant.

    Parameters
    ----------
    model : onnx.ModelProto
        The model; its graph is edited in place.
    source : str
        The model's description for error messages.

    Returns
    -------
    tuple of (onnx.ModelProto, int)
        The model and the number of nodes replaced.

    Raises
    ------
    UnsupportedOpError
        Naming the node and the reason: a dynamic sequence length or batch size, weights computed at run
        time, ``sequence_lens`` shorter than the sequence, activations other than Sigmoid, Tanh and Relu,
        or inputs whose shapes do not fit each other.
    """
    graph = model.graph
    if not any(n.op_type in REWRITTEN_OP_TYPES and n.domain in ("", "ai.onnx") for n in graph.node):
        return model, 0
    rw = _Rewriter(model, source)
    nodes, replaced, read = [], 0, set()
    for node in graph.node:
        if node.op_type in REWRITTEN_OP_TYPES and node.domain in ("", "ai.onnx"):
            nodes.extend(_rewrite(rw, node, fused))
            read.update(node.input)
            replaced += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(rw.new_initializers)
    if any(n.domain == rnn_fused.DOMAIN for n in nodes) and \
            not any(o.domain == rnn_fused.DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(rnn_fused.DOMAIN, 1))
    drop_unused_constant_nodes(graph, read)
    read |= rnn_codes.drop_unread(graph, set(rw.producers) & read, names_read)
    drop_unused_initializers(graph, read)
    return model, replaced

