"""INT8 kernels with an output table (``Epilogue.table``): the requantized code looked up in 256 output codes,
bit-exact against ``int8_ref``, through the x86 backend's schedule: byte loads, or 16 lookups per two
``vpermi2b`` on AVX512-VBMI (``schedules/x86/intrin/table_vbmi.py``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import te

from tvmfuse import targets
from tvmfuse.schedules import x86
from tvmfuse.schedules.computes import int8, int8_depthwise, int8_ref
from tvmfuse.schedules.padding_taps import rebuild_loops
from tvmfuse.schedules.x86.intrin.table_vbmi import MARK, rewrite_lookups

from helpers import HOST

AVX512 = targets.resolve("x86-avx512")
HAS_VBMI = "avx512vbmi" in targets.resolve(HOST).features() and "avx512vnni" in targets.resolve(HOST).features()


def _conv(c, o, size, kernel, vnni, vbmi, rng):
    """A blocked INT8 conv with a table, scheduled as compile does, its arguments and the reference output."""
    x = te.placeholder((1, c // 16, size, size, 16), "uint8", name="x")
    weight = rng.integers(-127, 128, (o, c, kernel, kernel)).astype("int8")
    packed = int8_ref.pack_conv2d_weight(weight)
    tensors = [x, te.placeholder(packed.shape, "int8", name="w"), te.placeholder((o,), "int32", name="b"),
               te.placeholder((o,), "float32", name="m"), te.placeholder((256,), "uint8", name="t")]
    ep = dataclasses.replace(int8.Epilogue.make("uint8", 7, 0.05, "relu"), table=True)
    out = int8.conv2d_compute(*tensors[:4], out_channels=o, padding=kernel // 2, input_zero_point=3, epilogue=ep,
                              out_layout="NCHW16c", table=tensors[4])
    func = x86.schedule(int8.prim_func(tensors + [out]), "int8_conv2d", 512 if vnni else 256, vnni, vbmi)
    codes = rng.integers(0, 256, (1, c // 16, size, size, 16)).astype("uint8")
    bias, mult = rng.integers(-3000, 3000, o).astype("int32"), (rng.random(o) * 0.002).astype("float32")
    table = rng.permutation(256).astype("uint8")
    plain = codes.transpose(0, 1, 4, 2, 3).reshape(1, c, size, size)
    want = int8_ref.conv2d_ref(plain, weight, bias, mult, padding=kernel // 2, input_zero_point=3, epilogue=ep,
                               table=table)
    args = [codes, packed, int8_ref.fold_zero_point(bias, weight, 3), mult, table]
    return rewrite_lookups(func), args, want, [int(d) for d in out.shape]


def _run(func, args, out_shape, spec):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=spec.tvm_target())
    out = tvm.runtime.tensor(np.zeros(out_shape, "uint8"))
    lib.mod["main"](*[tvm.runtime.tensor(a) for a in args], out)
    got = out.numpy()
    return got.transpose(0, 1, 4, 2, 3).reshape(1, -1, out_shape[2], out_shape[3]), lib


@pytest.mark.parametrize("c,o,size,kernel", [(16, 32, 8, 1), (32, 48, 10, 3)])
def test_the_table_with_byte_loads_is_bit_exact(c, o, size, kernel):
    func, args, want, shape = _conv(c, o, size, kernel, False, False, np.random.default_rng(c))
    assert MARK not in func.script()
    got, _ = _run(func, args, shape, targets.resolve(HOST))
    np.testing.assert_array_equal(got[:, :o], want)


@pytest.mark.avx512
@pytest.mark.skipif(not HAS_VBMI, reason="needs AVX512-VBMI and VNNI to run the vector lookups")
@pytest.mark.parametrize("c,o,size,kernel", [(16, 32, 8, 1), (32, 48, 10, 3), (64, 64, 7, 3)])
def test_the_vector_lookups_are_bit_exact(c, o, size, kernel):
    func, args, want, shape = _conv(c, o, size, kernel, True, True, np.random.default_rng(o))
    got, lib = _run(func, args, shape, AVX512)
    np.testing.assert_array_equal(got[:, :o], want)
    assert "vpermt2b" in lib.mod.inspect_source("asm") or "vpermi2b" in lib.mod.inspect_source("asm")


def _depthwise(c, size, vnni, vbmi, rng):
    """A blocked INT8 5x5 depthwise conv with a table (taps in fours with VNNI), as :func:`_conv`."""
    x = te.placeholder((1, c // 16, size, size, 16), "uint8", name="x")
    weight = rng.integers(-127, 128, (c, 1, 5, 5)).astype("int8")
    packed = (int8_depthwise.pack_weight_vnni if vnni else int8_depthwise.pack_weight)(weight)
    tensors = [x, te.placeholder(packed.shape, "int8", name="w"), te.placeholder((c,), "int32", name="b"),
               te.placeholder((c,), "float32", name="m"), te.placeholder((256,), "uint8", name="t")]
    ep = dataclasses.replace(int8.Epilogue.make("uint8", 5, 0.05, None), table=True)
    out = int8_depthwise.depthwise_conv2d_compute(*tensors[:4], padding=2, input_zero_point=3, epilogue=ep,
                                                  kernel_width=5 if vnni else None, table=tensors[4])
    func = x86.schedule(int8.prim_func(tensors + [out]), "int8_depthwise_conv2d", 512 if vnni else 256, vnni, vbmi)
    codes = rng.integers(0, 256, (1, c // 16, size, size, 16)).astype("uint8")
    bias, mult = rng.integers(-3000, 3000, c).astype("int32"), (rng.random(c) * 0.004).astype("float32")
    table = rng.permutation(256).astype("uint8")
    plain = codes.transpose(0, 1, 4, 2, 3).reshape(1, c, size, size)
    want = int8_ref.depthwise_conv2d_ref(plain, weight, bias, mult, padding=2, input_zero_point=3, epilogue=ep,
                                         table=table)
    args = [codes, packed, int8_ref.fold_zero_point(bias, weight, 3), mult, table]
    return rewrite_lookups(func), args, want, [int(d) for d in out.shape]


def test_a_depthwise_table_with_byte_loads_is_bit_exact():
    func, args, want, shape = _depthwise(32, 9, False, False, np.random.default_rng(3))
    got, _ = _run(func, args, shape, targets.resolve(HOST))
    np.testing.assert_array_equal(got, want)


def test_a_float_depthwise_writing_nchw_takes_its_table_before_the_rule():
    """The float depthwise (AVX2, rows of 5 taps) partitions its padding stage into nested blocks, into which the
    lookup cannot be inlined once the rule ran (an ONNX Runtime QDQ hardswish after a depthwise whose reader
    wants NCHW): the lookup is inlined first, and the rule still schedules the kernel."""
    rng = np.random.default_rng(5)
    c, blocks, h, w = 40, 3, 3, 20  # a 3-row map: most kernel rows read only padding
    x = te.placeholder((1, blocks, h, w, 16), "uint8", name="x")
    weight = rng.integers(-127, 128, (c, 1, 5, 5)).astype("int8")
    packed = int8_depthwise.pack_weight_float(weight)
    bias = rng.integers(-3000, 3000, c).astype("int32")
    tensors = [x, te.placeholder(packed.shape, "float32", name="w"), te.placeholder((c,), "float32", name="b"),
               te.placeholder((c,), "float32", name="m"), te.placeholder((256,), "uint8", name="t")]
    ep = dataclasses.replace(int8.Epilogue.make("uint8", 5, 0.05, None), table=True)
    out = int8_depthwise.depthwise_conv2d_compute(*tensors[:4], padding=2, input_zero_point=3, epilogue=ep,
                                                  out_layout="NCHW", channels=c, table=tensors[4])
    func = x86.schedule(int8.prim_func(tensors + [out]), "int8_depthwise_conv2d", 256, False, False)
    assert "T.parallel" in func.script() and 'sblock("table_lookup")' not in func.script()  # lookup inlined
    codes = rng.integers(0, 256, (1, blocks, h, w, 16)).astype("uint8")
    mult, table = (rng.random(c) * 0.004).astype("float32"), rng.permutation(256).astype("uint8")
    plain = codes.transpose(0, 1, 4, 2, 3).reshape(1, blocks * 16, h, w)[:, :c]
    want = int8_ref.depthwise_conv2d_ref(plain, weight, bias, mult, padding=2, input_zero_point=3, epilogue=ep,
                                         table=table)
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                      target=targets.resolve(HOST).tvm_target())
    got = tvm.runtime.tensor(np.zeros(want.shape, "uint8"))
    lib.mod["main"](*[tvm.runtime.tensor(a) for a in [codes, packed, bias.astype("float32"), mult, table]], got)
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.avx512
@pytest.mark.skipif(not HAS_VBMI, reason="needs AVX512-VBMI and VNNI to run the vector lookups")
def test_a_depthwise_table_with_vector_lookups_is_bit_exact():
    func, args, want, shape = _depthwise(32, 12, True, True, np.random.default_rng(4))
    got, _ = _run(func, args, shape, AVX512)
    np.testing.assert_array_equal(got, want)


def _dense(m, k, n, rng, bits=512, vnni=True, vbmi=True):
    """A dense with a table scheduled by the x86 rule (AVX-512 with VNNI and VBMI unless told), before the lookup
    rewrite; its arguments and the reference output."""
    weight = rng.integers(-127, 128, (n, k)).astype("int8")
    packed = int8_ref.pack_dense_weight(weight)
    tensors = [te.placeholder((m, k), "uint8", name="x"), te.placeholder(packed.shape, "int8", name="w"),
               te.placeholder((n,), "int32", name="b"), te.placeholder((n,), "float32", name="m"),
               te.placeholder((256,), "uint8", name="t")]
    ep = dataclasses.replace(int8.Epilogue.make("uint8", 11, 0.05, "relu"), table=True)
    out = int8.dense_kernel(*tensors[:4], channels=n, epilogue=ep, table=tensors[4])
    func = x86.schedule(int8.prim_func(tensors + [out]), "int8_dense", bits, vnni, vbmi)
    x = rng.integers(0, 256, (m, k)).astype("uint8")
    bias, mult = rng.integers(-3000, 3000, n).astype("int32"), (rng.random(n) * 0.002).astype("float32")
    table = rng.permutation(256).astype("uint8")
    want = int8_ref.dense_ref(x, weight, bias, mult, epilogue=ep, table=table)
    return func, [x, packed, bias, mult, table], want


def test_a_dense_table_is_bit_exact():
    """A dense's output tile is not 16 contiguous lanes of one vector here: the lookups stay byte loads."""
    func, args, want = _dense(3, 40, 24, np.random.default_rng(6), 256, False, False)
    lib = tvm.compile(tvm.IRModule({"main": rewrite_lookups(func).with_attr("global_symbol", "main")}),
                      target=targets.resolve(HOST).tvm_target())
    result = tvm.runtime.tensor(np.zeros(want.shape, "uint8"))
    lib.mod["main"](*[tvm.runtime.tensor(a) for a in args], result)
    np.testing.assert_array_equal(result.numpy(), want)


