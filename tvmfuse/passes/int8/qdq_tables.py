"""FuseQDQ: the elementwise ops after a QDQ kernel's quantize, their own quantize / dequantize pairs
included, as a table of output codes.

ONNX Runtime's quantizer puts a QuantizeLinear / DequantizeLinear pair after nearly every op. An activation it
has no QLinear op for (a hardswish spelt ``x * clip(x + 3, 0, 6) / 6``, a sigmoid gate, a LeakyReLU) is
then a run of float ops with requantizations between them ::

    y codes -> dequantize -> add 3 -> quantize -> dequantize -> multiply (by y) -> quantize -> dequantize
            -> divide by 6 -> quantize -> z codes

Every value in it is a function of one code of ``y``, so ``z`` is a 256-entry table of ``y``'s codes. The
kernel writing ``y`` writes ``table[y]`` instead (:class:`.kernels.OutputTable`, the epilogue tvmfuse's own
quantization uses for such activations), and the run's kernels, quantizes and dequantizes go: in
PP-OCR's direction classifier quantized by ONNX Runtime they were a third of the time.

The table is the run evaluated op by op in float32 on the 256 codes, as ONNX defines the float ops and
QuantizeLinear (``saturate(round_half_even(x / scale) + zero_point)``) and as the float path computes it;
a run where the float path could fuse a multiply and an add into one rounding may differ from it by a code
next to a rounding tie.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax

from tvmfuse.schedules.computes.int8_epilogue import QUANT_RANGE

from .kernels import OutputTable
from .match import short_op_name
from .tables import apply_op, takes_op
from ..utils import const_array

LOOKAHEAD = 8  # bindings that do not read the run, skipped while looking for its next op
_QDQ = ("relax.quantize", "relax.dequantize")


def _name(call) -> str | None:
    return call.op.name if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None


def _params(call) -> tuple[np.float32, int, str] | None:
    """(scale, zero point, codes dtype) of a per-tensor quantize / dequantize with constant parameters."""
    scale, zero_point = const_array(call.args[1]), const_array(call.args[2])
    if scale is None or zero_point is None or scale.size != 1 or zero_point.size != 1:
        return None
    codes = str(call.attrs.out_dtype) if _name(call) == "relax.quantize" else str(call.args[0].ty.dtype)
    if codes not in QUANT_RANGE:
        return None
    return np.float32(scale.reshape(())), int(zero_point.reshape(())), codes


def _quantize(x: np.ndarray, scale, zero_point: int, codes: str) -> np.ndarray:
    lo, hi = QUANT_RANGE[codes]
    return np.clip(np.rint(x / scale) + np.float32(zero_point), lo, hi).astype(np.float32)


def _dequantize(q: np.ndarray, scale, zero_point: int) -> np.ndarray:
    return ((q - np.float32(zero_point)) * scale).astype(np.float32)


def _scalar(graph, expr) -> np.float32 | None:
    """A scalar operand's value: a float constant, or the dequantize of a constant code (how ONNX Runtime
    quantizes the 3 of a hardswish)."""
    value = graph.value(expr)
    if _name(value) == "relax.dequantize":
        params, codes = _params(value), const_array(value.args[0])
        if params is None or codes is None or codes.size != 1:
            return None
        return _dequantize(codes.reshape(()).astype(np.float32), params[0], params[1])
    array = const_array(value)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return np.float32(array.reshape(()))


def _evaluate(graph, call, env: dict):
    """The float32 value of ``call`` over ``env`` (run vars -> arrays), or None when it is not an op this
    module evaluates over them: a per-tensor quantize / dequantize, or an op :mod:`.tables` evaluates, its
    scalars constants or dequantized constants."""
    name = _name(call)
    if name is None or not any(isinstance(a, relax.Var) and a in env for a in call.args):
        return None
    if name in _QDQ:
        params = _params(call)
        if params is None or not (isinstance(call.args[0], relax.Var) and call.args[0] in env):
            return None
        x = env[call.args[0]]
        return _quantize(x, *params) if name == "relax.quantize" else _dequantize(x, *params[:2])
    scalar = functools.partial(_scalar, graph)
    if not takes_op(call, env, scalar):
        return None
    return np.asarray(apply_op(call, env, scalar), np.float32)


def _run(graph, start) -> list:
    """The bindings after ``start`` (in its block, in order) that read it or one another, each with its
    value on the 256 codes: ``[(var, call, value)]``, stopping at the first op this module cannot evaluate."""
    index, _ = graph.bound[start]
    block = [v for v, (i, _) in graph.bound.items() if i == index]
    codes = QUANT_RANGE[str(start.ty.dtype)]
    env = {start: np.arange(codes[0], codes[1] + 1, dtype=np.float32)}
    taken, idle = [], 0
    for var in block[block.index(start) + 1:]:
        call = graph.bound[var][1]
        if not any(isinstance(a, relax.Var) and a in env for a in relax.analysis.free_vars(call)):
            idle += 1
            if idle > LOOKAHEAD:
                break
            continue
        with np.errstate(all="ignore"):
            value = _evaluate(graph, call, env)
        if value is None:
            break
        env[var] = np.broadcast_to(value, env[start].shape)
        taken.append((var, call, env[var]))
        idle = 0
    return taken


def output_table(graph, start, out_dtype: str) -> tuple[relax.Var, OutputTable] | None:
    """``(end, table)``: the longest run after the codes ``start`` (a kernel's quantize, read by nothing else)
    ending in a quantize to ``out_dtype`` codes whose result is the only value of the run read outside it;
    ``table`` gives that result's code for each code of ``start``. None when there is no such run.

    ``graph``: FuseQDQ's view of ``main`` (``bound``: var -> (block, value); ``users``: var -> reading vars,
    None for the function's result; ``value(expr)``)."""
    taken = _run(graph, start)
    for n in range(len(taken), 0, -1):
        end, call, codes = taken[n - 1]
        if _name(call) != "relax.quantize" or str(call.attrs.out_dtype) != out_dtype:
            continue
        inside = {start} | {var for var, _, _ in taken[:n]}
        leaving = [v for v in inside if any(u is None or u not in inside for u in graph.users.get(v, [None]))]
        if leaving != [end] or not np.all(np.isfinite(codes)):
            continue
        ops = tuple(short_op_name(c.op.name) for _, c, _ in taken[:n] if _name(c) not in _QDQ)
        if not ops:
            return None  # a requantize alone: the kernel's own quantize would do (not a table's business)
        return end, OutputTable(codes.astype(out_dtype), ops)
    return None
