"""INT8 kernels on x86: bit-exact against the numpy references (tvmfuse.schedules.computes.int8_ref) on this host, and
the VNNI builds for x86-avx512 and AVX-VNNI (assembly). The intrinsics' registration: test_int8_intrinsics.py.

Kernels run here in the ways ``helpers.int8_kernels.MODES`` lists: the int16-pair step at the host's width
and at 256 bits (what CPUs without VNNI run), the steps' descriptions as code, and the VNNI tiling whose
``vpdpbusd`` is replaced by the generic step ("vnni-tiles"), so the tensorized VNNI structure is checked on
CPUs without VNNI too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import te

from tvmfuse import targets
from tvmfuse.schedules.computes import int8, int8_ref
from tvmfuse.schedules.computes import int8_depthwise as int8_dw
from tvmfuse.schedules.x86.intrin import vnni
from tvmfuse.schedules.x86 import int8_conv2d, int8_dense, int8_depthwise

from helpers.int8_kernels import (AVX512, HOST_BITS, MODES, Conv, build, check_conv, codes, conv_kernel, epilogue,
                                  kernel_data, packed_for, run, schedule_with, weight_codes, weight_placeholder)

CONV_CASES = [
    Conv(19, 37, 14, 3, pad=1, act="relu"),  # C, O not multiples of 4 / 16
    Conv(3, 20, 15, 7, stride=2, pad=3),  # 7x7 stem, odd input
    Conv(32, 16, 9, 1, out="float32", act="relu6"),  # 1x1, dequantized output
    Conv(21, 33, 11, 3, stride=2, residual="uint8", out="int8"),  # stride 2, pad 0, residual add
    Conv(16, 48, 8, 3, pad=1, act="relu6", residual="int8", za=0),
    Conv(8, 5, 12, 3, pad=2, dilation=2, za=255),  # O < 16
    Conv(6, 18, (9, 13), 3, stride=2, pad=(0, 1, 1, 0), n=2, act="relu"),  # batch 2, non-square, asymmetric pad
    Conv(24, 40, 7, 1, act="hardswish"),  # hardswish on the real value, then requantized
    Conv(16, 20, 9, 3, pad=1, act="hardswish", out="float32"),
    Conv(32, 16, 6, 1, act="hardswish", residual="uint8", out="int8"),
    Conv(24, 40, 7, 1, act="hardswish_affine"),  # a learnable affine block after it: one fused multiply-add
    Conv(16, 20, 9, 3, pad=1, act="hardswish_affine", out="float32"),
    Conv(16, 24, 8, 1, act="requantized", residual="uint8"),  # a QDQ model's residual add after its codes
    Conv(12, 20, 7, 3, pad=1, act="requantized_relu", residual="int8", out="int8"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv2d_bit_exact(case, mode):
    ref = check_conv(case, mode)
    if case.out != "float32":
        assert len(np.unique(ref)) > 2  # the epilogue neither saturates everything nor collapses
    assert np.isfinite(ref.astype("float64")).all()


@pytest.mark.parametrize("mode", ["host", "avx2", "vnni-tiles", "maddubs", "maddubs512"])
@pytest.mark.parametrize("case", [Conv(64, 32, 6, 3, pad=1, za=255), Conv(40, 16, 5, 1, out="int8", za=0),
                                  Conv(12, 20, 7, 3, pad=1, residual="uint8", out="float32", za=128)], ids=str)
def test_conv2d_extreme_values(case, mode):
    """Only 0/255 inputs and -127/127 weights (-64/64 for the vpmaddubsw steps, whose int16 pair sums then
    reach 32640 of 32767): the largest sums and the padding's zero point at its ends."""
    if mode == "maddubs512" and "avx512bw" not in targets.host_cpu_flags():
        pytest.skip("this CPU has no AVX512BW to run the 512-bit vpmaddubsw step")
    check_conv(case, mode, extreme=True, seed=3)


@pytest.mark.parametrize("bits", [256, 512])
def test_exact_pairs_compile_to_vpmaddubsw_on_the_int8_blocks(bits):
    """7-bit weights marked exact (what the INT8 passes hand a CPU without VNNI): vpmaddubsw then vpmaddwd
    with ones per 8 (ymm) or 16 (zmm) outputs, on the VNNI layout; the same kernel unmarked
    keeps the generic step (full-range int8 codes would saturate vpmaddubsw)."""
    target = {256: {"kind": "llvm", "mcpu": "znver3"}, 512: AVX512}[bits]
    register = "zmm" if bits == 512 else "ymm"
    conv, _ = conv_kernel(CONV_CASES[0], "maddubs")
    dense, _ = _dense(*DENSE_CASES[1], mode="maddubs")
    for func, rule in ((conv, int8_conv2d), (dense, int8_dense)):
        asm = build(rule.apply(func.with_attr(int8.EXACT_PAIRS_ATTR, True), bits, False), target).mod.inspect_source("asm")
        steps = [line.split()[0] for line in asm.splitlines() if "vpmadd" in line and register in line]
        assert "vpmaddubsw" in steps and "vpmaddwd" in steps and "vpdpbusd" not in asm
        plain = build(rule.apply(func, bits, False), target).mod.inspect_source("asm")
        assert "vpmaddubsw" not in plain


