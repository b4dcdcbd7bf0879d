"""Whole-sequence LSTM and GRU kernels (CPU): every time step of every direction of a layer in one kernel.

Unrolled into basic ops, a recurrent layer costs a few kernels per time step (the recurrent MatMul, the
gates, the cell state, the hidden state), each a VM call with its own output allocation: CRNN's two
31-step bidirectional layers made 1,274 calls per inference, more time in the calls than in the
arithmetic (``[1, 48] x [48, 192]`` per step). Here one kernel runs each direction's steps in order,
the state in a scratch buffer. The input projection of all steps stays one MatMul before it (a tvmfuse
dense kernel); the kernel reads its rows, ``x[t]`` of shape ``[batch, D * gates * hidden]`` with the biases
added, in ONNX's gate order (LSTM i, o, f, c; GRU z, r, h), and writes ONNX's outputs in layout 0.

A float LSTM of :data:`SPLIT_FROM` or more hidden units splits each step over the threads (:func:`parts_for`
slices of its hidden units, the directions one after the other): a step reads ``H x 4H`` recurrent weights,
which outgrow the L2 from about 256 units, and a thread that computes the same slice at every step keeps its
slice of the weights in its own L2. Its gates need the whole previous state, so the threads meet at a barrier
per step (one parallel launch per call, TVM's ``pragma_parallel_launch_point``; the state alternates between
two buffers, so one barrier a step suffices). The recurrent weight is then packed per slice (:func:`pack_split`):
each thread streams one contiguous block. On 2 cores of a Sapphire Rapids VM (kernels timed in alternation, 32
steps, batch 1): 256 units 0.74x the unsplit kernel's time bidirectional, 0.76x in one direction; ddddocr's 512
units 0.93-0.97x (its 4 MB a step and direction come from L3 either way, and these cores' L2 is shared with
other guests: in some phases the split kernel ran 2x faster). Smaller layers, GRUs and the coded LSTM keep the
directions in parallel, one task each with no synchronization over the steps: with a parallel launch per step
as the barrier, a 128-unit LSTM ran 2x slower (6 us a launch).

Per step and batch row: the gates ``x[t] + h @ R^T`` (``R^T`` is ``[hidden, gates * hidden]``, rows read
contiguously, ``lanes`` outputs a vector), then the cell in vectors of ``lanes`` hidden units. The sigmoid
and tanh use :func:`fast_exp` (TVM's ``fast_exp`` polynomial: at most 2.8e-7 relative error over
[-80, 80], 200,001 points against float64); ``tanh(x) = 2 sigmoid(2x) - 1``. Only the ONNX default
activations are computed here, without clip, peepholes or ``input_forget``; other cells stay unrolled
(:mod:`tvmfuse.frontend.rnn`).

The kernels carry ``tirx.is_scheduled``: nothing reschedules them. They are CPU kernels (serial steps, the
directions a parallel loop, no thread binding).
"""

from __future__ import annotations

import functools

from tvm import tirx
from tvm.script import tirx as T

from .. import families
from ..backend import SCHEDULED_BY

F32 = "float32"
RULE = "tvmfuse.recurrence"


def _c(value: float):
    return tirx.const(value, F32)


def fast_exp(x):
    """``exp(x)`` as TVM's ``topi.fast_exp`` computes it (clamped to float32's range, 2^n times a degree-7
    polynomial of the remainder), as one expression with its intermediates let-bound."""
    xc = tirx.Var("xc", F32)
    n = tirx.Var("n", F32)
    f = tirx.Var("f", F32)
    y = _c(1.9875691500e-4)
    for p in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        y = y * f + _c(p)
    y = y * f * f + f + _c(1.0)
    two_n = tirx.reinterpret(F32, tirx.shift_left(tirx.Cast("int32", n + _c(127.0)), tirx.const(23, "int32")))
    body = tirx.Let(f, xc - n * _c(0.6931471805599453), two_n * y)
    body = tirx.Let(n, tirx.floor(xc * _c(1.44269504088896341) + _c(0.5)), body)
    return tirx.Let(xc, tirx.max(tirx.min(x, _c(88.3762626647950)), _c(-88.3762626647949)), body)


