"""An LSTM or GRU layer as one whole-sequence kernel (CPU targets), for :mod:`.rnn`.

Instead of unrolling the steps, :func:`emit_layer` writes one node ``Recurrence`` (domain ``tvmfuse``) for
all directions of a layer, reading the input projection; :func:`converter` turns it into a
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


def emit_layer(e: Emitter, op: str, xw: str, seq: int, batch: int, r: np.ndarray, rb_h: np.ndarray | None,
               h0: str | None, c0: str | None, reverse: bool, lbr: bool, layout: int, outputs: list[str],
               codes: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Every direction of one layer as one node, then ONNX's ``outputs`` (Y, Y_h, Y_c; ``""`` where unused).

    ``xw`` is the input projection of every step and direction, ``[seq * batch, D * G * H]``; ``r`` is ONNX's
    ``R`` (``[D, G * H, H]``), ``h0``/``c0`` ONNX's initial states in layout 0 (``[D, batch, H]``); ``codes`` (an
    LSTM's) ``R^T`` as integer codes ``[D, H, G * H]`` and each gate column's scale ``[D, G * H]``, which the kernel
    reads instead of ``r``."""
    from ..schedules.computes import recurrence

    dirs, width, hidden = r.shape
    x = e.reshape(xw, [seq, batch, dirs * width], "x_steps")
    if codes is not None:
        rt = e.const("R_codes_T", codes[0], codes[0].dtype)
    else:  # an LSTM whose steps the kernel splits over threads reads its weight packed per slice
        parts = recurrence.parts_for(hidden) if op == "LSTM" else 1
        rt = e.const("R_T", recurrence.pack_split(r.transpose(0, 2, 1), parts))
    inputs = [x, rt, h0 or ""]
    if op == "LSTM":
        inputs.append(c0 or "")
        if codes is not None:
            inputs.append(e.const("R_scale", codes[1]))
    elif lbr and rb_h is not None:
        inputs.append(e.const("Rb_h", rb_h))
    while inputs[-1] == "":
        inputs.pop()
    wanted = (list(outputs) + ["", "", ""])[:3 if op == "LSTM" else 2]
    # layout 0 is the kernel's own: it writes the node's outputs; layout 1 transposes them
    names = [(out if out and not layout else e.fresh(f"{e.prefix}/{what}"))
             for out, what in zip(wanted, ("Y", "Y_h", "Y_c"))]
    e.nodes.append(_node(e, op, inputs, names, reverse=int(reverse), linear_before_reset=int(lbr)))
    if layout:
        for out, name, perm in zip(wanted, names, ([2, 0, 1, 3], [1, 0, 2], [1, 0, 2])):
            if out:
                e.op("Transpose", [name], f"{out}_batch_major", out=out, perm=perm)


def _node(e: Emitter, op: str, inputs, outputs, **attrs):
    from onnx import helper

    return helper.make_node(OP_TYPE, inputs, outputs, name=f"{e.prefix}/recurrence", domain=DOMAIN, cell=op,
                            **attrs)


def converter():
    """The ONNX importer's converter class for ``Recurrence`` (imports TVM)."""
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    from ..passes.utils import add_kernel
    from ..schedules.computes import recurrence

    class Recurrence(OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            x, rt = inputs[0], inputs[1]
            seq, batch, width = (int(d) for d in x.ty.shape)
            cell, reverse = attr["cell"], bool(attr.get("reverse", 0))
            cell = cell.decode() if isinstance(cell, bytes) else cell
            dirs = int(rt.ty.shape[0])
            hidden = width // (dirs * (4 if cell == "LSTM" else 3))  # rt's layout depends on the kernel
            zeros = np.zeros((dirs, batch, hidden), "float32")
            state = [inputs[i] if len(inputs) > i and inputs[i] is not None else relax.const(zeros) for i in (2, 3)]
            y = relax.TensorType((seq, dirs, batch, hidden), "float32")
            last = relax.TensorType((dirs, batch, hidden), "float32")
            if cell == "LSTM":
                coded = len(inputs) > 4 and inputs[4] is not None
                codes = str(rt.ty.dtype) if coded else None
                kernel = recurrence.lstm_kernel(seq, batch, hidden, dirs, reverse, codes)
                args, out = [x, rt] + state + ([inputs[4]] if coded else []), [y, last, last]
            else:
                lbr = bool(attr.get("linear_before_reset", 0))
                given = len(inputs) > 3 and inputs[3] is not None
                rb = inputs[3] if lbr and given else relax.const(np.zeros((dirs, hidden), "float32"))
                kernel = recurrence.gru_kernel(seq, batch, hidden, dirs, reverse, lbr)
                args, out = [x, rt, state[0], rb], [y, last]
            gv = add_kernel(bb, kernel, f"tvmfuse_{cell.lower()}")
            return relax.call_tir(gv, args, out)

    return Recurrence