@pytest.mark.parametrize("bits", [256, 512])
def test_pair_steps_compile_to_vpmaddwd_without_horizontal_adds(bits):
    """The pair layout's step on a CPU without VNNI: vpmaddwd on ymm (AVX2) or zmm (AVX-512), no vphaddd
    (what the int8-block step needed); checked on the assembly for a Zen 3 (AVX2) and for x86-avx512 with
    VNNI left unused, so on any CPU."""
    target = {256: {"kind": "llvm", "mcpu": "znver3"}, 512: AVX512}[bits]
    conv, _ = conv_kernel(CONV_CASES[0], "host")
    dense, _ = _dense(*DENSE_CASES[1], mode="host")
    for func, rule in ((conv, int8_conv2d), (dense, int8_dense)):
        sched = rule.apply(func, bits, False)
        assert "pmadd" in sched.script() and "T.parallel" in sched.script()
        asm = build(sched, target).mod.inspect_source("asm")
        register = "zmm" if bits == 512 else "ymm"
        assert "vpmaddwd\t" in asm and "vphaddd" not in asm and "vpdpbusd" not in asm
        assert any(line.strip().startswith("vpmaddwd") and register in line for line in asm.splitlines())
        # the padded conv copies its input widened to int16 (pairs broadcast from memory); the dense reads
        # uint8 and forms the pairs with byte shuffles
        assert ("pshuf.b" in sched.script()) == (rule is int8_dense)


# ----------------------------------------------------------------------------------------------- depthwise


DW_CASES = [
    Conv(19, 19, 15, 3, pad=1, act="relu6"),
    Conv(24, 24, 16, 3, stride=2, pad=1, residual="int8", out="int8", za=0),
    Conv(8, 8, 14, 5, pad=2, out="float32", za=255),
    Conv(5, 5, 13, 7, pad=3, act="relu", residual="uint8"),
    Conv(16, 16, 9, 3, pad=2, dilation=2),
    Conv(7, 7, (10, 17), 3, stride=2, pad=(1, 0, 0, 1), n=2),  # batch 2, non-square, asymmetric pad
    # 1x1 kernel, 1x1 output (after a global pool; found by fuzzing): the padded plane has no loop of its own,
    # and the rule vectorized the parallel channel loop instead, which computed channel 0 only.
    Conv(5, 5, 1, 1, out="float32", za=100),
    Conv(8, 8, 2, 1, stride=2, act="relu"),
    Conv(40, 40, 12, 5, pad=2, act="hardswish"),
    Conv(24, 24, 9, 3, stride=2, pad=1, act="hardswish", out="float32"),
    Conv(24, 24, 9, 3, pad=1, act="hardswish_affine", out="int8"),
    Conv(16, 16, 9, 3, pad=1, act="requantized_int8", residual="uint8"),
]


@pytest.mark.parametrize("extreme", [False, True])
@pytest.mark.parametrize("case", DW_CASES, ids=str)
def test_depthwise_bit_exact(case, extreme):
    x = te.placeholder(case.in_shape(), "uint8", name="x")
    w = te.placeholder((case.c, 1, case.k, case.k), "int8", name="w")
    b, m = te.placeholder((case.c,), "int32", name="b"), te.placeholder((case.c,), "float32", name="m")
    r = te.placeholder(case.out_shape(), case.residual, name="r") if case.residual else None
    ep = epilogue(case.out, case.act, case.residual)
    out = int8_dw.depthwise_conv2d_compute(x, w, b, m, r, strides=case.stride, padding=case.pad,
                                        dilation=case.dilation, input_zero_point=case.za, epilogue=ep)
    func = int8_depthwise.apply(int8.prim_func([x, w, b, m] + ([r] if r is not None else []) + [out]), HOST_BITS)
    assert func is not None and "T.parallel" in func.script() and "T.vectorized" in func.script()
    rng = np.random.default_rng(1)
    xv = codes(rng, case.in_shape(), "uint8", extreme)
    wv = codes(rng, (case.c, 1, case.k, case.k), "int8", extreme)
    bias, mult, res = kernel_data(rng, case.out_shape(), case.c, case.residual, extreme, case.act)
    args = [xv, wv, int8_ref.fold_zero_point(bias, wv, case.za), mult] + ([res] if res is not None else [])
    ref = int8_ref.depthwise_conv2d_ref(xv, wv, bias, mult, res, strides=case.stride, padding=case.pad,
                                        dilation=case.dilation, input_zero_point=case.za, epilogue=ep)
    np.testing.assert_array_equal(run(func, args, out), ref)


