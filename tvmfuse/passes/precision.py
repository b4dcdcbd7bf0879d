"""fp16 precision: the graph computed in float16, its interface in float32.

:func:`ToFloat16` runs after canonicalization (batch-norm and scales are folded into the weights in float32
first, then rounded once) and before partitioning, so the partitions are the FP32 ones with float16 tensors:
every float32 constant becomes float16, each float32 input is cast once where it is first read, and each
output is cast back to float32, so a caller feeds and reads float32 as with an FP32 library. The kernels
accumulate in float32 (the anchor computes take ``out_dtype``, see ``tvmfuse.schedules.computes.partition``) and round
once, at their store.

Ops whose float16 result loses what a model relies on keep float32 (:data:`FLOAT32_OPS`): Softmax and the
normalizations (a sum of exponentials, a variance; a batch-norm the canonicalization could not fold into a
conv), and means and sums over a map (SE blocks pool 112x112
values, whose float16 sum may pass 65504). They read their input cast to float32 and their result is cast
back to float16. TensorRT's and PyTorch autocast's lists keep the same ops in float32.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

FLOAT16_MAX = float(np.finfo(np.float16).max)
FLOAT32_OPS = frozenset({"relax.nn.softmax", "relax.nn.log_softmax", "relax.nn.layer_norm", "relax.nn.group_norm",
                         "relax.nn.batch_norm", "relax.mean", "relax.sum", "relax.variance"})


def _float32_tensor(expr) -> bool:
    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"


def _float16_tensor(expr) -> bool:
    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float16"


@relax.expr_functor.mutator
class _Half(relax.PyExprMutator):
    def __init__(self, mod=None, params=()):
        super().__init__(mod)
        self.params = set(params)
        self.cast: dict = {}  # float32 parameter -> its float16 var

    def _emit(self, value, name: str):
        if self.builder_.current_block_is_dataflow():
            return self.builder_.emit_output(value, name)  # visible wherever the input is read
        return self.builder_.emit(value, name)

    def _half(self, arg):
        """A float32 parameter read as float16 (cast once); anything else as it is."""
        if isinstance(arg, relax.Var) and arg in self.params and _float32_tensor(arg):
            if arg not in self.cast:
                self.cast[arg] = self._emit(relax.op.astype(arg, "float16"), arg.name + "_fp16")
            return self.cast[arg]
        return arg

    def visit_generic_const_(self, const):
        if _float32_tensor(const):
            # Past float16's range a constant saturates instead of becoming infinite (an attention mask's
            # -1e9 stays a large negative number: exp of it is 0, where -inf - -inf would be NaN).
            value = np.clip(const.value.numpy(), -FLOAT16_MAX, FLOAT16_MAX)
            return relax.const(value.astype(np.float16), "float16")
        return const

    def visit_var_(self, var):
        return self._half(super().visit_var_(var))

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.astype" and _float32_tensor(call) \
                and str(getattr(call.args[0].ty, "dtype", "")) in ("int8", "uint8", "bool"):
            # 8-bit codes read as float (a dynamically quantized model's activations and zero points) and masks
            # (Magika's one-hot tokens, Equal -> Cast) join the float16 graph, exactly; wider integers (sums,
            # shapes) keep float32, which float16 may not hold.
            return relax.op.astype(call.args[0], "float16")
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.astype" and _float32_tensor(call) \
                and _float16_tensor(call.args[0]):
            return call.args[0]  # the model's own float -> float32 cast (Silero's): a no-op in the float16 graph
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip" and _float16_tensor(call.args[0]):
            # A clip with one open side is bounded by float32's largest value (CanonicalizeClip), which a
            # float16 clip cannot cast (TVM refuses the literal): bounds saturate like constants do.
            lo, hi = (min(max(float(getattr(b.value, "value", b.value)), -FLOAT16_MAX), FLOAT16_MAX)
                      for b in call.args[1:])
            return relax.op.clip(call.args[0], lo, hi)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir":
            return self._float32_kernel(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in FLOAT32_OPS:
            return call
        args = [self.builder_.emit(relax.op.astype(a, "float32")) if _float16_tensor(a) else a for a in call.args]
        kept = self.builder_.emit(relax.Call(call.op, args, call.attrs))
        if isinstance(kept.ty, relax.TupleType):  # batch_norm: its output, then its statistics
            fields = [self.builder_.emit(relax.TupleGetItem(kept, i)) for i in range(len(kept.ty.fields))]
            return relax.Tuple([relax.op.astype(f, "float16") if _float32_tensor(f) else f for f in fields])
        return relax.op.astype(kept, "float16") if _float32_tensor(kept) else kept

    def _float32_kernel(self, call):
        """A kernel the importer wrote itself (``call_tir`` of a float32 PrimFunc: a reflect ``Pad``) reads its
        float16 arguments cast to float32, and its float32 result is cast to float16."""
        args = call.args[1]
        if not isinstance(args, relax.Tuple) or not any(_float16_tensor(a) for a in args.fields):
            return call
        fields = [self.builder_.emit(relax.op.astype(a, "float32")) if _float16_tensor(a) else a for a in args.fields]
        kept = self.builder_.emit(relax.Call(call.op, [call.args[0], relax.Tuple(fields)] + list(call.args[2:]),
                                             call.attrs, call.ty_args))
        return relax.op.astype(kept, "float16") if _float32_tensor(kept) else kept


def _outputs_in_float32(func: relax.Function) -> relax.Function:
    """``func`` with its float16 outputs cast back to float32 (a tuple's fields one by one)."""
    body = func.body
    out = body.body
    fields = list(out.fields) if isinstance(out, relax.Tuple) else [out]
    bindings, results = [], []
    for index, field in enumerate(fields):
        if _float16_tensor(field):
            var = relax.Var(f"output{index}_fp32", relax.TensorType(field.ty.shape, "float32"))
            bindings.append(relax.VarBinding(var, relax.op.astype(field, "float32")))
            field = var
        results.append(field)
    if not bindings:
        return func
    tuple_out = isinstance(out, relax.Tuple)
    result = relax.Tuple(results) if tuple_out else results[0]
    ret = relax.TupleType([r.ty for r in results]) if tuple_out else results[0].ty
    seq = relax.SeqExpr(list(body.blocks) + [relax.BindingBlock(bindings)], result)
    return relax.Function(func.params, seq, ret, func.is_pure, func.attrs)


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.ToFloat16")
def ToFloat16(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    """Compute ``main`` in float16 with a float32 interface (see the module docstring)."""
    func = mod["main"]
    half = _Half(mod, func.params).visit_expr(func)
    mod["main"] = _outputs_in_float32(relax.analysis.remove_all_unused(half))
    return relax.transform.Normalize()(mod)