def sigmoid(x):
    return _c(1.0) / (_c(1.0) + fast_exp(-x))


def tanh(x):
    return _c(2.0) * sigmoid(_c(2.0) * x) - _c(1.0)


def lanes_for(hidden: int) -> int:
    """The vector width of the gate and cell loops: the widest of 16, 8, 4 dividing ``hidden`` (else 1)."""
    return next((v for v in (16, 8, 4) if hidden % v == 0), 1)


# Hidden units from which a float LSTM splits its steps over the threads; and the most slices. A thread takes a
# contiguous run of slices (TVM's parallel loops give each task one), the same run at every step.
SPLIT_FROM = 256
MAX_PARTS = 8


def parts_for(hidden: int, codes: str | None = None) -> int:
    """How many slices of hidden units a step of an LSTM with ``hidden`` units is split into: 1 (the directions
    in parallel, unsplit) under :data:`SPLIT_FROM` units or for integer codes; else the most of
    :data:`MAX_PARTS`, 4, 2 that cut it into whole vectors."""
    if codes is not None or hidden < SPLIT_FROM:
        return 1
    v = lanes_for(hidden)
    return next((p for p in (MAX_PARTS, 4, 2) if hidden % (p * v) == 0), 1)


def pack_split(rt, parts: int):
    """``R^T`` ``[D, H, 4H]`` (numpy) in the split kernel's layout ``[D, parts, H, 4 * H / parts]``: slice ``p``'s
    block holds, per row ``k``, gate ``g``'s columns of the slice's units (``g * H + p * hp + j`` at ``g * hp +
    j``); unchanged when ``parts`` is 1."""
    if parts == 1:
        return rt
    dirs, hidden, width = rt.shape
    hp = hidden // parts
    return rt.reshape(dirs, hidden, 4, parts, hp).transpose(0, 3, 1, 2, 4).reshape(dirs, parts, hidden, 4 * hp)


def _finish(func) -> tirx.PrimFunc:
    return func.with_attrs({"tirx.noalias": True, "tirx.is_scheduled": True, SCHEDULED_BY: RULE,
                            "tvmfuse.family": families.RECURRENCE.name})


def _time(seq: int, dirs: int, reverse: bool):
    """The step index ``t`` that direction ``d`` reads and writes at its ``s``-th step: ONNX runs the second
    direction of a bidirectional layer (and a ``reverse`` one) from the last step."""
    if dirs == 2:
        return lambda d, s: s + d * (seq - 1 - 2 * s)
    return (lambda d, s: seq - 1 - s) if reverse else (lambda d, s: s)


