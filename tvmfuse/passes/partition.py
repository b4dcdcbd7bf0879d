"""Partition: group supported operators into named partitions with FuseOpsByPattern.

Each match becomes a private Relax function with ``Composite = "tvmfuse.<family>[_add][_<act>[_affine]]"``; weights
stay parameters (``bind_constants=False``) so the kernels take them as arguments. Ops outside partitions
are untouched and go through TVM's default path.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .. import patterns


def Partition(rejections: dict | None = None, int8: bool = False,  # noqa: N802
              dtype: str = "float32") -> tvm.transform.Pass:
    """The partition pass. ``rejections`` (optional dict) collects why candidate groups were refused;
    ``int8``: partition a model to be quantized; ``dtype``: the build's float type (:func:`tvmfuse.patterns.table`)."""

    @tvm.transform.module_pass(opt_level=0, name="Partition")
    def _partition(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        fuse = relax.transform.FuseOpsByPattern(patterns.table(rejections, int8, dtype), bind_constants=False,
                                                annotate_codegen=False)
        return fuse(mod)

    return _partition


def is_partition(func) -> bool:
    """True for a partition function (a Relax function FuseOpsByPattern marked ``Composite``)."""
    return isinstance(func, relax.Function) and bool(func.attrs) and "Composite" in func.attrs


def composites(mod: tvm.IRModule) -> dict[str, relax.Function]:
    """The partition functions of ``mod``: global var name -> function."""
    return {gv.name_hint: func for gv, func in mod.functions_items() if is_partition(func)}