# ----------------------------------------------------------------------------------------------- dense


DENSE_CASES = [(1, 100, 37, "uint8", None, "relu"), (3, 130, 70, "int8", "uint8", None),
               (4, 64, 48, "float32", None, "relu6"), (2, 258, 16, "uint8", "int8", "relu6"),
               (2, 96, 40, "uint8", None, "hardswish"), (3, 80, 33, "int8", "uint8", "requantized_relu")]


def _dense(m, k, n, out_dtype, residual, act, mode="generic"):
    x = te.placeholder((m, k), "uint8", name="x")
    w = weight_placeholder((-(-n // 16), -(-k // 4), 16, 4), mode)
    b, mult = te.placeholder((n,), "int32", name="b"), te.placeholder((n,), "float32", name="m")
    r = te.placeholder((m, n), residual, name="r") if residual else None
    out = int8.dense_compute(x, w, b, mult, r, out_features=n, epilogue=epilogue(out_dtype, act, residual))
    return int8.prim_func([x, w, b, mult] + ([r] if r is not None else []) + [out]), out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", DENSE_CASES, ids=str)
def test_dense_bit_exact(case, mode):
    m, k, n, out_dtype, residual, act = case
    func, out = _dense(*case, mode=mode)
    sched = schedule_with(int8_dense, func, mode, lambda bits, v: int8_dense.default_config(m, -(-n // 16), bits, v))
    assert sched is not None
    for extreme in (False, True):
        rng = np.random.default_rng(2)
        x, w = codes(rng, (m, k), "uint8", extreme), weight_codes(rng, (n, k), mode, extreme)
        bias, mult, res = kernel_data(rng, (m, n), n, residual, extreme, act)
        za = 255 if extreme else 77
        args = [x, packed_for(int8_ref.pack_dense_weight(w), mode), int8_ref.fold_zero_point(bias, w, za), mult]
        ref = int8_ref.dense_ref(x, w, bias, mult, res, input_zero_point=za,
                                 epilogue=epilogue(out_dtype, act, residual))
        np.testing.assert_array_equal(run(sched, args + ([res] if res is not None else []), out), ref)


@pytest.mark.parametrize("bits,vnni", [(256, False), (512, True)])
def test_dense_epilogue_vectors_are_one_feature_block(bits, vnni):
    """Three 16-feature blocks per tile (what 1,170 blocks get): a 48-lane epilogue was scalarized by LLVM into
    element inserts, 5.9 ms where one block per vector takes 0.9 (PP-OCRv6's 40 x 120 x 18,720 head)."""
    import re

    func, _ = _dense(*DENSE_CASES[2])  # 48 features
    sched = int8_dense.apply(func, bits, vnni, int8_dense.Config(4, 3))
    lanes = [int(n) for n in re.findall(r"T\.vectorized\((\d+)\)", sched.script())]
    assert len(lanes) >= 2 and max(lanes) == 16  # the accumulators' zeroing and the epilogue


@pytest.mark.parametrize("out_dtype", ["uint8", "int8"])
def test_kernel_rounds_half_to_even(out_dtype):
    """acc * M lands on every half integer from -4 to 3.5: nearbyint, not round-half-away."""
    func, out = _dense(1, 4, 16, out_dtype, None, None)
    w = np.zeros((16, 4), np.int8)
    w[:, 0] = 1
    bias = np.arange(-8, 8, dtype=np.int32)
    args = [np.zeros((1, 4), np.uint8), int8_ref.pack_dense_weight(w), bias, np.full(16, 0.5, np.float32)]
    got = run(int8_dense.apply(func, HOST_BITS, False), args, out)
    zero_point = epilogue(out_dtype, None, None).zero_point
    halves = np.array([-4, -4, -3, -2, -2, -2, -1, 0, 0, 0, 1, 2, 2, 2, 3, 4])  # rint(-4, -3.5, ..., 3.5)
    np.testing.assert_array_equal(got[0], halves + zero_point)


# ----------------------------------------------------------------------------------------------- compute checks


def test_computes_reject_inconsistent_operands():
    x = te.placeholder((1, 19, 8, 8), "uint8", name="x")
    b, m = te.placeholder((37,), "int32", name="b"), te.placeholder((37,), "float32", name="m")
    unpacked = te.placeholder((37, 19, 3, 3), "int8", name="w")
    with pytest.raises(int8.Int8KernelError, match="packed"):
        int8.conv2d_compute(x, unpacked, b, m, out_channels=37)
    packed = te.placeholder((3, 5, 3, 3, 16, 4), "int8", name="w")
    with pytest.raises(int8.Int8KernelError, match="blocks of 16"):
        int8.conv2d_compute(x, packed, b, m, out_channels=50)
    with pytest.raises(int8.Int8KernelError, match="residual"):
        int8.conv2d_compute(x, packed, b, m, te.placeholder((1, 37, 6, 6), "uint8", name="r"), out_channels=37)
    with pytest.raises(int8.Int8KernelError, match="bias"):
        int8.dense_compute(te.placeholder((1, 8), "uint8", name="x"), te.placeholder((1, 2, 16, 4), "int8", name="w"),
                           te.placeholder((16,), "float32", name="b"), te.placeholder((16,), "float32", name="m"),
                           out_features=16)
    with pytest.raises(int8.Int8KernelError, match="uint8"):
        int8_dw.depthwise_conv2d_compute(te.placeholder((1, 4, 8, 8), "int8", name="x"),
                                      te.placeholder((4, 1, 3, 3), "int8", name="w"),
                                      te.placeholder((4,), "int32", name="b"), te.placeholder((4,), "float32", name="m"))


def test_rules_refuse_other_kernels_and_configs_that_do_not_divide():
    conv, _ = conv_kernel(CONV_CASES[0])
    dense, _ = _dense(*DENSE_CASES[0])
    assert int8_conv2d.apply(dense, 512, True) is None
    assert int8_dense.apply(conv, 512, True) is None
    assert int8_depthwise.apply(conv, 256) is None
    assert int8_conv2d.apply(conv, 256, False, int8_conv2d.Config(1, 5)) is None  # 14 pixels per row
    assert int8_dense.apply(dense, 256, False, int8_dense.Config(1, 2)) is None  # 3 feature blocks
    fp32 = te.placeholder((4, 4), name="a")
    assert int8_dense.apply(int8.prim_func([fp32, te.compute((4, 4), lambda i, j: fp32[i, j], name="b")]), 256,
                            False) is None


# ----------------------------------------------------------------------------------------------- VNNI build


def test_vnni_schedules_compile_to_vpdpbusd():
    assert vnni.target_has_vnni(targets.resolve(AVX512).tvm_target())
    assert not vnni.target_has_vnni(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}))
    conv, _ = conv_kernel(CONV_CASES[3])
    dense, _ = _dense(*DENSE_CASES[1])
    for func, rule in ((conv, int8_conv2d), (dense, int8_dense)):
        sched = rule.apply(func, 512, True)
        assert "llvm.x86.avx512.vpdpbusd.512" in sched.script()
        asm = build(sched, AVX512).mod.inspect_source("asm")
        assert "vpdpbusd" in asm and "zmm" in asm


@pytest.mark.avx512
@pytest.mark.parametrize("case", CONV_CASES[:4], ids=str)
def test_conv2d_vnni_bit_exact_on_avx512_hardware(case):
    func, out = conv_kernel(case)
    sched = int8_conv2d.apply(func, 512, True)
    rng = np.random.default_rng(5)
    x, w = codes(rng, case.in_shape(), "uint8", False), codes(rng, (case.o, case.c, case.k, case.k), "int8", False)
    bias, mult, res = kernel_data(rng, case.out_shape(), case.o, case.residual, False, case.act)
    args = [x, int8_ref.pack_conv2d_weight(w), int8_ref.fold_zero_point(bias, w, case.za), mult]
    args += [res] if res is not None else []
    result = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype)))
    build(sched, AVX512).mod["main"](*[tvm.runtime.tensor(a) for a in args], result)
    ref = int8_ref.conv2d_ref(x, w, bias, mult, res, strides=case.stride, padding=case.pad, dilation=case.dilation,
                              input_zero_point=case.za, epilogue=epilogue(case.out, case.act, case.residual))
    np.testing.assert_array_equal(result.numpy(), ref)


@pytest.mark.avx512
@pytest.mark.parametrize("case", CONV_CASES[:4] + [DENSE_CASES[1]], ids=str)
def test_256_bit_vnni_bit_exact_on_vnni_hardware(case):
    """The AVX-VNNI step (two vpdpbusd on ymm), run here in its EVEX form (AVX512-VNNI with VL, x86-avx512)."""
    rng = np.random.default_rng(6)
    if isinstance(case, Conv):
        func, out = conv_kernel(case)
        sched = int8_conv2d.apply(func, 256, True)
        x, w = codes(rng, case.in_shape(), "uint8", False), codes(rng, (case.o, case.c, case.k, case.k), "int8", False)
        bias, mult, res = kernel_data(rng, case.out_shape(), case.o, case.residual, False, case.act)
        args = [x, int8_ref.pack_conv2d_weight(w), int8_ref.fold_zero_point(bias, w, case.za), mult]
        ref = int8_ref.conv2d_ref(x, w, bias, mult, res, strides=case.stride, padding=case.pad,
                                  dilation=case.dilation, input_zero_point=case.za,
                                  epilogue=epilogue(case.out, case.act, case.residual))
    else:
        m, k, n, out_dtype, residual, act = case
        func, out = _dense(*case)
        sched = int8_dense.apply(func, 256, True)
        x, w = codes(rng, (m, k), "uint8", False), codes(rng, (n, k), "int8", False)
        bias, mult, res = kernel_data(rng, (m, n), n, residual, False, act)
        args = [x, int8_ref.pack_dense_weight(w), int8_ref.fold_zero_point(bias, w, 77), mult]
        ref = int8_ref.dense_ref(x, w, bias, mult, res, input_zero_point=77, epilogue=epilogue(out_dtype, act, residual))
    assert "llvm.x86.avx512.vpdpbusd.256" in sched.script()
    result = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype)))
    build(sched, AVX512).mod["main"](*[tvm.runtime.tensor(a) for a in args + ([res] if res is not None else [])],
                                     result)
    np.testing.assert_array_equal(result.numpy(), ref)