def test_a_table_needs_a_quantized_output_and_its_tensor():
    with pytest.raises(int8.Int8KernelError, match="needs a uint8/int8 output"):
        int8.Epilogue("float32", table=True)
    x = te.placeholder((1, 16, 4, 4), "uint8", name="x")
    w = te.placeholder((1, 4, 1, 1, 16, 4), "int8", name="w")
    b, m = te.placeholder((16,), "int32", name="b"), te.placeholder((16,), "float32", name="m")
    with pytest.raises(int8.Int8KernelError, match="table tensor needs Epilogue.table"):
        int8.conv2d_compute(x, w, b, m, out_channels=16, epilogue=int8.Epilogue("uint8", table=True))


def _marked_extents(func) -> list[int]:
    found = []
    rebuild_loops(func.body, lambda loop: found.append(int(loop.extent)) if MARK in loop.annotations else None)
    return found


def test_a_marked_lookup_loop_wider_than_a_vector_becomes_one_lookup_per_16():
    # MobileNetV3's squeeze-and-excitation dense quantized by onnxruntime (a hardsigmoid table after it): the
    # lookup's loop spans 64 outputs, and only its first 16 were written (outputs far off onnxruntime's)
    func, _, _ = _dense(1, 80, 64, np.random.default_rng(8))
    assert _marked_extents(func) and max(_marked_extents(func)) > 16
    rewritten = rewrite_lookups(func).script()
    assert MARK not in rewritten and rewritten.count("vpermi2var") == 2 * 64 // 16 * len(_marked_extents(func))


@pytest.mark.avx512
@pytest.mark.skipif(not HAS_VBMI, reason="needs AVX512-VBMI and VNNI to run the vector lookups")
@pytest.mark.parametrize("m,k,n", [(1, 80, 64), (3, 130, 96)])
def test_a_dense_table_with_vector_lookups_is_bit_exact(m, k, n):
    func, args, want = _dense(m, k, n, np.random.default_rng(n))
    lib = tvm.compile(tvm.IRModule({"main": rewrite_lookups(func).with_attr("global_symbol", "main")}),
                      target=AVX512.tvm_target())
    result = tvm.runtime.tensor(np.zeros(want.shape, "uint8"))
    lib.mod["main"](*[tvm.runtime.tensor(a) for a in args], result)
    np.testing.assert_array_equal(result.numpy(), want)
