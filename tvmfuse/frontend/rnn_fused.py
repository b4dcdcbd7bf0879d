"""LSTM and GRU directions as one whole-sequence kernel each (CPU targets), for :mod:`.rnn`.

Instead of unrolling a direction's steps, :func:`emit_direction` writes one node ``Recurrence`` (domain
``tvmfuse``) reading the direction's rows of the input projection; :func:`converter` turns it into a
``call_tir`` of :mod:`tvmfuse.schedules.computes.recurrence`'s kernel during TVM's ONNX import
(:func:`tvmfuse.frontend.importer.to_relax`). ORT cannot run such a node: it only exists between
:func:`tvmfuse.frontend.prepare` (with ``fused_recurrence``) and the import.

Fused: LSTM with the default activations (Sigmoid, Tanh, Tanh), no ``clip``, no peepholes, no
``input_forget``; GRU with the default activations (Sigmoid, Tanh), no ``clip``, either
``linear_before_reset``. Other cells (and RNN) are unrolled.
"""

from __future__ import annotations

import numpy as np

from .rnn_cells import Emitter

DOMAIN = "tvmfuse"
OP_TYPE = "Recurrence"
_DEFAULTS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh")}


def fusable(op: str, attrs: dict, acts: tuple, peepholes) -> bool:
    """Whether one direction of ``op`` with these settings has a whole-sequence kernel."""
    return (op in _DEFAULTS and tuple(acts) == _DEFAULTS[op] and attrs.get("clip") is None
            and not attrs.get("input_forget", 0) and (peepholes is None or not np.any(peepholes)))


def emit_direction(e: Emitter, op: str, xw: str, d: int, dirs: int, seq: int, batch: int, r: np.ndarray,
                   rb_h: np.ndarray | None, h0: str | None, c0: str | None, reverse: bool, lbr: bool,
                   tag: str) -> tuple[str, str, str | None]:
    """One direction: ``(Y_d [seq, batch, H] in time order, H_last [batch, H], C_last [batch, H] or None)``.

    ``xw`` is the input projection of every step and direction, ``[seq * batch, dirs * G * H]``."""
    hidden = r.shape[-1]
    width = r.shape[0]
    x = xw if dirs == 1 else e.slice(xw, [d * width], [(d + 1) * width], [1], f"{tag}/x")
    x = e.reshape(x, [seq, batch, width], f"{tag}/x_steps")
    inputs = [x, e.const(f"{tag}/R_T", r.T), h0 or ""]
    if op == "LSTM":
        inputs.append(c0 or "")
    elif lbr and rb_h is not None:
        inputs.append(e.const(f"{tag}/Rb_h", rb_h))
    while inputs[-1] == "":
        inputs.pop()
    y = e.fresh(f"{e.prefix}/{tag}/Y")
    outputs = [y] + ([e.fresh(f"{e.prefix}/{tag}/C_last")] if op == "LSTM" else [])
    e.nodes.append(_node(e, op, inputs, outputs, tag, reverse=int(reverse), linear_before_reset=int(lbr)))
    last = 0 if reverse else seq - 1
    h_last = e.reshape(e.slice(y, [last], [last + 1], [0], f"{tag}/Y_last"), [batch, hidden], f"{tag}/h_last")
    return y, h_last, (outputs[1] if op == "LSTM" else None)


def _node(e: Emitter, op: str, inputs, outputs, tag: str, **attrs):
    from onnx import helper

    return helper.make_node(OP_TYPE, inputs, outputs, name=f"{e.prefix}/{tag}/recurrence", domain=DOMAIN,
                            cell=op, **attrs)


def stack_sequences(e: Emitter, ys: list[str], layout: int, seq: int, batch: int, hidden: int, out: str) -> None:
    """ONNX's Y from each direction's ``[seq, batch, H]``: ``[seq, D, batch, H]`` (layout 0) or ``[batch, seq,
    D, H]`` (layout 1)."""
    dirs = len(ys)
    if layout:
        ys = [e.op("Transpose", [y], f"Y{d}_batch_major", perm=[1, 0, 2]) for d, y in enumerate(ys)]
        shape = [batch, seq, 1, hidden]
        final = [batch, seq, dirs, hidden]
    else:
        shape = [seq, 1, batch, hidden]
        final = [seq, dirs, batch, hidden]
    if dirs == 1:
        e.reshape(ys[0], final, "Y", out=out)
        return
    parts = [e.reshape(y, shape, f"Y{d}_4d") for d, y in enumerate(ys)]
    e.op("Concat", parts, "Y", out=out, axis=2 if layout else 1)


def converter():
    """The ONNX importer's converter class for ``Recurrence`` (imports TVM)."""
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    from ..schedules.computes import recurrence

    class Recurrence(OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            x, rt = inputs[0], inputs[1]
            seq, batch, _ = (int(d) for d in x.ty.shape)
            hidden = int(rt.ty.shape[0])
            cell, reverse = attr["cell"], bool(attr.get("reverse", 0))
            cell = cell.decode() if isinstance(cell, bytes) else cell
            zeros = np.zeros((batch, hidden), "float32")
            state = [inputs[i] if len(inputs) > i and inputs[i] is not None else relax.const(zeros) for i in (2, 3)]
            y = relax.TensorType((seq, batch, hidden), "float32")
            if cell == "LSTM":
                kernel = recurrence.lstm_kernel(seq, batch, hidden, reverse)
                args, out = [x, rt] + state, [y, relax.TensorType((batch, hidden), "float32")]
            else:
                lbr = bool(attr.get("linear_before_reset", 0))
                given = len(inputs) > 3 and inputs[3] is not None
                rb = inputs[3] if lbr and given else relax.const(np.zeros(hidden, "float32"))
                kernel = recurrence.gru_kernel(seq, batch, hidden, reverse, lbr)
                args, out = [x, rt, state[0], rb], y
            gv = bb.add_func(kernel, f"tvmfuse_{cell.lower()}")
            return relax.call_tir(gv, args, out)

    return Recurrence
