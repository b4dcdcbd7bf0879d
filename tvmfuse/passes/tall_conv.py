"""TallConvToWide: a conv over a one-pixel-wide map runs over its height as a one-pixel-high map.

Exporters that write a 1-D conv as a 2-D one with a ``K x 1`` window put the sequence along the height
(jax2tf: Magika's ``[1, 256, 512, 1]`` input, a ``5 x 1`` window). tvmfuse's conv schedules take their
register tile and vectors along the output width (the CPU conv rules); a width of 1 left
one pixel per tile: Magika's 256 -> 512 conv ran at 86 GFLOP/s, 7.7 of its 9.0 ms on a Zen 4, where the same
conv laid along the width runs at the speed of any other. Here such a conv becomes ``reshape`` to
``[N, C, 1, H]`` -> the conv with the window, strides, padding and dilation turned a quarter (the weight
``[O, I, K, 1]`` read as ``[O, I, 1, K]``: the same memory) -> ``reshape`` back to ``[N, O, H', 1]``. Both
reshapes are free (the bytes do not move).

Runs after batch-norm and constant scales are folded into the conv's weight (they match the conv followed
directly by its batch norm); an epilogue after the conv (bias, activation) is then read through the reshape
and runs as its own elementwise kernel: one pass over the output, a small cost beside a conv that keeps one
pixel per tile.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmfuse.schedules.families import CONV2D, static_shape

from .utils import const_array, rewrite_call, rewrite_functions

_CONV = tvm.ir.Op.get(CONV2D.anchor_op)  # plain, grouped and depthwise alike


def is_tall(call) -> bool:
    """A plain NCHW conv with a constant weight whose input and window are one pixel wide, without width padding
    (its output is then one pixel wide too), over a map taller than one pixel."""
    a = call.attrs
    data, weight = static_shape(call.args[0]), static_shape(call.args[1])
    # the weight's type, not its value: reading a constant's value copies it (every conv of the model comes here)
    if data is None or weight is None or not isinstance(call.args[1], tvm.ir.expr.Constant):
        return False
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return False
    _, left, _, right = (int(p) for p in a.padding)
    return data[3] == 1 and weight[3] == 1 and data[2] > 1 and left == 0 and right == 0


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def visit_call_(self, call):
        return rewrite_call(super().visit_call_(call), {_CONV: self._widen})

    def _widen(self, call):
        if not is_tall(call):
            return None
        a = call.attrs
        n, c, h, _ = static_shape(call.args[0])
        o, i, k, _ = static_shape(call.args[1])
        out = static_shape(call)
        top, _, bottom, _ = (int(p) for p in a.padding)
        weight = const_array(call.args[1]).reshape(o, i, 1, k)
        data = self.builder_.emit(relax.op.reshape(call.args[0], (n, c, 1, h)))
        conv = self.builder_.emit(relax.op.nn.conv2d(
            data, relax.const(weight, str(weight.dtype)), strides=(1, int(a.strides[0])),
            padding=(0, top, 0, bottom), dilation=(1, int(a.dilation[0])), groups=int(a.groups),
            data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype=a.out_dtype))
        return relax.op.reshape(conv, out)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.TallConvToWide")
def TallConvToWide(mod, _ctx):
    return rewrite_functions(mod, _Widen)
