"""What the partitioner did: each partition (pattern, ops, shapes, FLOPs, bytes moved), every op left out
with the reason, the layout transforms the lowering put at partition borders, and the summary line
``N ops, M in partitions, P% of conv/dense FLOPs, T layout transforms (a to_blocked, b to_plain)``."""

from __future__ import annotations

import dataclasses

import numpy as np

from tvmfuse.schedules import families


@dataclasses.dataclass
class Partition:
    pattern: str
    ops: list[str]
    inputs: list[tuple[int, ...]]
    output: tuple[int, ...]
    flops: int
    bytes_moved: int


@dataclasses.dataclass
class LeftOut:
    op: str
    output: tuple[int, ...]
    reason: str
    flops: int = 0


@dataclasses.dataclass
class PartitionReport:
    source: str
    target: str
    partitions: list[Partition]
    left_out: list[LeftOut]
    transforms: dict[str, int] | None = None  # layout transform kernel -> calls per inference (None: unknown)

    @property
    def num_ops(self) -> int:
        return sum(len(p.ops) for p in self.partitions) + len(self.left_out)

    @property
    def ops_in_partitions(self) -> int:
        return sum(len(p.ops) for p in self.partitions)

    @property
    def flops_share(self) -> float:
        """Share of conv/dense FLOPs inside partitions (1.0 when the model has none)."""
        inside = sum(p.flops for p in self.partitions)
        total = inside + sum(o.flops for o in self.left_out)
        return inside / total if total else 1.0

    @property
    def num_transforms(self) -> int:
        return sum((self.transforms or {}).values())

    def summary(self) -> str:
        line = (f"{self.num_ops} ops, {self.ops_in_partitions} in partitions, "
                f"{100 * self.flops_share:.1f}% of conv/dense FLOPs")
        if self.transforms is not None:
            kinds = ", ".join(f"{n} {name}" for name, n in sorted(self.transforms.items()))
            line += f", {self.num_transforms} layout transforms" + (f" ({kinds})" if kinds else "")
        return line

    def format(self) -> str:
        lines = [f"partitions of {self.source} for {self.target}:",
                 f"  {'#':>3}  {'pattern':<32} {'ops':<34} {'output':<20} {'MFLOP':>9} {'KiB moved':>10}"]
        for i, p in enumerate(self.partitions, 1):
            lines.append(f"  {i:>3}  {p.pattern:<32} {'+'.join(p.ops):<34} {_shape(p.output):<20} "
                         f"{p.flops / 1e6:>9.2f} {p.bytes_moved / 1024:>10.1f}")
        lines.append(f"left out ({len(self.left_out)} ops):")
        for o in self.left_out:
            lines.append(f"       {o.op:<24} {_shape(o.output):<20} {o.reason}")
        lines.append(self.summary())
        return "\n".join(lines)


def _shape(s) -> str:
    return "(" + ",".join(str(d) for d in s) + ")"


def _dims(expr) -> tuple[int, ...]:
    shape = getattr(expr.ty, "shape", None)
    try:
        return tuple(int(d) for d in shape) if shape is not None else ()
    except TypeError:
        return ()


def _nbytes(expr) -> int:
    dtype = getattr(expr.ty, "dtype", None)
    if not dtype or dtype == "void":
        return 0
    return int(np.prod(_dims(expr))) * np.dtype(str(dtype)).itemsize


def anchor_flops(call) -> int:
    """2 x multiply-adds of an anchor call (conv2d with an OIHW weight, matmul); 0 for any other op."""
    return families.family_of(call).flops(call) if families.is_anchor(call) else 0


def op_name(call) -> str:
    import tvm

    if isinstance(call.op, tvm.ir.Op):
        if call.op.name == "relax.call_tir":
            return f"call_tir:{call.args[0].name_hint}"
        return call.op.name.replace("relax.nn.", "").replace("relax.", "")
    return str(call.op)


def _reason(call, var_name: str, rejections: dict) -> str:
    import tvm

    if var_name in rejections:
        return f"not fused: {rejections[var_name]}"
    if families.is_anchor(call):
        weight = call.args[1]
        if not isinstance(weight, tvm.ir.expr.Constant):
            return "no tvmfuse kernel: weight is computed at run time, not a constant"
        return f"no pattern matched (dtype {call.ty.dtype})"
    return "no tvmfuse kernel for this op: TVM default path (fused with its neighbours)"


def layout_transforms(lowered) -> dict[str, int]:
    """Calls of layout transform kernels (``to_blocked``, ``to_plain``) in the ``main`` of a module the graph
    passes lowered (what ``run_graph_passes`` returns), per kernel name."""
    import collections

    import tvm
    from tvm import relax

    from .passes.utils import bindings_of

    counts: collections.Counter = collections.Counter()
    call_tir = tvm.ir.Op.get("relax.call_tir")
    for binding in bindings_of(lowered["main"]):
        call = binding.value
        if isinstance(call, relax.Call) and call.op.same_as(call_tir):
            attrs = lowered[call.args[0]].attrs
            if attrs is not None and str(attrs.get("tvmfuse.family", "")) == families.LAYOUT_TRANSFORM.name:
                counts[str(attrs["tvmfuse.kernel"])] += 1
    return dict(counts)


def build_report(partitioned, rejections: dict, source: str, target: str, lowered=None) -> PartitionReport:
    """Read a module right after the Partition pass (see ``PassRecord.partitioned``); with ``lowered`` (the
    graph passes' result), count the layout transforms too."""
    import tvm
    from tvm import relax

    from .passes.partition import is_partition

    parts, left = [], []
    main = partitioned["main"]
    for block in main.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not isinstance(call, relax.Call):
                continue
            if isinstance(call.op, tvm.ir.GlobalVar):
                fn = partitioned[call.op]
                if is_partition(fn):
                    body = [b.value for blk in fn.body.blocks for b in blk.bindings]
                    parts.append(Partition(
                        str(fn.attrs["Composite"]), [op_name(c) for c in body], [_dims(a) for a in call.args],
                        _dims(call), sum(anchor_flops(c) for c in body),
                        sum(_nbytes(a) for a in call.args) + _nbytes(call)))
                    continue
            left.append(LeftOut(op_name(call), _dims(call), _reason(call, binding.var.name, rejections),
                                anchor_flops(call)))
    transforms = layout_transforms(lowered) if lowered is not None else None
    return PartitionReport(source, target, parts, left, transforms)


def partitions(model, target="x86-host", shapes=None, consts=None) -> PartitionReport:
    """Partition ``model`` for ``target`` (no build) and report what was grouped and what was left out."""
    from . import frontend, targets
    from .passes.pipeline import PassRecord, run_graph_passes

    spec = targets.resolve(target)
    imported = frontend.import_model(model, shapes, consts=consts, **frontend.target_options(spec.backend()))
    record = PassRecord()
    lowered = run_graph_passes(imported.mod, spec, spec.tvm_target(), record)
    return build_report(record.partitioned, record.rejections, imported.source, spec.name, lowered)
