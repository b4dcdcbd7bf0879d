"""Every zoo model quantized for CUDA (a synthetic calibration table: the ranges do not change which rule
schedules a kernel): every INT8 partition on tvmfuse's CUDA INT8 rule for sm_90 (and sm_80 for a few), within 1,024
threads and 48 KiB of shared memory a block, the GEMMs on s8 tensor cores; nvcc builds the sm_90 libraries
(the quantize command's path). On a GPU (marker ``gpu``) the quantized CUDA library agrees with the quantized
x86 library of the same table."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import tirx

import tvmfuse
from helpers import HOST
from helpers.cuda_source import SM80_MODELS, dynamic_shared_bytes, kernels, zoo_builds
from tvmfuse import frontend, targets, zoo
from tvmfuse.export import kernel_schedulers
from tvmfuse.passes.int8.quantize import QuantizeGraph
from tvmfuse.passes.pipeline import PassRecord, relax_pipeline, run_graph_passes
from tvmfuse.quant.keys import observed_tensors
from tvmfuse.quant.table import CalibrationTable

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
INT8_PREFIX = "tvmfuse_int8_"


def _table(name: str) -> CalibrationTable:
    """Ranges of -4..4 for every tensor quantize observes (the partitioning is the same for every target)."""
    spec = targets.resolve("cuda-sm90")
    record = PassRecord()
    run_graph_passes(frontend.import_model(zoo.get(name), zoo.default_shapes(name)).mod, spec, spec.tvm_target(),
                     record, int8=True)
    return CalibrationTable({key: (-4.0, 4.0) for key, _ in observed_tensors(record.partitioned)}, "minmax")


def _scheduled(name: str, target: str):
    """The quantized model's kernels after the Relax pipeline (what compile hands nvcc), and QuantizeGraph's
    report."""
    spec = targets.resolve(target)
    tvm_target = spec.tvm_target()
    table, report = _table(name), {}
    mod = run_graph_passes(frontend.import_model(zoo.get(name), zoo.default_shapes(name)).mod, spec, tvm_target,
                           quantize=lambda m: QuantizeGraph(table, spec, report)(m))
    with tvm_target, tvm.transform.PassContext(opt_level=3):
        return relax_pipeline(spec, tvm_target)(mod), report, tvm_target


def _check_int8_kernels(name: str, lowered, report: dict, tvm_target) -> None:
    schedulers = kernel_schedulers(lowered)
    int8 = {k: v for k, v in schedulers.items() if k.startswith(INT8_PREFIX)}
    # (partitions of one shape and epilogue share a kernel: the constants are its arguments; grouped convs and
    # a depthwise channel multiplier have no INT8 kernel on any target and stay FP32, on the CUDA FP32 rules)
    assert report["int8_partitions"] >= len(int8) >= 1, (report, schedulers)
    assert all(re.search("grouped conv2d|channel multiplier", r["reason"]) for r in report["fp32_reasons"]), \
        report["fp32_reasons"]
    assert set(int8.values()) == {"tvmfuse.cuda.int8"}, int8
    off = {k: v for k, v in schedulers.items() if k.startswith("tvmfuse_") and not v.startswith("tvmfuse.cuda.")}
    assert not off, off
    tensor_cores = 0
    for gv, func in lowered.functions_items():
        if not (isinstance(func, tirx.PrimFunc) and gv.name_hint.startswith(INT8_PREFIX)):
            continue
        script = func.script()
        threads = [int(n) for n in re.findall(r'T\.thread_binding\((\d+), thread="threadIdx\.[xyz]"\)', script)]
        assert threads and np.prod(sorted(set(threads))) <= 1024 or max(threads) <= 1024, gv.name_hint
        if '"shared.dyn"' in script:
            tensor_cores += 1
            assert 'scope="wmma.matrix_a"' in script and "int8" in script, gv.name_hint
            assert dynamic_shared_bytes(func, tvm_target) <= 48 * 1024, gv.name_hint
    assert tensor_cores or name == "crnn", "no INT8 GEMM on the tensor cores"


@pytest.mark.parametrize("name", SM80_MODELS)
def test_int8_partitions_take_the_cuda_int8_rule_within_the_limits_on_sm80(name):
    # sm_90 (every zoo model) is checked on the nvcc builds below.
    lowered, report, tvm_target = _scheduled(name, "cuda-sm80")
    _check_int8_kernels(name, lowered, report, tvm_target)


@pytest.mark.parametrize("name", zoo_builds())
def test_quantize_for_sm90_builds_with_nvcc_on_the_int8_rule(name):
    cm = tvmfuse.quantize(zoo.get(name), table=_table(name), target="cuda-sm90", shapes=zoo.default_shapes(name),
                          logs=False)  # the rules themselves: a shipped record would schedule its kernel
    manifest = cm.manifest()
    assert manifest["cuda_code"] == "binary" and manifest["quantization"]["int8_partitions"] >= 1
    _check_int8_kernels(name, cm.lowered, manifest["quantization"], cm.target.tvm_target())
    bodies = kernels(cm.executable.mod.imports[0].imports[0].inspect_source())
    int8 = {n: b for n, b in bodies.items() if n.startswith(INT8_PREFIX)}
    assert int8 and any("wmma::matrix_a, 16, 16, 16, signed char" in b for b in int8.values()) or name == "crnn"


def _with_float64_sigmoid(mod):
    """``mod`` with every ``sigmoid`` computed in float64 and rounded once to float32."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Exact(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.sigmoid":
                return relax.op.astype(relax.op.sigmoid(relax.op.astype(call.args[0], "float64")), "float32")
            return call

    out = tvm.IRModule(mod.functions, attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = Exact().visit_expr(func)
    return out


def _quantized_graph(name: str, table: CalibrationTable):
    """The graph ``tvmfuse.quantize(zoo NAME, table=table, target="cuda-sm90")`` builds (its ``mod``: partitions
    quantized, kernels lowered and unscheduled) and the model's inputs, made as quantize makes them but without
    nvcc building the kernels (20-30 s for YOLOv8n on 2 cores, which the tests above already spend)."""
    from tvmfuse.calibration import Quantizer

    spec = targets.resolve("cuda-sm90")
    imported = frontend.import_model(zoo.get(name), zoo.default_shapes(name),
                                     **frontend.target_options(spec.backend()))
    quantizer = Quantizer(spec, table=table, cache=False)
    quantizer.prepare(imported.inputs, imported.source)
    return run_graph_passes(imported.mod, spec, spec.tvm_target(), PassRecord(), quantize=quantizer), imported.inputs


def _cpu_reference(mod, inputs, x: dict, float64_sigmoid: bool = True) -> list:
    """The quantized graph ``mod`` (its kernels unscheduled, fed ``inputs``) run on the CPU, its sigmoids in
    float64 (or as they are).

    YOLOv8n's SiLUs quantize ``x * sigmoid(x)`` after every conv, so one float32 ulp of sigmoid moves codes that
    sit on a rounding boundary, and the moves add up over its 57 layers: TVM's CPU sigmoid and the GPU's differ
    by about an ulp, and the x86 library's boxes were 1.8% (relative L2) from the CUDA library's on the H200
    (2026-11-28 and -29) while every kernel checked was bit-exact. This graph with float64 sigmoids on the CPU
    gave the GPU's first box coordinate to six digits (6.63826) and the same 1.8% from the x86 library."""
    from tvm import relax

    mod = _with_float64_sigmoid(mod) if float64_sigmoid else mod
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x[i.name]) for i in inputs])
    return [o.numpy() for o in (out if isinstance(out, (list, tuple, tvm_ffi.Array)) else [out])]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18", "efficientnet_lite0", "yolov8n"])
