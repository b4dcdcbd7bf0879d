"""PadSoftmaxRows: a Softmax over a dense's columns runs over whole vectors.

A recognizer's CTC head is ``softmax(x @ W + b)`` over thousands of classes, and the class count seldom
divides into vectors: the x86 row kernel takes the largest lane count that divides the row
(``generic.row_lanes``), so PP-OCRv6's 6,906 classes ran in 6-lane vectors, 18,710 in 10-lane ones (which
LLVM splits) and 18,385 in 5-lane ones. PP-OCRv6 tiny rec spent 151 us of its ~2.8 ms in the Softmax, plus
36 us in the slice that ``PadDenseColumns`` puts between the dense and it.

The dense here writes ``n`` padded to a multiple of :data:`VECTOR` columns whose logits are ``-inf`` (zero
weight columns, a ``-inf`` bias), the Softmax runs over the padded rows, and the padding is sliced off after
it. A ``-inf`` logit changes nothing: it never wins the max, its exponential is exactly 0 (``fast_exp``
clamps its argument to -88.38, where the result's exponent bits are 0), so the sum and every real
probability are those of the unpadded row, up to the order of the sum's float additions.

Only rows that do not divide into 8-lane vectors (:func:`needs_padding`). Reshapes between the dense and the
Softmax, or right after it, that keep the last axis are redone on the padded width (the slice goes after
them). Not for INT8 graphs (calibration and
quantization): the ``-inf`` bias has no int32 code, and the dense's output statistics would see it.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvmfuse.schedules.families import DENSE, static_shape

from .utils import bindings_of, const_array, op_name, users_of

VECTOR = 16  # AVX-512's float lanes (two of AVX2's)
MIN_WIDTH = 4 * VECTOR  # narrower rows: the padding's share of the work outweighs whole vectors
_MATMUL = DENSE.anchor_op


def needs_padding(n: int) -> bool:
    """True for a row of ``n`` that does not divide into AVX2's 8-lane vectors (1,000 classes do, and keep
    their dense, its kernel and its tuning records)."""
    return n >= MIN_WIDTH and n % (VECTOR // 2) != 0


def _ints(expr) -> list[int] | None:
    """A tuple argument's ints (``strided_slice``'s axes, begin, end, strides); None when one is not constant."""
    try:
        return [int(getattr(field, "value", field)) for field in expr.fields]
    except (AttributeError, TypeError):
        return None


def _slice_width(call) -> int | None:
    """The kept width of a ``strided_slice`` that keeps the first columns of a 2-D tensor's last axis."""
    shape = static_shape(call.args[0])
    if shape is None or len(shape) != 2:
        return None
    axes, begin, end = (_ints(arg) for arg in call.args[1:4])
    strides = _ints(call.args[4]) if len(call.args) > 4 else [1]
    if axes not in ([1], [-1]) or begin != [0] or strides != [1] or end is None:
        return None
    return end[0]


