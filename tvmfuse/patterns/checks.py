"""Checks run on each pattern match: which anchor family it is, and whether fusing is legal.

A check returns False to leave the ops unfused; given a ``rejections`` dict it records why there
(anchor var name -> reason), so the partition report can say why an op stayed out.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.transform import PatternCheckContext

from tvmfuse.schedules.families import FAMILIES, family_of, static_shape


def _reject(ctx: PatternCheckContext, reason: str, rejections: dict | None) -> bool:
    if rejections is not None:
        root = ctx.annotated_expr["root"]
        var = ctx.value_to_bound_var.get(root)
        if var is not None:
            rejections.setdefault(var.name, reason)
    return False


def _leaks(ctx: PatternCheckContext) -> str | None:
    """Name of an intermediate value of the match that is also used outside it, if any.

    A non-dataflow var is an output of its dataflow block (returned or used after it), so it leaks too.
    """
    inside = set(ctx.matched_bindings.keys())
    root_var = ctx.value_to_bound_var.get(ctx.matched_expr)
    for var in inside:
        if root_var is not None and var.same_as(root_var):
            continue
        users = ctx.var_usages.get(var, [])
        if not isinstance(var, relax.DataflowVar) or any(u not in inside for u in users):
            return var.name
    return None


def _ancestors(var, bindings: dict) -> set:
    """All vars ``var`` is computed from (through the function's bindings)."""
    seen, stack = set(), [var]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        value = bindings.get(v)
        if value is not None:
            stack.extend(relax.analysis.free_vars(value))
    return seen


def _check_residual(ctx: PatternCheckContext, rejections) -> bool:
    """Add-to-output legality (OneFlow's FuseAddToOutput rules)."""
    residual, producer = ctx.annotated_expr["residual"], ctx.annotated_expr["producer"]
    add = ctx.annotated_expr["residual_add"]
    shapes = {static_shape(residual), static_shape(producer), static_shape(add)}
    if len(shapes) != 1 or residual.ty.dtype != producer.ty.dtype:
        return _reject(ctx, f"residual add: operand shape {static_shape(residual)} {residual.ty.dtype} differs from "
                            f"the conv output {static_shape(producer)} {producer.ty.dtype} (broadcast add)", rejections)
    # The matcher hands over bound values; the var they are bound to is what the bindings refer to.
    residual_var = residual if isinstance(residual, relax.Var) else ctx.value_to_bound_var.get(residual)
    if residual_var is not None:
        bindings = {v: e for e, v in ctx.value_to_bound_var.items()}
        anchor = ctx.value_to_bound_var.get(ctx.annotated_expr["root"])
        if anchor is not None and anchor in _ancestors(residual_var, bindings):
            return _reject(ctx, "residual add: the other operand depends on the conv itself (cycle)", rejections)
    return True


def check_fused(ctx: PatternCheckContext, family: str, rejections: dict | None = None,
                dtype: str = "float32", scalar_affine: bool = False) -> bool:
    """The check for every table entry: anchor family, dtype (``dtype``: the build's; float16 only in an fp16
    build, whose kernels accumulate in float32) and layout support, no leak, legal residual; a scale and shift
    after the activation that broadcast into the output (``scalar_affine``, the INT8 table's: single values)."""
    root = ctx.annotated_expr["root"]
    found = root.ty.dtype
    if found != dtype or any(a.ty.dtype != found for a in root.args):
        return _reject(ctx, f"dtype {found} not supported by the {family} kernels", rejections)
    if family_of(root).pattern != family:
        return False  # another family's entry takes it (and says why it refuses, if it does)
    why = FAMILIES[family].anchor_check(root)
    if why is not None:
        return _reject(ctx, why, rejections)
    if "residual" in ctx.annotated_expr and is_constant(ctx.annotated_expr["residual"]):
        return False  # a constant added to the output is a bias: the non-residual entries take it
    leak = _leaks(ctx)
    if leak is not None:
        return _reject(ctx, f"intermediate {leak} is also used outside the group", rejections)
    if "residual" in ctx.annotated_expr and not _check_residual(ctx, rejections):
        return False
    if "scale" in ctx.annotated_expr and not _check_affine(ctx, rejections, scalar_affine):
        return False
    return True


def _check_affine(ctx: PatternCheckContext, rejections, scalar: bool = False) -> bool:
    """A scale and shift after the activation: float constants that broadcast into the anchor's output shape
    without widening it (the kernel writes the anchor's shape); ``scalar``: one value each."""
    out = static_shape(ctx.annotated_expr["root"])
    for role in ("scale", "shift"):
        const = ctx.annotated_expr[role]
        shape = static_shape(const)
        if scalar and shape is not None and any(d != 1 for d in shape):
            return _reject(ctx, f"the {role} after the activation, {shape}, is not one value: an INT8 epilogue "
                                "takes a single scale and shift", rejections)
        if const.ty.dtype != ctx.matched_expr.ty.dtype or shape is None or out is None or len(shape) > len(out) \
                or any(d not in (1, o) for d, o in zip(reversed(shape), reversed(out))):
            return _reject(ctx, f"the {role} after the activation, {shape} {const.ty.dtype}, does not broadcast "
                                f"into the conv or dense output {out} {ctx.matched_expr.ty.dtype}", rejections)
    return True


def is_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.Constant)