def test_cuda_int8_agrees_with_the_x86_int8_library(name):
    # Kernel for kernel the codes are identical (tests/schedules/test_cuda_int8.py); here the float ops between
    # the kernels (pools, means, resizes) sum in another order on each device, which can move a code by one.
    # YOLOv8n's sigmoids move many (_cpu_reference): it is compared with its own graph, sigmoids in float64.
    table, shapes = _table(name), zoo.default_shapes(name)
    gpu = tvmfuse.quantize(zoo.get(name), table=table, target="cuda-sm90", shapes=shapes)
    rng = np.random.default_rng(0)
    x = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in gpu.inputs}
    # YOLOv8n's bound is 5e-3: on an H200 (2026-11-30) its 62 INT8 kernels were each bit-exact
    # (bench/cuda_check_kernels.py --int8) and the whole library 2.4e-3 from this reference, since the GPU's own
    # sigmoid is not correctly rounded either; the x86 library (float32 sigmoids) is 1.8e-2 away.
    bound = 1e-3
    if name == "yolov8n":
        ref, bound = _cpu_reference(gpu.mod, gpu.inputs, x), 5e-3
    else:
        ref = tvmfuse.quantize(zoo.get(name), table=table, target=HOST, shapes=shapes, layout="nchw").run(x)
    for a, b in zip(gpu.run(x), ref):
        assert np.linalg.norm(a.astype(np.float64) - b) <= bound * np.linalg.norm(b), name


@pytest.mark.slow
def test_the_reference_graph_is_the_x86_library_but_for_sigmoid_rounding():
    """On the CPU: the CUDA-quantized graph with float32 sigmoids gives the x86 INT8 library's outputs (the
    graphs are the same); with float64 sigmoids, a little off them (the codes the rounding moves)."""
    name = "yolov8n"
    table, shapes = _table(name), zoo.default_shapes(name)
    mod, inputs = _quantized_graph(name, table)
    x = {i.name: np.random.default_rng(0).standard_normal(i.shape).astype(i.dtype) for i in inputs}
    cpu = tvmfuse.quantize(zoo.get(name), table=table, target=HOST, shapes=shapes, layout="nchw",
                           weight_bits=8).run(x)  # CUDA's weights (a CPU without VNNI defaults to 7 bits)
    same, exact = _cpu_reference(mod, inputs, x, float64_sigmoid=False), _cpu_reference(mod, inputs, x)
    for a, b, c in zip(same, exact, cpu):
        assert np.linalg.norm(a.astype(np.float64) - c) <= 1e-6 * np.linalg.norm(c)
        assert 1e-3 * np.linalg.norm(c) < np.linalg.norm(b.astype(np.float64) - c) < 0.05 * np.linalg.norm(c)
