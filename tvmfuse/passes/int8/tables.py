"""Elementwise ops after an INT8 kernel as a table of output codes (``QuantizeGraph``).

An activation no INT8 epilogue computes (SiLU spelt ``x * sigmoid(x)``, GELU, sigmoid, LeakyReLU, ...) is left
out of its conv's partition when a model is quantized (``patterns.table(int8=True)``). Its INT8 readers then
took a float32 output from the conv, an elementwise kernel for the activation and a quantize: the conv
wrote four bytes per value, NCHW, and the codes came back in another pass. When such a chain of elementwise
ops reads nothing but the kernel's output and scalar constants, and both its input (the partition's output)
and its result (an INT8 partition's input) have calibrated ranges, the chain is a function of one uint8
code: the kernel requantizes to the input's parameters and writes ``table[code]``, the result's code,
computed here in float64 for the 256 codes (:func:`output_table`). Nothing is lost that the INT8 readers
did not already round away, except that the activation now reads its input at 8 bits, as in a QDQ model
(``Q -> DQ -> SiLU -> Q``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tvm
from tvm import relax

from ...quant.params import QuantParams
from .kernels import OutputTable
from .match import clip_bounds, short_op_name
from ..utils import bindings_of, const_array, float_scalar

_erf = np.frompyfunc(math.erf, 1, 1)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # 1 / (1 + exp(-x)) without overflow


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# One-argument ops: the argument is the chain's value.
_UNARY = {
    "relax.sigmoid": _sigmoid, "relax.tanh": np.tanh, "relax.exp": np.exp, "relax.negative": np.negative,
    "relax.abs": np.abs, "relax.erf": lambda x: _erf(x).astype(np.float64),
    "relax.nn.relu": lambda x: np.maximum(x, 0.0), "relax.nn.silu": lambda x: x * _sigmoid(x),
    "relax.nn.gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64)),
    "relax.nn.gelu_tanh": _gelu_tanh,
}
# Two-operand ops: chain values or scalar constants, broadcast.
_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply, "relax.divide": np.divide,
           "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.power": np.power}
LOOKAHEAD = 8  # bindings that do not read the chain, skipped while looking for its next op


@dataclasses.dataclass(frozen=True)
class Chain:
    """Elementwise bindings after an INT8 partition's output ``start``, ending in ``end``."""

    start: relax.Var
    end: relax.Var
    bindings: tuple  # relax.VarBinding, in order

    @property
    def vars(self) -> set:
        return {b.var for b in self.bindings}

    @property
    def ops(self) -> tuple:
        return tuple(short_op_name(b.value.op.name) for b in self.bindings)

    def evaluate(self, values: np.ndarray) -> np.ndarray:
        """The chain's result for ``start`` = ``values`` (float64)."""
        env = {self.start: values}
        for binding in self.bindings:
            env[binding.var] = apply_op(binding.value, env)
        return env[self.end]


def _scalar(expr) -> float | None:
    return float_scalar(const_array(expr))


def _operands(call, env, scalar) -> list | None:
    """The call's tensor operands as chain values or scalars (``scalar(expr)``: the value, or None); None when
    one is neither."""
    values = []
    for arg in call.args:
        if isinstance(arg, relax.Var) and arg in env:
            values.append(env[arg])
        elif (value := scalar(arg)) is not None:
            values.append(value)
        else:
            return None
    return values


def apply_op(call, env, scalar=_scalar):
    """The value of ``call`` (an op :func:`takes_op` accepts) over ``env`` (chain vars -> arrays), its scalar
    operands read by ``scalar`` (default: float constants)."""
    name = call.op.name
    if name == "relax.clip":
        lo, hi = clip_bounds(call)
        return np.clip(env[call.args[0]], -np.inf if lo is None else lo, np.inf if hi is None else hi)
    if name == "relax.nn.leakyrelu":
        x = env[call.args[0]]
        return np.where(x >= 0, x, x * float(call.attrs.alpha))
    values = _operands(call, env, scalar)
    return (_UNARY[name] if name in _UNARY else _BINARY[name])(*values)


def takes_op(call, region, scalar=_scalar) -> bool:
    """Whether ``call`` is an op this module evaluates, over chain values (at least one, in ``region``) and
    scalars (read by ``scalar``, as in :func:`apply_op`)."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    name = call.op.name
    reads = [a for a in call.args if isinstance(a, relax.Var) and a in region]
    if not reads:
        return False
    if name in ("relax.clip", "relax.nn.leakyrelu") or name in _UNARY:
        return len(call.args) >= 1 and isinstance(call.args[0], relax.Var) and call.args[0] in region \
            and (name != "relax.clip" or len(call.args) == 3)
    if name in _BINARY:
        return len(call.args) == 2 and _operands(call, dict.fromkeys(region, 0.0), scalar) is not None
    return False


def find_chains(func: relax.Function, starts: set, users: dict) -> dict:
    """``start var -> Chain`` for each of ``starts`` (INT8 partition outputs) read only by a chain of
    elementwise ops with one result (``users``: :func:`passes.utils.users_of` of ``func``)."""
    bindings = bindings_of(func)
    position = {b.var: i for i, b in enumerate(bindings)}
    block_of = {b.var: n for n, block in enumerate(func.body.blocks) for b in block.bindings}
    chains = {}
    for start in starts:
        region, taken, idle = {start}, [], 0
        for binding in bindings[position[start] + 1:] if start in position else ():
            if block_of[binding.var] != block_of[start]:
                break  # the kernel's codes replace the chain where it was: one block
            if not any(isinstance(a, relax.Var) and a in region for a in relax.analysis.free_vars(binding.value)):
                idle += 1
                if idle > LOOKAHEAD:
                    break
                continue
            if not takes_op(binding.value, region):
                break
            region.add(binding.var)
            taken.append(binding)
            idle = 0
        exits = [v for v in region if any(u not in region for u in users.get(v, [None]))]
        if taken and len(exits) == 1 and exits[0] is not start:  # the last op's var: the others feed the chain
            chains[start] = Chain(start, exits[0], tuple(taken))
    return chains


def output_table(chain: Chain, before: QuantParams, after: QuantParams) -> OutputTable | None:
    """The codes of ``chain.end`` (quantized with ``after``) for every code of ``chain.start`` (``before``);
    None when the chain is not finite over ``before``'s range."""
    codes = np.arange(256, dtype=np.float64) if before.dtype == "uint8" else np.arange(-128, 128, dtype=np.float64)
    with np.errstate(all="ignore"):
        values = chain.evaluate(float(before.scale) * (codes - int(before.zero_point)))
    values = np.broadcast_to(np.asarray(values, np.float64), codes.shape)
    if not np.all(np.isfinite(values)):
        return None
    lo, hi = (0, 255) if after.dtype == "uint8" else (-128, 127)
    out = np.clip(np.rint(values / float(after.scale)) + int(after.zero_point), lo, hi)
    return OutputTable(out.astype(after.dtype), chain.ops)
