"""INT8 Winograd F(2x2, 3x3) (schedules/computes/int8_winograd.py, schedules/x86/int8_winograd.py): the integer
identity in numpy, the int32 bound, and the x86 kernel bit-exact against int8_ref on this host (the AVX2 pair
step and its description as code), from NCHW16c codes with the padded channels holding anything."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

from tvmfuse.schedules.computes import int8, int8_ref
from tvmfuse.schedules.computes import int8_winograd as wino
from tvmfuse.schedules.x86 import int8_conv2d
from tvmfuse.schedules.x86 import int8_winograd as x86_wino

from helpers.int8_kernels import HOST_BITS, Conv, build, codes, epilogue, kernel_data, run
from helpers.layout import to_blocked, to_plain

BLOCK = int8.BLOCK_O


def test_the_integer_matrices_give_four_times_the_direct_sum():
    rng = np.random.default_rng(0)
    d = rng.integers(0, 256, (4, 4)).astype(np.int64)
    g = rng.integers(-128, 128, (3, 3)).astype(np.int64)
    u = wino.G_2 @ g @ wino.G_2.T
    v = wino.B_T @ d @ wino.B_T.T
    y = wino.A_T @ (u * v) @ wino.A_T.T
    direct = np.array([[(d[i:i + 3, j:j + 3] * g).sum() for j in range(2)] for i in range(2)])
    assert np.array_equal(y, direct << wino.SHIFT)
    assert np.abs(v).max() <= 2 * wino.CODE_SPAN and np.abs(u).max() <= 9 * 128  # both int16


def test_the_int32_bound_refuses_only_weights_that_could_overflow():
    rng = np.random.default_rng(1)
    assert wino.fits(rng.integers(-127, 128, (64, 512, 3, 3)).astype(np.int8))
    # every weight at +-127 in the pattern that makes each |U| its largest: 9 x 127 at the centre positions
    worst = np.full((16, 16, 3, 3), 127, np.int8)
    assert wino.fits(worst)  # 16 channels: far inside
    assert not wino.fits(np.full((16, 4096, 3, 3), 127, np.int8))
    assert not wino.fits(np.full((16, 4096, 3, 3), -128, np.int8))


def test_pack_weight_lays_u_out_as_the_pair_steps_blocks():
    rng = np.random.default_rng(2)
    w = rng.integers(-128, 128, (20, 24, 3, 3)).astype(np.int8)  # -128 taken: only the bound cares
    packed = wino.pack_weight(w)
    assert packed.dtype == np.int16 and packed.shape == (4, 4, 2, 8, 2, 16, 2)  # inputs padded to 32 (2 blocks)
    u = wino.transformed(w)
    # [e, u, ob, cb, pair, oi, k]: input channel 4 cb + 2 pair + k, output 16 ob + oi
    assert packed[1, 2, 1, 3, 1, 2, 0] == u[1, 2, 18, 14] and packed[3, 0, 0, 5, 0, 15, 1] == u[3, 0, 15, 21]
    assert not packed[:, :, 1, :, :, 4:].any() and not packed[:, :, :, 6:].any()  # padded outputs and inputs
    with pytest.raises(ValueError, match=r"int8 \[O, I, 3, 3\]"):
        wino.pack_weight(w[:, :, :1])


def test_the_compute_refuses_what_it_does_not_compute():
    x = te.placeholder((1, 2, 8, 8, BLOCK), "uint8", name="x")
    w = te.placeholder((4, 4, 1, 8, 2, 16, 2), "int16", name="w")
    b, m = te.placeholder((16,), "int32", name="b"), te.placeholder((16,), "float32", name="m")
    with pytest.raises(int8.Int8KernelError, match="stride 1, dilation 1, padding 1"):
        wino.conv2d_kernel(x, w, b, m, channels=16, strides=2, padding=1)
    with pytest.raises(int8.Int8KernelError, match=r"int16 \[4, 4, 1, 8, 2, 16, 2\]"):
        wino.conv2d_compute(x, te.placeholder((4, 4, 1, 4, 2, 16, 2), "int16", name="w"), b, m, out_channels=16)


CASES = [
    Conv(16, 16, (5, 7), 3, pad=1, act="relu"),  # odd map: the last tiles half outside
    Conv(19, 37, 9, 3, pad=1, act="relu6", za=255),  # padded channel blocks in and out
    Conv(32, 32, 10, 3, pad=1, act="relu", residual="uint8"),
    Conv(48, 24, 6, 3, pad=1, out="int8", residual="int8"),
    Conv(24, 40, 7, 3, pad=1, act="hardswish", residual="uint8"),
    Conv(64, 40, 9, 3, pad=1, act="requantized_relu", residual="uint8"),  # a QDQ model's add after its codes
]


def _kernel(case: Conv):
    n, c, h, w = case.in_shape()
    out_shape = int8.out_shape_of(*case.out_shape(), int8.BLOCKED_LAYOUT)
    channels = out_shape[1] * BLOCK
    x = te.placeholder((n, -(-c // BLOCK), h, w, BLOCK), "uint8", name="x")
    wt = te.placeholder((4, 4, -(-case.o // BLOCK), -(-c // BLOCK) * 4, 2, BLOCK, 2), "int16", name="w")
    b, m = te.placeholder((channels,), "int32", name="b"), te.placeholder((channels,), "float32", name="m")
    r = te.placeholder(out_shape, case.residual, name="r") if case.residual else None
    out = wino.conv2d_compute(x, wt, b, m, r, out_channels=case.o, input_zero_point=case.za,
                              epilogue=epilogue(case.out, case.act, case.residual))
    return int8.prim_func([x, wt, b, m] + ([r] if r is not None else []) + [out]), out, channels


@pytest.mark.parametrize("dot", ["host", "generic"])
@pytest.mark.parametrize("extreme", [False, True], ids=["random", "extreme"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_kernel_is_bit_exact(case, extreme, dot):
    func, out, channels = _kernel(case)
    n, _, h, w = case.in_shape()
    default = x86_wino.default_config(-(-case.o // BLOCK), n * -(-h // 2) * -(-w // 2), HOST_BITS)
    config = None if dot == "host" else dataclasses.replace(default, dot="generic")
    sch = s_tir.Schedule(func)
    assert int8_conv2d.schedule(sch, HOST_BITS, False, None) if config is None else \
        x86_wino.schedule(sch, HOST_BITS, config)
    rng = np.random.default_rng(3)
    x = codes(rng, case.in_shape(), "uint8", extreme)
    w = codes(rng, (case.o, case.c, 3, 3), "int8", extreme)
    w[0, 0, 0, 0] = -128  # a model's own codes may hold it
    assert wino.fits(w)
    out_plain = case.out_shape()
    bias, mult, res = kernel_data(rng, out_plain, case.o, case.residual, extreme, case.act)
    pad = channels - case.o
    folded = np.concatenate([int8_ref.fold_zero_point(bias, w, case.za), np.zeros(pad, np.int32)])
    args = [to_blocked(x, BLOCK, fill=201), wino.pack_weight(w), folded,
            np.concatenate([mult, np.zeros(pad, np.float32)])]
    if res is not None:
        args.append(to_blocked(res, BLOCK))
    got = to_plain(run(sch.mod["main"], args, out), case.o)
    want = int8_ref.conv2d_ref(x, w, bias, mult, res, padding=1, input_zero_point=case.za,
                               epilogue=epilogue(case.out, case.act, case.residual))
    np.testing.assert_array_equal(got, want)


def test_the_products_are_vpmaddwd_on_the_avx2_target():
    func, _, _ = _kernel(Conv(32, 32, 8, 3, pad=1))
    sch = s_tir.Schedule(func)
    assert x86_wino.schedule(sch, 256)
    asm = build(sch.mod["main"], {"kind": "llvm", "mcpu": "znver3"}).mod.inspect_source("asm")
    assert "vpmaddwd" in asm and "zmm" not in asm


def test_a_config_that_does_not_divide_is_refused():
    func, _, _ = _kernel(Conv(16, 16, 6, 3, pad=1))  # 9 tiles, one block of outputs
    sch = s_tir.Schedule(func)
    assert not x86_wino.schedule(sch, 256, x86_wino.Config(oc_blocks=2, tile_block=3))
    assert x86_wino.default_config(1, 9, 256) == x86_wino.Config(1, 3)
    assert x86_wino.default_config(4, 784, 256) == x86_wino.Config(1, 4)
    assert x86_wino.default_config(8, 49, 256) == x86_wino.Config(1, 1)


def test_a_model_quantized_for_a_cpu_without_vnni_runs_its_3x3_convs_as_winograd(tmp_path, monkeypatch):
    """Quantized for an AVX2 Zen 3 in NCHW16c with 8-bit weights (the direct kernels' int16 pair step), the
    stride-1 3x3 convs between INT8 kernels (16 channels and more) are the Winograd kernel; the first conv (3
    channels) and the last (a float32 NCHW output) stay direct, and so does every conv on the 7-bit default
    (the faster ``vpmaddubsw`` step). Where this CPU runs AVX2, the outputs equal the direct kernels' bit for
    bit."""
    from onnx import helper

    import tvmfuse
    from tvmfuse import targets
    from tvmfuse.passes.int8 import kernels

    from helpers.quantize import conv, model, random_batches

    rng = np.random.default_rng(4)
    layers = [conv(rng, "x", "c1", 3, 16, "conv1"), (helper.make_node("Relu", ["c1"], ["h1"]), []),
              conv(rng, "h1", "c2", 16, 32, "conv2"), (helper.make_node("Relu", ["c2"], ["h2"]), []),
              conv(rng, "h2", "c3", 32, 32, "conv3"), (helper.make_node("Relu", ["c3"], ["h3"]), []),
              conv(rng, "h3", "y", 32, 8, "conv4")]
    onnx_model = model(layers, [("x", [1, 3, 11, 13])], [("y", [1, 8, 11, 13])])
    znver3, table = {"kind": "llvm", "mcpu": "znver3"}, tmp_path / "t.json"
    calib = random_batches((1, 3, 11, 13), 3, 5)
    wino = tvmfuse.quantize(onnx_model, calib=calib, method="minmax", target=znver3, table=table, layout="blocked",
                            cache=False, weight_bits=8)
    layouts = [str(f.attrs["tvmfuse.layout"]) for _, f in wino.lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.layout" in f.attrs]
    assert sum("Winograd" in layout for layout in layouts) == 2, layouts
    assert "vpmaddwd" in wino.kernel_source("asm")
    seven = tvmfuse.quantize(onnx_model, table=table, target=znver3, layout="blocked", cache=False)
    assert "winograd_product" not in seven.lowered.script()
    monkeypatch.setattr(kernels, "WINOGRAD", False)
    direct = tvmfuse.quantize(onnx_model, table=table, target=znver3, layout="blocked", cache=False, weight_bits=8)
    assert "winograd_product" not in direct.lowered.script()
    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        return
    for batch in random_batches((1, 3, 11, 13), 2, 9):
        for got, want in zip(wino.run(batch), direct.run(batch)):
            np.testing.assert_array_equal(got, want)


def test_an_imported_qdq_model_with_full_range_weights_runs_its_3x3_convs_as_winograd(tmp_path, monkeypatch):
    """onnxruntime's QDQ model with full-range int8 weights (``reduce_range=False``, its default), compiled for
    an AVX2 Zen 3: its codes do not fit the ``vpmaddubsw`` step, so the 3x3 stride-1 convs between NCHW16c
    kernels are the Winograd kernel; where this CPU runs AVX2, the outputs equal the direct build's."""
    from onnx import helper

    import tvmfuse
    from tvmfuse import targets
    from tvmfuse.passes.int8 import kernels

    from helpers.qdq import ort_quantize
    from helpers.quantize import conv, model

    rng = np.random.default_rng(5)
    layers = [conv(rng, "x", "c1", 3, 16, "conv1"), (helper.make_node("Relu", ["c1"], ["h1"]), []),
              conv(rng, "h1", "c2", 16, 32, "conv2"), (helper.make_node("Relu", ["c2"], ["h2"]), []),
              conv(rng, "h2", "c3", 32, 32, "conv3"), (helper.make_node("Relu", ["c3"], ["h3"]), []),
              conv(rng, "h3", "y", 32, 8, "conv4")]
    qdq = ort_quantize(model(layers, [("x", [1, 3, 12, 10])], [("y", [1, 8, 12, 10])]), tmp_path,
                       reduce_range=False)
    znver3 = {"kind": "llvm", "mcpu": "znver3"}
    wino = tvmfuse.compile(qdq, target=znver3, cache=False)
    layouts = [str(f.attrs["tvmfuse.layout"]) for _, f in wino.lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.layout" in f.attrs]
    assert sum("Winograd" in layout for layout in layouts) == 2, layouts
    monkeypatch.setattr(kernels, "WINOGRAD", False)
    direct = tvmfuse.compile(qdq, target=znver3, cache=False)
    assert "winograd_product" not in direct.lowered.script()
    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        return
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 3, 12, 10)).astype(np.float32)
        np.testing.assert_array_equal(wino.run({"x": x})[0], direct.run({"x": x})[0])