def test_avx_vnni_cpus_get_vex_vpdpbusd_on_ymm():
    """An Alder Lake (AVX-VNNI, no AVX-512): the VEX vpdpbusd on ymm registers, no zmm anywhere."""
    conv, _ = conv_kernel(CONV_CASES[0])
    asm = build(int8_conv2d.apply(conv, 256, True), {"kind": "llvm", "mcpu": "alderlake"}).mod.inspect_source("asm")
    assert "{vex}\tvpdpbusd\t%ymm" in asm and "zmm" not in asm
    assert vnni.target_has_avx_vnni(targets.resolve({"kind": "llvm", "mcpu": "alderlake"}).tvm_target())
    assert not vnni.target_has_avx_vnni(targets.resolve({"kind": "llvm", "mcpu": "znver3"}).tvm_target())


@pytest.mark.parametrize("out_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("bounds", ["codes", "fractional"])
def test_the_requantize_epilogue_stays_a_vector_loop(out_dtype, bounds):
    """The epilogue's rounding stays in the vector loop: with code bounds, the add of ``ROUNDER`` and a
    reinterpret; with a fractional clip bound, ``nearbyint``, marked vectorizable (TVM's VectorizeLoop would
    otherwise turn the vector loop into a serial loop over its lanes, the loop variable's ``_s`` form, and leave
    LLVM to gather the lanes back, which it did code by code)."""
    from tvm import s_tir, tirx

    from tvmfuse.schedules.computes.int8_epilogue import EPILOGUE, _epilogue_stage

    shape = [1, 2, 4, 4, 16]
    acc = te.placeholder(shape, "int32", name="acc")
    bias, scale = te.placeholder((32,), "int32", name="bias"), te.placeholder((32,), "float32", name="scale")
    ep = int8.Epilogue.make(out_dtype, 3, 0.05, "relu6")
    if bounds == "fractional":
        ep = dataclasses.replace(ep, clip_min=3.5)
    sch = s_tir.Schedule(te.create_prim_func([acc, bias, scale, _epilogue_stage(lambda *i: acc[i], bias, scale,
                                                                                 None, ep, shape)]))
    sch.vectorize(sch.get_loops(sch.get_sblock(EPILOGUE))[-1])
    mod = tvm.IRModule({"main": sch.mod["main"]})
    lowered = tvm.transform.Sequential([s_tir.transform.LowerInitBlock(), s_tir.transform.ConvertBlocksToOpaque(),
                                        s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(),
                                        tirx.transform.VectorizeLoop(True)])(mod)["main"].script()
    rounding = "nearbyint" if bounds == "fractional" else "reinterpret"
    assert rounding in lowered and "_s in" not in lowered and "float32x16" in lowered
