"""QuantizeGraph on a partitioned model with a synthetic calibration table, and readers of its ``main``: the
shared part of tests/passes/test_quantize_graph.py (NCHW borders) and test_quantize_blocked.py (NCHW16c)."""

from __future__ import annotations

import tvm
from tvm import relax

from helpers import HOST
from tvmfuse import frontend, targets
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes
from tvmfuse.passes.int8.quantize import QuantizeGraph
from tvmfuse.quant.keys import observed_tensors
from tvmfuse.quant.table import CalibrationTable

SPEC = targets.resolve(HOST)


def partitioned(model):
    imported = frontend.import_model(model)
    record = PassRecord()
    run_graph_passes(imported.mod, SPEC, SPEC.tvm_target(), record, int8=True)  # as quantize partitions
    return record.partitioned


def calib_table(mod, drop=()):
    return CalibrationTable({key: (-4.0, 4.0) for key, _ in observed_tensors(mod) if key not in drop}, "minmax")


AVX2 = targets.resolve({"kind": "llvm", "mcpu": "znver3"})  # no VNNI: the INT8 kernels' plain weight layouts
AVX512 = targets.resolve("x86-avx512")


def quantized(model, drop=(), blocked=False, spec=SPEC):
    """Quantized ``model``: NCHW uint8 activations by default (the borders tests), NCHW16c with ``blocked``;
    ``spec`` picks the weight packing (graphs only: nothing runs)."""
    mod = partitioned(model)
    report = {}
    with spec.tvm_target():
        out = QuantizeGraph(calib_table(mod, drop), spec, report, blocked=blocked)(mod)
    assert relax.analysis.check_well_formed(out)
    return out, report


def main_calls(mod):
    """(kind, value, var) per call bound in main; kind: the op name, a kernel's family (``call_tir`` without
    one), ``partition:<Composite>``, or ``call`` (another function)."""
    calls = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if not isinstance(value, relax.Call):
                continue
            if value.op == tvm.ir.Op.get("relax.call_tir"):
                attrs = mod[value.args[0]].attrs
                family = attrs.get("tvmfuse.family") if attrs else None
                calls.append((str(family) if family else "call_tir", value, b.var))
            elif isinstance(value.op, tvm.ir.GlobalVar):
                attrs = mod[value.op].attrs
                composite = attrs.get("Composite") if attrs else None
                calls.append(("partition:" + str(composite) if composite else "call", value, b.var))
            else:
                calls.append((getattr(value.op, "name", "call"), value, b.var))  # an extern function: "call"
    return calls


def call_kinds(mod):
    return [kind for kind, _, _ in main_calls(mod)]


def kernel_args(call):
    return list(call.args[1].fields)


def shape_of(var):
    return [int(d) for d in var.ty.shape]
