"""The walk over a QDQ model's ``main`` that FuseQDQ's matchers share: bindings and their readers, the
parameters of quantize / dequantize calls, and the refusal that names why a chain stays float."""

from __future__ import annotations

import tvm
from tvm import relax

from ...quant.params import QuantParams, QuantParamsError
from ..utils import const_array

CODES = ("uint8", "int8")


class Refused(Exception):
    """A chain the INT8 kernels cannot compute; the message says why (recorded, never raised to callers)."""


def op_name(expr) -> str:
    op = getattr(expr, "op", None)
    return op.name if isinstance(op, tvm.ir.Op) else ""


def ints(values) -> list[int]:
    return [int(v) for v in values]


class Graph:
    """Bindings of ``main``: var -> (block index, bound value), and var -> the vars of the bindings reading it
    (None for the function's result)."""

    def __init__(self, func: relax.Function):
        self.bound: dict = {}
        self.users: dict = {}
        for index, block in enumerate(func.body.blocks):
            for binding in block.bindings:
                self.bound[binding.var] = (index, binding.value)
                for var in relax.analysis.free_vars(binding.value):
                    self.users.setdefault(var, []).append(binding.var)
        for var in relax.analysis.free_vars(func.body.body):
            self.users.setdefault(var, []).append(None)

    def value(self, expr):
        """The value bound to ``expr`` when it is a var of ``main``, else ``expr`` itself."""
        return self.bound[expr][1] if isinstance(expr, relax.Var) and expr in self.bound else expr

    def next_binding(self, var, anchor_name: str):
        """The one binding that reads ``var``, in the same block."""
        users = self.users.get(var, [])
        if None in users:
            raise Refused(f"{var.name} (inside the chain after {anchor_name}) is a model output")
        if len(users) != 1:
            raise Refused(f"{var.name} (inside the chain after {anchor_name}) is read by {len(users)} ops")
        if self.bound[users[0]][0] != self.bound[var][0]:
            raise Refused(f"{var.name} is read in another dataflow block")
        return users[0], self.bound[users[0]][1]


def qparams(call, dtype: str, what: str) -> QuantParams:
    """Per-tensor parameters of a quantize / dequantize call whose scale and zero point are constants."""
    scale, zero_point = const_array(call.args[1]), const_array(call.args[2])
    if scale is None or zero_point is None:
        raise Refused(f"{what}: scale or zero point is not a constant")
    if scale.size != 1 or zero_point.size != 1:
        raise Refused(f"{what}: quantized per channel (the kernels take per-tensor activations)")
    if dtype not in CODES:
        raise Refused(f"{what}: {dtype} codes (the kernels take uint8 or int8)")
    try:
        return QuantParams(float(scale.reshape(())), int(zero_point.reshape(())), dtype)
    except QuantParamsError as e:
        raise Refused(f"{what}: {e}") from None


def codes_of(graph: Graph, expr, what: str) -> tuple[relax.Var, QuantParams]:
    """(codes var, parameters) of ``expr`` = dequantize(codes var)."""
    call = graph.value(expr)
    if op_name(call) != "relax.dequantize" or not isinstance(call.args[0], relax.Var):
        raise Refused(f"{what} is not dequantized from codes")
    return call.args[0], qparams(call, str(call.args[0].ty.dtype), what)
