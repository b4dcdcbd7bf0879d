"""INT8 kernels on CUDA (``tvmfuse.schedules.cuda.int8``): conv2d and dense GEMMs on s8 x s8 tensor cores
(the input shifted to int8, ``signed_data``), one-pixel convs and few-row denses as GEMVs, depthwise on the
CUDA cores. Here: the shifted computes are bit-exact against ``int8_ref`` (run on the CPU), every case and
every tuning candidate tile lowers and builds with nvcc within the limits; on a GPU (marker ``gpu``) every
case is bit-exact against ``int8_ref``."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

import tvmfuse
from helpers import HOST
from helpers.cuda_source import built_together, dynamic_shared_bytes, kernels, shared_bytes
from helpers.int8_kernels import Conv, codes, epilogue, kernel_data, run
from helpers.qdq import Spec, qdq_model, x_input
from tvmfuse import cuda_driver, targets
from tvmfuse.schedules.common import block_names
from tvmfuse.schedules.computes import int8, int8_ref
from tvmfuse.schedules.computes import int8_depthwise as int8_dw
from tvmfuse.schedules import families
from tvmfuse.schedules.cuda import conv2d
from tvmfuse.schedules.cuda import int8 as rule
from tvmfuse.schedules.cuda import tensor_core

TARGET = "cuda-sm90"
SMS = 132
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

CONV_CASES = [
    Conv(16, 32, 14, 3, pad=1, act="relu"),  # a 3x3 GEMM: 196 x 32 x 144
    Conv(64, 64, 28, 1, act="relu6", residual="uint8"),  # 1x1 with a residual (the fma)
    Conv(3, 16, 32, 3, stride=2, pad=1, za=0),  # a stem: K = 27, padded to a fragment
    Conv(21, 33, 11, 3, stride=2, residual="int8", out="int8"),  # odd channels, stride, int8 residual
    Conv(24, 40, 7, 1, act="hardswish"),
    Conv(16, 20, 9, 3, pad=1, act="hardswish", out="float32"),
    Conv(24, 40, 7, 1, act="hardswish_affine"),
    Conv(8, 5, 12, 3, pad=2, dilation=2, za=255),  # O < 16, dilated
    Conv(64, 48, 14, 1, act="requantized_relu", residual="uint8"),  # a QDQ model's residual add after its codes
    Conv(32, 24, 1, 1, act="relu"),  # a one-pixel conv (squeeze-excite): a GEMV
    Conv(100, 40, 1, 1, act="relu6"),  # a GEMV whose K leaves lanes idle in its last step
    Conv(6, 18, (9, 13), 3, stride=2, pad=(0, 1, 1, 0), n=2, act="relu"),  # batch 2, asymmetric padding
    Conv(256, 64, 7, 3, pad=1, act="relu", residual="uint8"),  # 49 x 64 x 2304: K split over warp groups
    Conv(16, 1, (4, 210), 1, out="float32"),  # YOLOv8n's DFL: one output channel, a 4 x N map
]
DENSE_CASES = [(1, 1280, 100, "float32", None, None), (1, 100, 37, "uint8", None, "relu"),
               (32, 130, 70, "int8", "uint8", None), (64, 96, 40, "uint8", None, "hardswish")]
DW_CASES = [Conv(32, 32, 28, 3, pad=1, act="relu6"), Conv(96, 96, 15, 3, stride=2, pad=1, residual="uint8"),
            Conv(40, 40, 12, 5, pad=4, dilation=2, act="hardswish", za=200), Conv(16, 16, 7, 3, out="float32")]


def _table(ep, tabled: bool):
    """``ep`` with a table of output codes (an activation after the kernel), the table's placeholder and codes;
    ``ep``, None, None without."""
    if not tabled:
        return ep, None, None
    ep = dataclasses.replace(ep, table=True)
    codes_ = np.random.default_rng(5).permutation(256).astype(ep.out_dtype)  # every entry distinct
    return ep, te.placeholder((int8.TABLE_SIZE,), ep.out_dtype, name="t"), codes_


def _conv(case: Conv, signed: bool = True, tabled: bool = False):
    x = te.placeholder(case.in_shape(), "uint8", name="x")
    w = te.placeholder((-(-case.o // 16), -(-case.c // 4), case.k, case.k, 16, 4), "int8", name="w")
    b, m = te.placeholder((case.o,), "int32", name="b"), te.placeholder((case.o,), "float32", name="m")
    r = te.placeholder(case.out_shape(), case.residual, name="r") if case.residual else None
    ep, t, table = _table(epilogue(case.out, case.act, case.residual), tabled)
    out = int8.conv2d_compute(x, w, b, m, r, out_channels=case.o, strides=case.stride, padding=case.pad,
                              dilation=case.dilation, input_zero_point=case.za, epilogue=ep, signed_data=signed,
                              table=t)
    rng = np.random.default_rng(0)
    xv, wv = codes(rng, case.in_shape(), "uint8", False), codes(rng, (case.o, case.c, case.k, case.k), "int8", False)
    bias, mult, res = kernel_data(rng, case.out_shape(), case.o, case.residual, False, case.act)
    shift = int8.SIGNED_SHIFT if signed else 0
    args = [xv, int8_ref.pack_conv2d_weight(wv), int8_ref.fold_zero_point(bias, wv, case.za - shift), mult]
    ref = int8_ref.conv2d_ref(xv, wv, bias, mult, res, strides=case.stride, padding=case.pad, dilation=case.dilation,
                              input_zero_point=case.za, epilogue=ep, table=table)
    return _func([x, w, b, m], t, r, out, args, table, res, ref)


def _func(tensors, t, r, out, args, table, res, ref):
    """The PrimFunc (data, weight, bias, multiplier[, table][, residual], output), its output, arguments and
    reference."""
    extra = [v for v in (t, r) if v is not None]
    values = [v for v in (table, res) if v is not None]
    return int8.prim_func(tensors + extra + [out]), out, args + values, ref


def _dense(case, signed: bool = True, tabled: bool = False):
    rows, k, n, out_dtype, residual, act = case
    x = te.placeholder((rows, k), "uint8", name="x")
    w = te.placeholder((-(-n // 16), -(-k // 4), 16, 4), "int8", name="w")
    b, m = te.placeholder((n,), "int32", name="b"), te.placeholder((n,), "float32", name="m")
    r = te.placeholder((rows, n), residual, name="r") if residual else None
    ep, t, table = _table(epilogue(out_dtype, act, residual), tabled)
    out = int8.dense_compute(x, w, b, m, r, out_features=n, epilogue=ep, signed_data=signed, table=t)
    rng = np.random.default_rng(1)
    xv, wv = codes(rng, (rows, k), "uint8", False), codes(rng, (n, k), "int8", False)
    bias, mult, res = kernel_data(rng, (rows, n), n, residual, False, act)
    shift = int8.SIGNED_SHIFT if signed else 0
    args = [xv, int8_ref.pack_dense_weight(wv), int8_ref.fold_zero_point(bias, wv, 77 - shift), mult]
    ref = int8_ref.dense_ref(xv, wv, bias, mult, res, input_zero_point=77, epilogue=ep, table=table)
    return _func([x, w, b, m], t, r, out, args, table, res, ref)


def _depthwise(case: Conv, tabled: bool = False):
    x = te.placeholder(case.in_shape(), "uint8", name="x")
    w = te.placeholder((case.c, 1, case.k, case.k), "int8", name="w")
    b, m = te.placeholder((case.c,), "int32", name="b"), te.placeholder((case.c,), "float32", name="m")
    r = te.placeholder(case.out_shape(), case.residual, name="r") if case.residual else None
    ep, t, table = _table(epilogue(case.out, case.act, case.residual), tabled)
    out = int8_dw.depthwise_conv2d_compute(x, w, b, m, r, strides=case.stride, padding=case.pad,
                                           dilation=case.dilation, input_zero_point=case.za, epilogue=ep, table=t)
    rng = np.random.default_rng(2)
    xv, wv = codes(rng, case.in_shape(), "uint8", False), codes(rng, (case.c, 1, case.k, case.k), "int8", False)
    bias, mult, res = kernel_data(rng, case.out_shape(), case.c, case.residual, False, case.act)
    args = [xv, wv, int8_ref.fold_zero_point(bias, wv, case.za), mult]
    ref = int8_ref.depthwise_conv2d_ref(xv, wv, bias, mult, res, strides=case.stride, padding=case.pad,
                                        dilation=case.dilation, input_zero_point=case.za, epilogue=ep, table=table)
    return _func([x, w, b, m], t, r, out, args, table, res, ref)


# A table of output codes after the kernel (SiLU, sigmoid... on codes): a GEMM, the GEMVs, a depthwise.
# Then YOLOv8n's INT8 kernels in small (SiLU is a table there), whose CUDA library differed from the x86 one on
# the H200 (2026-11-28): a stride-2 conv walked tap by tap, K split over warp groups, 80 channels (5 blocks of
# 16), a stem of 3 channels, the DFL's 16 -> 1 conv on a 4 x N map with a float output.
TABLE_CASES = [(_conv, Conv(16, 32, 14, 3, pad=1)), (_conv, Conv(32, 24, 1, 1, out="int8")),
               (_dense, (1, 100, 37, "uint8", None, None)), (_dense, (32, 130, 70, "int8", "uint8", None)),
               (_depthwise, Conv(32, 32, 28, 3, pad=1, residual="uint8")),
               (_conv, Conv(16, 32, 40, 3, stride=2, pad=1)), (_conv, Conv(256, 64, 10, 3, pad=1)),
               (_conv, Conv(80, 80, 20, 3, pad=1)), (_conv, Conv(3, 16, 64, 3, stride=2, pad=1))]
CASES = ([pytest.param(_conv, c, False, id=f"conv-{c}") for c in CONV_CASES]
         + [pytest.param(_dense, c, False, id=f"dense-{c}") for c in DENSE_CASES]
         + [pytest.param(_depthwise, c, False, id=f"depthwise-{c}") for c in DW_CASES]
         + [pytest.param(m, c, True, id=f"{m.__name__[1:]}-table-{c}") for m, c in TABLE_CASES])
GEMM_CASES = [p for p in CASES if p.values[0] is not _depthwise]


@pytest.mark.parametrize("make,case,tabled", GEMM_CASES)
def test_the_shifted_computes_are_bit_exact_on_the_cpu(make, case, tabled):
    # The tensor cores' operands: x - 128 in int8, padding za - 128, the bias folded with za - 128.
    func, out, args, ref = make(case, tabled=tabled)
    np.testing.assert_array_equal(run(func, args, out), ref)


def _is_gemm(make, case) -> bool:
    """Whether the case is a tensor-core GEMM (not a depthwise, a few-row dense or a one-pixel conv: GEMVs)."""
    return make is not _depthwise and not (make is _dense and case[0] < 16) and \
        not (make is _conv and case.out_shape()[2:] == (1, 1))


def _scheduled(func, config=None):
    sch = s_tir.Schedule(func)
    assert rule.schedule(sch, SMS, config)
    return sch.mod["main"]


def _source(func):
    spec = targets.resolve(TARGET)
    spec.backend()  # maps TVM's CUDA runtime (cubins) and teaches the CUDA lowering the epilogue's fma
    target = spec.tvm_target()
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "k")})
    with target:
        lib = tvm.compile(mod, target=target)
    return lib, lib.mod.imports[0].inspect_source()


GEMV_CASES = [p for p in GEMM_CASES if not _is_gemm(*p.values[:2])]


@pytest.mark.parametrize("make,case,tabled", GEMV_CASES)
def test_every_gemv_warp_stores_only_the_output_it_summed(make, case, tabled):
    # A one-pixel INT8 conv's sums are laid out [o // 16, ..., o % 16]. Placed after the warps' sums, its
    # epilogue covered the whole block of 16 channels: each warp stored 16 outputs of which it had summed one,
    # the rest a register's garbage (the H200 round of 2026-11-28: half of a 24-channel conv's codes wrong).
    func, out, *_ = make(case, tabled=tabled)
    sch = s_tir.Schedule(_scheduled(func))
    (store,) = [name for name in block_names(sch) if sch.get(sch.get_sblock(name)).writes[0].source.name == out.name]
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock(store))]
    assert [str(lp.thread_binding.thread_tag) for lp in loops if lp.thread_binding is not None] == ["blockIdx.x", "threadIdx.y"]
    assert all(lp.thread_binding is not None or int(lp.extent) == 1 for lp in loops), [(lp.loop_var, lp.extent) for lp in loops]


@pytest.fixture(scope="module")
def case_sources():
    """Every case's kernel source, nvcc building them all as one module (one nvcc start, not one a case); None
    where that fails: each test then builds its own kernel, for an error that names its case."""
    target = targets.resolve(TARGET)
    target.backend()  # as _source: cubins, and the epilogue's fma
    try:
        return built_together([_scheduled(make(case, tabled=tabled)[0]) for make, case, tabled in
                               (p.values for p in CASES)], target.tvm_target(), alone_on_error=False)
    except Exception:  # noqa: BLE001 - see the docstring
        return None


@needs_nvcc
@pytest.mark.parametrize("make,case,tabled", CASES)
def test_every_case_builds_on_its_cuda_rule_within_the_limits(make, case, tabled, case_sources):
    func, _, args, _ = make(case, tabled=tabled)
    scheduled = _scheduled(func)
    target = targets.resolve(TARGET).tvm_target()
    if case_sources is None:
        (body,) = kernels(_source(scheduled)[1]).values()
    else:
        body = case_sources[[p.values for p in CASES].index((make, case, tabled))]
    threads = [int(n) for n in re.findall(r"__launch_bounds__\((\d+)\)", body)]
    assert threads and max(threads) <= 1024
    assert shared_bytes(body) + dynamic_shared_bytes(scheduled, target) <= 48 * 1024
    if _is_gemm(make, case):
        assert "nvcuda::wmma::mma_sync" in body and "wmma::matrix_a, 16, 16, 16, signed char" in body
        assert "wmma::accumulator, 16, 16, 16, int" in body
    else:
        assert "wmma" not in body
    if (make is _dense and case[4]) or (make is not _dense and case.residual):
        assert "fmaf(" in body  # the residual's one rounding, as llvm.fma on the CPU


@needs_nvcc
def test_every_int8_tensor_core_candidate_builds():
    func, *_ = _conv(Conv(64, 64, 28, 3, pad=1, act="relu", residual="uint8"))
    configs = rule.kernel_candidates(func, SMS)
    assert configs and all(isinstance(c, tensor_core.Config) and c.operand == "int8" for c in configs)
    assert configs[0] == tensor_core.default_config(784, 64, 576, SMS, "int8")
    assert {c.step_k for c in configs} == {16, 32, 64, 128}
    spec = targets.resolve(TARGET)
    target = spec.tvm_target()
    scheduled = [_scheduled(func, config) for config in configs]
    for config, func_ in zip(configs, scheduled):
        used = dynamic_shared_bytes(func_, target)
        assert 0 < used <= config.shared_bytes() <= 48 * 1024, (config, used)
    spec.backend()  # as _source: TVM's CUDA runtime mapped (cubins), the epilogue's fma taught
    for config, source in zip(configs, built_together(scheduled, target)):
        assert "signed char" in source and "wmma::mma_sync" in source, config


def test_int8_tiles_count_a_byte_per_operand():
    half = tensor_core.Config(2, 2, 2, 2, 64)
    byte = tensor_core.Config(2, 2, 2, 2, 64, "int8")
    # two buffers of 64 rows of 64 elements, a half's rows padded by 16 bytes
    assert (half.operand_bytes(64), byte.operand_bytes(64)) == (2 * 64 * (64 + 8) * 2, 2 * 64 * 64)


@needs_nvcc
@pytest.mark.parametrize("make,case,tabled", GEMM_CASES[:4])
def test_int8_fragments_load_from_32_byte_aligned_shared_memory(make, case, tabled):
    # wmma::load_matrix_sync wants a 256-bit aligned pointer: a 16-byte K slice in a row of the tile would start
    # half of the fragments mid-way. Every load reads a whole-256-byte offset with rows 16 bytes apart.
    func, *_ = make(case, tabled=tabled)
    if not _is_gemm(make, case):
        return
    loads = re.findall(r"load_matrix_sync\([^,]+, \(&\(\(\(signed char\*\)buf_dyn_shmem_ptr\)\[([^\]]+)\]\)\), (\d+)\)",
                       _source(_scheduled(func))[1])
    assert loads and all(ldm == "16" for _, ldm in loads)
    for offset, _ in loads:  # e.g. ((ax3_0_0 * 1024) + (ax3_0_1 * 256)) + 2304: valid Python too
        names = sorted(set(re.findall(r"[A-Za-z_]\w*", offset)))
        for values in itertools.product(range(4), repeat=len(names)):
            assert eval(offset, {}, dict(zip(names, values))) % 32 == 0, offset  # noqa: S307 - nvcc's index math


@pytest.mark.parametrize("case", [Conv(16, 32, 14, 3, pad=1), Conv(32, 24, 12, 3, stride=2, pad=1, residual="uint8")])
def test_a_windowed_conv_summed_tap_by_tap_gives_the_same_codes(case):
    # The CUDA rule reorders an INT8 conv's reduction (channel block, row, column, channel) to (row, column,
    # block, channel) before the GEMM; the block so reordered, built for the CPU, against int8_ref.
    func, out, args, ref = _conv(case)
    sch = s_tir.Schedule(func)
    main = sch.get_sblock(families.CONV2D.int8.anchor_block)
    before = [int(iv.dom.extent) for iv in sch.get(main).iter_vars]
    conv2d._taps_outer(sch, main)
    after = [int(iv.dom.extent) for iv in sch.get(main).iter_vars]
    assert after == before[:5] + [case.k, case.k, case.c // 4, 4] != before
    np.testing.assert_array_equal(run(sch.mod["main"], args, out), ref)


@needs_nvcc
def test_an_int8_3x3_conv_loads_its_input_tap_by_tap():
    # No division by the 9 taps of a channel in the input's index (nvcc's PTX for ResNet's INT8 3x3 layers:
    # 334-1,044 instructions instead of 784-2,531); the weight's 4 channels of a block still one 32-bit load.
    def source(case):
        func, *_ = _conv(case)
        return _source(_scheduled(func))[1]

    windowed = source(Conv(64, 64, 28, 3, pad=1, act="relu"))
    loads = re.findall(r"x_ptr\[([^\]]*)\]", windowed)
    assert loads and not any(re.search(r"[/%] (9|36)\b", i) for i in loads), loads
    assert "*(int*)(w_ptr" in windowed


@needs_nvcc
@pytest.mark.parametrize("case,fours", [(Conv(64, 64, 28, 1, act="relu6", residual="uint8"), True),
                                        (Conv(30, 32, 28, 1), False), (Conv(116, 116, 14, 1), False)])
def test_an_int8_1x1_conv_loads_its_input_four_pixels_a_thread(case, fours):
    # Unless a condition sits in the load (channels padded to a block of 4, or K to the step, as ShuffleNet's
    # 116): TVM's CUDA code for 4 conditional bytes does not compile, so those load a byte a thread.
    func, *_ = _conv(case)
    source = _source(_scheduled(func))[1]
    assert ("*(uint*)(x_ptr" in source) == fours and ("x_ptr[" in source) != fours


@pytest.mark.parametrize("case", [Conv(3, 16, 32, 3, stride=2, pad=1), Conv(24, 16, 8, 3), Conv(64, 32, 8, 1)])
def test_a_stem_odd_channels_and_a_1x1_conv_keep_their_order(case):
    # Taps first would split a fragment's 16 channels over taps (3 or 24 channels); a 1x1 conv has one tap.
    func, *_ = _conv(case)
    sch = s_tir.Schedule(func)
    main = sch.get_sblock(families.CONV2D.int8.anchor_block)
    before = sch.get(main).iter_vars
    conv2d._taps_outer(sch, main)
    assert [int(iv.dom.extent) for iv in sch.get(main).iter_vars] == [int(iv.dom.extent) for iv in before]


@pytest.mark.gpu
@pytest.mark.parametrize("make,case,tabled", CASES)
def test_bit_exact_on_the_gpu(make, case, tabled):
    func, out, args, ref = make(case, tabled=tabled)
    lib, _ = _source(_scheduled(func))
    dev = tvm.cuda(0)
    result = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype)), dev)
    lib["k"](*[tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in args], result)
    np.testing.assert_array_equal(result.numpy(), ref)


def test_cuda_targets_ask_for_signed_data_and_nchw_codes():
    backend = targets.resolve(TARGET).backend()
    assert backend.int8_kernels and backend.int8_weights == "signed" and not backend.int8_blocked


QDQ_CHAINS = [Spec(activation="Relu", weight_low=-128), Spec(group=8, activation="Relu", seed=2),
              Spec(act_dtype="int8", residual=True, activation="Relu", seed=4), Spec(op="Gemm", channels=20, seed=6)]


@needs_nvcc
@pytest.mark.parametrize("spec", QDQ_CHAINS, ids=str)
def test_a_quantized_onnx_chain_runs_on_the_cuda_int8_rule(spec):
    # An already-quantized model's chains (FuseQDQ) take the CUDA kernels with the shifted input too.
    model = qdq_model(spec)
    cm = tvmfuse.compile(model, target=TARGET, logs=False)
    assert cm.record.qdq["int8_kernels"] == 1
    partitions = {k: v for k, v in cm.manifest()["scheduled_by"].items() if k.startswith("tvmfuse_int8_")}
    assert list(partitions.values()) == ["tvmfuse.cuda.int8"], cm.manifest()["scheduled_by"]
    if cuda_driver.cuda_available():  # the GPU round: the same codes as the x86 kernels
        x = {"x": x_input(spec)}
        np.testing.assert_array_equal(cm.run(x)[0], tvmfuse.compile(model, target=HOST).run(x)[0])
