"""Small helpers shared by the graph passes."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

# A PrimFunc's relax op_pattern: AnnotateTIROpPattern leaves a func with op_pattern set alone, and kOpaque
# keeps FuseOps from merging neighbours into the kernel (its epilogue is already inside).
OPAQUE = 8


def const_array(expr) -> np.ndarray | None:
    """The numpy value of a Relax constant, or None when ``expr`` is not a constant."""
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    return None


def float_scalar(value: np.ndarray | None) -> float | None:
    """The value of a one-element float array (a scalar constant's), or None for anything else."""
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(()))


def commuted(op: str, a, b):
    """The DPL pattern ``op(a, b)`` in either operand order (for commutative ops)."""
    from tvm.relax.dpl import is_op

    return is_op(op)(a, b) | is_op(op)(b, a)


def op_name(expr) -> str | None:
    """The operator name of a call to a Relax op; None for anything else."""
    return getattr(getattr(expr, "op", None), "name", None)


def bound_call(expr, op: str, lookup):
    """``expr`` (or the value ``lookup`` gives for it, a variable) when it is a call to ``op``, else None."""
    if isinstance(expr, relax.Var):
        expr = lookup(expr)
    return expr if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == op else None


def bindings_of(func) -> list:
    """Every binding of a Relax function's body, block after block."""
    return [binding for block in func.body.blocks for binding in block.bindings]


def called_ops(mod) -> set[str]:
    """The names of the Relax ops the Relax functions of ``mod`` call, in nested bodies (a branch, a local
    function) too: a scan of the bindings' values, for the partition table's filter and for a Python rewrite to
    skip a module that lacks its ops (a visit costs 20-50 ms a model)."""
    found: set[str] = set()
    todo = [func.body for func in mod.functions.values() if isinstance(func, relax.Function)]
    while todo:
        expr = todo.pop()
        if isinstance(expr, relax.SeqExpr):
            todo += [binding.value for block in expr.blocks for binding in block.bindings] + [expr.body]
        elif isinstance(expr, relax.expr.If):
            todo += [expr.true_branch, expr.false_branch]
        elif isinstance(expr, relax.expr.Function):
            todo.append(expr.body)
        elif isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            found.add(expr.op.name)
    return found


def users_of(func) -> dict:
    """Var -> the vars of the bindings that read it; None stands for the function's result."""
    users: dict = {}
    for binding in bindings_of(func):
        for var in relax.analysis.free_vars(binding.value):
            users.setdefault(var, []).append(binding.var)
    for var in relax.analysis.free_vars(func.body.body):
        users.setdefault(var, []).append(None)
    return users


def rewrite_functions(mod, mutator_class):
    """Run every Relax function of ``mod`` through a fresh ``mutator_class(mod)`` (a ``PyExprMutator``) and
    drop the bindings the rewrite left unused; PrimFuncs stay as they are. Returns ``mod``, updated."""
    from tvm import relax

    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = relax.analysis.remove_all_unused(mutator_class(mod).visit_expr(func))
    return mod


def rewrite_call(call, handlers: dict):
    """``handlers[call.op](call)`` (a rewritten expression, or None to keep ``call``) for the ops the mutator
    rewrites; ``call`` itself for every other op. The ``visit_call_`` body of the graph passes."""
    handler = handlers.get(call.op)
    new = handler(call) if handler is not None else None
    return call if new is None else new


def emit_like(builder, value, like, suffix: str = "", inputs=()):
    """Emit ``value`` named after ``like`` (the var it stands for) + ``suffix``; as a block output when ``like``
    is one (not a DataflowVar, not one of ``inputs``, the function's parameters), so that it stays visible
    wherever ``like`` was."""
    from tvm import relax

    name = like.name + suffix
    if builder.current_block_is_dataflow() and not isinstance(like, relax.DataflowVar) and like not in inputs:
        return builder.emit_output(value, name)
    return builder.emit(value, name)


def add_kernel(builder, func, name: str):
    """Add PrimFunc ``func`` to ``builder``'s module as ``name`` + ``_`` + 6 hex digits of its structural hash;
    return its GlobalVar (that of an equal function already there, as ``add_func`` dedups).

    The name follows the kernel alone. Numbered names (``tvmfuse_conv2d_relu5``) count the kernels of a kind
    before it, so a model with one layer changed renamed every later kernel of that kind, and a kernel's
    object, whose symbol is its name, was built again though its code was the same."""
    from .kernel_names import with_digest

    return builder.add_func(func, with_digest(name, func))