class _Head:
    """The chain ``matmul(x, W) [+ b] [-> strided_slice] [-> reshape ...] -> softmax``, read back from the
    Softmax through vars that have no other reader."""

    def __init__(self, values: dict, users: dict, softmax):
        self.ok = False
        shape = static_shape(softmax)
        axis = int(softmax.attrs.axis)
        if shape is None or axis not in (-1, len(shape) - 1) or str(softmax.ty.dtype) != "float32":
            return
        self.width, self.reshapes = shape[-1], []
        value = self._value(softmax.args[0], values, users)
        while op_name(value) == "relax.reshape":
            out, src = static_shape(value), static_shape(value.args[0])
            if out is None or src is None or out[-1] != self.width or src[-1] != self.width:
                return
            self.reshapes.append(out)
            value = self._value(value.args[0], values, users)
        if op_name(value) == "relax.strided_slice":
            if _slice_width(value) != self.width:
                return
            value = self._value(value.args[0], values, users)
        self.bias = None
        if op_name(value) == "relax.add":
            self.bias = const_array(value.args[1])
            if self.bias is None or self.bias.size != self.bias.shape[-1]:
                return
            value = self._value(value.args[0], values, users)
        if op_name(value) != _MATMUL:
            return
        self.x, self.weight, self.out_dtype = value.args[0], const_array(value.args[1]), value.attrs.out_dtype
        xs = static_shape(self.x)
        if self.weight is None or self.weight.ndim != 2 or xs is None or len(xs) != 2:
            return
        if self.weight.shape[1] < self.width or (self.bias is not None and self.bias.size < self.width):
            return
        self.ok = needs_padding(self.width) and self.weight.dtype == np.float32

    @staticmethod
    def _value(var, values: dict, users: dict):
        """The value bound to ``var`` when the chain is its only reader; None otherwise."""
        if not isinstance(var, relax.Var) or len(users.get(var, ())) != 1:
            return None
        return values.get(var)

    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """The weight and bias over the padded width: zero weight columns, ``-inf`` bias."""
        n, m = self.width, -(-self.width // VECTOR) * VECTOR
        weight = np.zeros((self.weight.shape[0], m), np.float32)
        weight[:, :n] = self.weight[:, :n]
        bias = np.full(m, -np.inf, np.float32)
        bias[:n] = 0 if self.bias is None else self.bias.reshape(-1)[:n]
        return weight, bias


@relax.expr_functor.mutator
class _Pad(relax.PyExprMutator):
    def __init__(self, mod, values: dict, users: dict):
        super().__init__(mod)
        self._values, self._users = values, users
        self._slices = []  # (the slice after a padded Softmax, the Softmax's padded input, the kept width)

    def visit_call_(self, call):
        new = super().visit_call_(call)
        if op_name(call) == "relax.reshape":
            moved = self._reshape(call, new)
            return new if moved is None else moved
        if op_name(call) != "relax.nn.softmax":
            return new
        head = _Head(self._values, self._users, call)
        if not head.ok:
            return new
        weight, bias = head.padded()
        emit = self.builder_.emit
        out = emit(relax.op.matmul(self.visit_expr(head.x), relax.const(weight), out_dtype=head.out_dtype))
        out = emit(relax.op.add(out, relax.const(bias)))
        for shape in reversed(head.reshapes):
            out = emit(relax.op.reshape(out, list(shape[:-1]) + [weight.shape[1]]))
        return self._softmax(out, head.width)

    def _softmax(self, logits, width: int):
        """The Softmax of the padded ``logits`` along their last axis, sliced to ``width``."""
        padded = self.builder_.emit(relax.op.nn.softmax(logits, axis=-1))
        rank = len(static_shape(padded))
        sliced = relax.op.strided_slice(padded, axes=[rank - 1], begin=[0], end=[width])
        self._slices.append((sliced, logits, width))
        return sliced

    def _reshape(self, call, new):
        """A reshape that keeps the last axis, of a padded Softmax's slice that nothing else reads: done on the
        Softmax's input instead, so that the Softmax kernel (the slice inlined into it) writes the reshaped
        tensor itself. That is a model's output, which has storage of its own: a copy kernel otherwise
        (1.1 MB for PP-OCRv6 tiny rec's head, 3 MB for rec small's)."""
        shape, src = static_shape(call), new.args[0]
        if shape is None or not isinstance(src, relax.Var) or len(self._users.get(call.args[0], ())) != 1:
            return None
        value = self.lookup_binding(src)
        for sliced, logits, width in self._slices:
            if value is not None and value.same_as(sliced) and shape[-1] == width:
                m = static_shape(logits)[-1]
                return self._softmax(self.builder_.emit(relax.op.reshape(logits, list(shape[:-1]) + [m])), width)
        return None


@tvm.transform.module_pass(opt_level=0, name="PadSoftmaxRows")
def PadSoftmaxRows(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            values = {b.var: b.value for b in bindings_of(func)}
            rewritten = _Pad(mod, values, users_of(func)).visit_expr(func)
            mod[gv] = relax.analysis.remove_all_unused(rewritten)
    return mod
