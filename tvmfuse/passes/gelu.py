"""FuseGeluTanh: GELU's tanh form, spelt out, becomes one ``relax.nn.gelu_tanh``.

``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` is what torch's legacy exporter writes for
``gelu(approximate="tanh")`` (``x * (x * x)`` for the cube), what TensorFlow/Keras graphs hold (``Pow(x, 3)``),
and, regrouped as ``tanh(c1 x + c2 x^3)``, onnxruntime's ``FastGelu``. Spelt out it is a chain of nine or
ten elementwise ops that no partition pattern takes whole, with a libm ``tanhf`` per element; as one op it is
an epilogue of its conv or dense (``patterns.builders``: the ``gelu`` entries), computed by
``schedules.activations.gelu_tanh``.

The constants are checked, not assumed: the rewrite changes nothing a float32 model can tell apart
(each within 2e-6 relative of its exact value; ``0.5`` may be ``/ 2``). Every operand order is matched.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from tvmfuse.schedules.computes.activations import TANH_BETA, TANH_KAPPA

from .utils import commuted, const_array, float_scalar

_RTOL = 2e-6


def _pattern():
    """The pattern and its constants, each paired with the value it must hold."""
    x = wildcard()
    kappa, beta, beta_x, kappa_beta, three, one, half, two = (is_const() for _ in range(8))
    cube = (commuted("relax.multiply", x, commuted("relax.multiply", x, x))
            | is_op("relax.power")(x, three))
    inner = commuted("relax.multiply", beta, commuted("relax.add", x, commuted("relax.multiply", kappa, cube)))
    fast = commuted("relax.add", commuted("relax.multiply", beta_x, x), commuted("relax.multiply", kappa_beta, cube))
    one_plus = commuted("relax.add", is_op("relax.tanh")(inner | fast), one)
    product = commuted("relax.multiply", x, one_plus)
    root = (commuted("relax.multiply", product, half) | is_op("relax.divide")(product, two)
            | commuted("relax.multiply", commuted("relax.multiply", x, half), one_plus))
    values = {kappa: TANH_KAPPA, beta: TANH_BETA, beta_x: TANH_BETA, kappa_beta: TANH_KAPPA * TANH_BETA,
              three: 3.0, one: 1.0, half: 0.5, two: 2.0}
    return root, x, values


def _rewrite(matched, m, x, values):
    if str(matched.ty.dtype) != "float32" or str(m[x].ty.dtype) != "float32":
        return matched
    for pattern, exact in values.items():
        if pattern in m:
            got = float_scalar(const_array(m[pattern]))
            if got is None or not np.isclose(got, exact, rtol=_RTOL, atol=0.0):
                return matched
    return relax.op.nn.gelu_tanh(m[x])


@tvm.transform.module_pass(opt_level=0, name="FuseGeluTanh")
def FuseGeluTanh(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass naming
    """Rewrite every spelt-out tanh-form GELU of float32 values into ``relax.nn.gelu_tanh``."""
    root, x, values = _pattern()
    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = relax.dpl.rewrite_call(root, lambda e, m: _rewrite(e, m, x, values), func)
    return relax.transform.DeadCodeElimination()(out)
