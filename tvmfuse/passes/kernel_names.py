"""Kernel names that follow the kernel alone, for the kernels TVM's legalization and fusion make.

tvmfuse's own kernels are named by :func:`tvmfuse.passes.utils.add_kernel` (their kind and a digest of their
code). TVM numbers the PrimFuncs it makes (``max1``, ``fused_cast16_reshape12_multiply``): the numbers count
the functions of a name made before, so one changed layer renames every later kernel of its kinds, and each
renamed kernel's object (its symbol is its name) missed the kernel cache though its code was the same.
:func:`StableKernelNames` renames them ``<name without its numbers>_<6 hex digits of the kernel's structural
hash>`` and updates every call.
"""

from __future__ import annotations

import re

STABLE = re.compile(r"_[0-9a-f]{6}\d*$")  # add_kernel's names (a digit more where two digests met)
_NUMBER = re.compile(r"(?<=[a-z])\d+(?=_|$)")  # a number TVM appends to a name part: cast16, max1 (not conv2d)


def kind(name: str) -> str:
    """A kernel's name without its digest: what kernels of one kind share (``tvmfuse_conv2d_relu``)."""
    return STABLE.sub("", name)


def with_digest(name: str, func) -> str:
    """``name`` + ``_`` + 6 hex digits of ``func``'s structural hash (its code: names and symbol aside)."""
    import tvm_ffi

    return f"{name}_{tvm_ffi.structural_hash(func.without_attr('global_symbol')) % (1 << 24):06x}"


def stable_name(name: str, func) -> str:
    return with_digest(_NUMBER.sub("", name), func)


def StableKernelNames():
    """A module pass: every PrimFunc not named by :func:`~tvmfuse.passes.utils.add_kernel` renamed by
    :func:`stable_name` (its ``global_symbol`` too), and every Relax function's references to it."""
    import tvm
    from tvm import relax, tirx

    @tvm.transform.module_pass(opt_level=0, name="tvmfuse.StableKernelNames")
    def _pass(mod, _ctx):
        taken = {gv.name_hint for gv in mod.get_global_vars()}
        renamed = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or STABLE.search(gv.name_hint):
                continue
            name = base = stable_name(gv.name_hint, func)
            suffix = 1
            while name in taken:  # two kernels whose digests meet (1 in 16 million per pair): a digit more,
                name, suffix = f"{base}{suffix}", suffix + 1  # as Relax's builder adds, which STABLE allows
            taken.add(name)
            new = tvm.ir.GlobalVar(name)
            relax.expr._update_type(new, gv.ty)  # a call's type comes from its callee's
            renamed[gv] = new
        if not renamed:
            return mod

        @relax.expr_functor.mutator
        class Rename(relax.PyExprMutator):
            def visit_global_var_(self, op):
                return renamed.get(op, op)

        out = tvm.IRModule(attrs=mod.attrs)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out[gv] = Rename(mod).visit_expr(func)
            elif gv in renamed:
                new = renamed[gv]
                has_symbol = func.attrs is not None and "global_symbol" in func.attrs
                out[new] = func.with_attr("global_symbol", new.name_hint) if has_symbol else func
            else:
                out[gv] = func
        return out

    return _pass