@functools.lru_cache(maxsize=64)  # a PrimFunc is immutable: one parse per shape and process
def lstm_kernel(seq: int, batch: int, hidden: int, dirs: int = 1, reverse: bool = False,
                codes: str | None = None) -> tirx.PrimFunc:
    """``(x [seq, batch, D * 4H], rt [D, H, 4H], h0 [D, batch, H], c0 [D, batch, H]) -> (y [seq, D, batch, H],
    h [D, batch, H], c [D, batch, H])``, ONNX's ``Y`` (layout 0), ``Y_h`` and ``Y_c`` of ``D`` directions
    (``reverse``: a single direction run from the last step). ``rt`` in :func:`pack_split`'s layout when
    :func:`parts_for` splits the steps.

    ``codes`` (``"int8"`` or ``"int16"``): ``rt`` holds integer codes of that dtype and a fifth input ``scale [D,
    4H]`` the scale of each gate column, ``R^T[d, k, j] = rt[d, k, j] * scale[d, j]`` (a quantized model's
    recurrent weight, its zero point already subtracted). A step then reads a quarter (int8) of the float
    weight's bytes, which is what bounds it: ``H x 4H`` weights per step, from L3 once they outgrow L2. The
    products sum in float32 and the column's scale multiplies the sum."""
    if parts_for(hidden, codes) > 1:
        return _split_lstm(seq, batch, hidden, dirs, reverse)
    v, gh = lanes_for(hidden), 4 * hidden
    jo_n, ho_n = gh // v, hidden // v
    at = _time(seq, dirs, reverse)
    code = codes or "int8"

    # Four rows of codes per pass over the gates: the gates' load and store, not the conversion, bounded a
    # row at a time (1.75 -> 1.26 ms for ddddocr's [32 steps, 512] bidirectional layer on 2 Zen 4 cores).
    unroll = 4 if hidden % 4 == 0 else 1

    def coded_sum(h, rt, d, b, ko, j):
        terms = [h[d, b, unroll * ko + i] * tirx.Cast(F32, rt[d, unroll * ko + i, j]) for i in range(unroll)]
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    @T.macro
    def start(h, c, h0, c0, d):
        for b, j in T.grid(batch, hidden):
            h[d, b, j] = h0[d, b, j]
            c[d, b, j] = c0[d, b, j]

    @T.macro
    def cell(x, gates, y, h, c, d, s, b):
        for jo in range(ho_n):
            for ji in T.vectorized(v):
                c[d, b, jo * v + ji] = (
                    sigmoid(gates[d, 2 * hidden + jo * v + ji]) * c[d, b, jo * v + ji]
                    + sigmoid(gates[d, jo * v + ji]) * tanh(gates[d, 3 * hidden + jo * v + ji]))
                h[d, b, jo * v + ji] = sigmoid(gates[d, hidden + jo * v + ji]) * tanh(c[d, b, jo * v + ji])
                y[at(d, s), d, b, jo * v + ji] = h[d, b, jo * v + ji]

    if codes is None:  # only the function returned is parsed (TVMScript: ~0.09 s each)
        @T.prim_func(private=True)
        def kernel(x: T.Buffer((seq, batch, dirs * gh), F32), rt: T.Buffer((dirs, hidden, gh), F32),
                   h0: T.Buffer((dirs, batch, hidden), F32), c0: T.Buffer((dirs, batch, hidden), F32),
                   y: T.Buffer((seq, dirs, batch, hidden), F32), h: T.Buffer((dirs, batch, hidden), F32),
                   c: T.Buffer((dirs, batch, hidden), F32)):
            gates = T.alloc_buffer((dirs, gh), F32)
            for d in T.parallel(dirs):
                start(h, c, h0, c0, d)
                for s, b in T.grid(seq, batch):
                    for jo in range(jo_n):
                        for ji in T.vectorized(v):
                            gates[d, jo * v + ji] = x[at(d, s), b, d * gh + jo * v + ji]
                    for k, jo in T.grid(hidden, jo_n):
                        for ji in T.vectorized(v):
                            gates[d, jo * v + ji] = gates[d, jo * v + ji] + h[d, b, k] * rt[d, k, jo * v + ji]
                    cell(x, gates, y, h, c, d, s, b)

        return _finish(kernel)

    @T.prim_func(private=True)
    def coded(x: T.Buffer((seq, batch, dirs * gh), F32), rt: T.Buffer((dirs, hidden, gh), code),
              h0: T.Buffer((dirs, batch, hidden), F32), c0: T.Buffer((dirs, batch, hidden), F32),
              scale: T.Buffer((dirs, gh), F32),
              y: T.Buffer((seq, dirs, batch, hidden), F32), h: T.Buffer((dirs, batch, hidden), F32),
              c: T.Buffer((dirs, batch, hidden), F32)):
        gates = T.alloc_buffer((dirs, gh), F32)
        for d in T.parallel(dirs):
            start(h, c, h0, c0, d)
            for s, b in T.grid(seq, batch):
                for jo in range(jo_n):
                    for ji in T.vectorized(v):
                        gates[d, jo * v + ji] = T.float32(0)
                for ko, jo in T.grid(hidden // unroll, jo_n):
                    for ji in T.vectorized(v):
                        gates[d, jo * v + ji] = gates[d, jo * v + ji] + coded_sum(h, rt, d, b, ko, jo * v + ji)
                for jo in range(jo_n):
                    for ji in T.vectorized(v):
                        gates[d, jo * v + ji] = (x[at(d, s), b, d * gh + jo * v + ji]
                                                 + scale[d, jo * v + ji] * gates[d, jo * v + ji])
                cell(x, gates, y, h, c, d, s, b)

    return _finish(coded)


def _split_lstm(seq: int, batch: int, hidden: int, dirs: int, reverse: bool) -> tirx.PrimFunc:
    """The float LSTM with each step split into :func:`parts_for` slices of hidden units (see the module): ``rt``
    in :func:`pack_split`'s layout; otherwise :func:`lstm_kernel`'s arguments."""
    parts, v = parts_for(hidden), lanes_for(hidden)
    hp, gh = hidden // parts, 4 * hidden
    at = _time(seq, dirs, reverse)

    @T.prim_func(private=True)
    def kernel(x: T.Buffer((seq, batch, dirs * gh), F32), rt: T.Buffer((dirs, parts, hidden, 4 * hp), F32),
               h0: T.Buffer((dirs, batch, hidden), F32), c0: T.Buffer((dirs, batch, hidden), F32),
               y: T.Buffer((seq, dirs, batch, hidden), F32), h: T.Buffer((dirs, batch, hidden), F32),
               c: T.Buffer((dirs, batch, hidden), F32)):
        gates = T.alloc_buffer((parts, 4 * hp), F32)  # each slice's gates: its thread's alone
        state = T.alloc_buffer((2, batch, hidden), F32)  # h of the step before (read) and of this step (written)
        with T.attr(0, "pragma_parallel_launch_point", 0):
            for d in range(dirs):
                with T.attr(0, "pragma_parallel_barrier_when_finish", 1):
                    for p in T.parallel(parts):
                        for b, j in T.grid(batch, hp):
                            state[0, b, p * hp + j] = h0[d, b, p * hp + j]
                            c[d, b, p * hp + j] = c0[d, b, p * hp + j]
                for s in range(seq):
                    with T.attr(0, "pragma_parallel_barrier_when_finish", 1):
                        for p in T.parallel(parts):
                            for b in range(batch):
                                for g, jo in T.grid(4, hp // v):
                                    for ji in T.vectorized(v):
                                        gates[p, g * hp + jo * v + ji] = x[at(d, s), b,
                                                                            d * gh + g * hidden + p * hp + jo * v + ji]
                                for k, jo in T.grid(hidden, 4 * hp // v):
                                    for ji in T.vectorized(v):
                                        gates[p, jo * v + ji] = (gates[p, jo * v + ji]
                                                                 + state[s % 2, b, k] * rt[d, p, k, jo * v + ji])
                                for jo in range(hp // v):
                                    for ji in T.vectorized(v):
                                        c[d, b, p * hp + jo * v + ji] = (
                                            sigmoid(gates[p, 2 * hp + jo * v + ji]) * c[d, b, p * hp + jo * v + ji]
                                            + sigmoid(gates[p, jo * v + ji]) * tanh(gates[p, 3 * hp + jo * v + ji]))
                                        state[(s + 1) % 2, b, p * hp + jo * v + ji] = (
                                            sigmoid(gates[p, hp + jo * v + ji]) * tanh(c[d, b, p * hp + jo * v + ji]))
                                        y[at(d, s), d, b, p * hp + jo * v + ji] = state[(s + 1) % 2, b,
                                                                                         p * hp + jo * v + ji]
                # each thread copies the units it computed: no other thread writes them before the next barrier
                for p in T.parallel(parts):
                    for b, j in T.grid(batch, hp):
                        h[d, b, p * hp + j] = state[seq % 2, b, p * hp + j]

    return _finish(kernel)


@functools.lru_cache(maxsize=64)
def gru_kernel(seq: int, batch: int, hidden: int, dirs: int = 1, reverse: bool = False,
               linear_before_reset: bool = False) -> tirx.PrimFunc:
    """``(x [seq, batch, D * 3H], rt [D, H, 3H], h0 [D, batch, H], rb_h [D, H]) -> (y [seq, D, batch, H],
    h [D, batch, H])``, ONNX's ``Y`` (layout 0) and ``Y_h``.

    ``linear_before_reset`` 0: ``h~ = tanh(x_h + (r * H) @ R_h^T)`` (``Rb_h`` is in ``x``); 1: ``h~ = tanh(x_h
    + r * (H @ R_h^T + Rb_h))``. Then ``H' = (1 - z) h~ + z H``."""
    v, zr, gh = lanes_for(hidden), 2 * hidden, 3 * hidden
    ho_n = hidden // v
    at = _time(seq, dirs, reverse)
    lbr = linear_before_reset

    @T.prim_func(private=True)
    def kernel(x: T.Buffer((seq, batch, dirs * gh), F32), rt: T.Buffer((dirs, hidden, gh), F32),
               h0: T.Buffer((dirs, batch, hidden), F32), rb: T.Buffer((dirs, hidden), F32),
               y: T.Buffer((seq, dirs, batch, hidden), F32), h: T.Buffer((dirs, batch, hidden), F32)):
        gates = T.alloc_buffer((dirs, gh), F32)  # H @ R^T: z, r, then h (only with linear_before_reset)
        rh = T.alloc_buffer((dirs, hidden), F32)  # r * H (linear_before_reset 0)
        for d in T.parallel(dirs):
            for b, j in T.grid(batch, hidden):
                h[d, b, j] = h0[d, b, j]
            for s, b in T.grid(seq, batch):
                for jo in range(3 * ho_n if lbr else 2 * ho_n):
                    for ji in T.vectorized(v):
                        gates[d, jo * v + ji] = T.float32(0)
                for k, jo in T.grid(hidden, 3 * ho_n if lbr else 2 * ho_n):
                    for ji in T.vectorized(v):
                        gates[d, jo * v + ji] = gates[d, jo * v + ji] + h[d, b, k] * rt[d, k, jo * v + ji]
                if not lbr:
                    for jo in range(ho_n):
                        for ji in T.vectorized(v):
                            rh[d, jo * v + ji] = sigmoid(x[at(d, s), b, d * gh + hidden + jo * v + ji]
                                                         + gates[d, hidden + jo * v + ji]) * h[d, b, jo * v + ji]
                    for jo in range(ho_n):
                        for ji in T.vectorized(v):
                            gates[d, zr + jo * v + ji] = x[at(d, s), b, d * gh + zr + jo * v + ji]
                    for k, jo in T.grid(hidden, ho_n):
                        for ji in T.vectorized(v):
                            gates[d, zr + jo * v + ji] = (gates[d, zr + jo * v + ji]
                                                          + rh[d, k] * rt[d, k, zr + jo * v + ji])
                for jo in range(ho_n):
                    for ji in T.vectorized(v):
                        h[d, b, jo * v + ji] = _gru_state(x, gates, rb, h, at(d, s), d, b, jo * v + ji, hidden, lbr)
                        y[at(d, s), d, b, jo * v + ji] = h[d, b, jo * v + ji]

    return _finish(kernel)


def _gru_state(x, gates, rb, h, t, d, b, j, hidden: int, linear_before_reset: bool):
    """``(1 - z) h~ + z H`` of direction ``d``'s hidden unit ``j`` (``gates`` holds ``H @ R^T``, or ``x_h + (r H)
    @ R_h^T`` in its h part with linear_before_reset 0)."""
    at = d * 3 * hidden  # the direction's columns of x
    z = sigmoid(x[t, b, at + j] + gates[d, j])
    if linear_before_reset:
        r = sigmoid(x[t, b, at + hidden + j] + gates[d, hidden + j])
        candidate = tanh(x[t, b, at + 2 * hidden + j] + r * (gates[d, 2 * hidden + j] + rb[d, j]))
    else:
        candidate = tanh(gates[d, 2 * hidden + j])
    zv = tirx.Var("z", F32)  # z is read twice: let-bound, so its exponential is not defined twice
    return tirx.Let(zv, z, (_c(1.0) - zv) * candidate + zv * h[d, b, j])
