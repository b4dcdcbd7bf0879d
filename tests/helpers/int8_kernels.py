"""Shared pieces of the INT8 kernel tests (test_schedule_x86_int8*.py): build and run a PrimFunc here, random
codes and epilogues, the conv case description, and the ways a rule is exercised (:data:`MODES`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import te

from tvmfuse import targets
from tvmfuse.schedules.computes import int8, int8_ref
from tvmfuse.schedules.x86 import int8_conv2d

from . import HOST

HOST_BITS = targets.resolve(HOST).vector_bits()
AVX512 = "x86-avx512"


def build(func, target=HOST):
    spec = targets.resolve(target)
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=spec.tvm_target())


def run(func, args, out):
    """Run ``func`` on numpy ``args``; ``out`` is the output te.Tensor (for shape and dtype)."""
    result = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype)))
    build(func).mod["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args], result)
    return result.numpy()


OUT_SCALE = 0.043  # s_y of the epilogues below


AFFINE = (-0.83, 0.37)  # the scale and shift after a "hardswish_affine" (negative: the gate's sign flips)


# A QDQ model's residual add after the kernel's own codes (int8.Requantized): those codes' zero point and scale,
# and the residual's scale in real units. Sized so that both terms move the sum by tens of codes.
REQUANTIZED = {"uint8": (121, 0.03), "int8": (-5, 0.03)}
REQUANTIZED_RESIDUAL_SCALE = 0.02


def epilogue(out_dtype, act, residual):
    """An epilogue with ``act`` (None, relu, relu6 or hardswish: ``v * clip(v + 3, 0, 6) / 6`` on the real
    value, whose multipliers and residual scale are then real units, see :func:`kernel_data`; hardswish_affine:
    the hardswish times ``AFFINE[0]`` plus ``AFFINE[1]``, a learnable affine block; requantized: the codes are
    requantized (uint8, :data:`REQUANTIZED`) and added to the residual, requantized_relu: a relu before that
    and after the add, requantized_int8: int8 codes in between)."""
    if act is not None and act.startswith("requantized"):
        return requantized_epilogue(out_dtype, act, residual)
    hardswish = act in ("hardswish", "hardswish_affine")
    res = int8.Residual(zero_point=-7 if residual == "int8" else 131, scale=0.013 if hardswish else 0.61) \
        if residual else None
    zero_point = {"uint8": 9, "int8": -4, "float32": 0}[out_dtype]
    ep = int8.Epilogue.make(out_dtype, zero_point, OUT_SCALE, "hardswish" if hardswish else act, res)
    if act == "hardswish_affine":
        s_y = 1.0 if out_dtype == "float32" else OUT_SCALE
        hs = dataclasses.replace(ep.hardswish, scale=ep.hardswish.scale * AFFINE[0], offset=AFFINE[1] / s_y)
        ep = dataclasses.replace(ep, hardswish=hs)
    return ep


def requantized_epilogue(out_dtype, act, residual):
    """:func:`epilogue`'s requantized forms (they need a residual and a uint8/int8 output)."""
    assert residual and out_dtype != "float32", "a requantized epilogue adds a residual to uint8/int8 codes"
    codes_dtype = "int8" if act == "requantized_int8" else "uint8"
    zero_point, scale = REQUANTIZED[codes_dtype]
    relu = act == "requantized_relu"
    requantized = int8.Requantized(codes_dtype, zero_point, scale, OUT_SCALE, clip_min=zero_point if relu else None)
    res = int8.Residual(zero_point=-7 if residual == "int8" else 131, scale=REQUANTIZED_RESIDUAL_SCALE)
    out_zero_point = {"uint8": 9, "int8": -4}[out_dtype]
    return int8.Epilogue(out_dtype, out_zero_point, out_zero_point if relu else None, None, res,
                         requantized=requantized)


def codes(rng, shape, dtype, extreme, limit=127):
    """Random codes of ``dtype``; ``extreme`` draws only the two ends of the range (weights: +-limit)."""
    lo, hi = {"uint8": (0, 255), "int8": (-limit, limit)}[dtype]
    if extreme:
        return rng.choice(np.array([lo, hi], dtype), size=shape)
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def kernel_data(rng, out_shape, channels, residual, extreme, act=None):
    """Bias, multipliers and residual codes. A hardswish's multipliers map the accumulators to real values
    of a few units, so the kernels are checked where its gate is neither 0 nor 6 as well."""
    bias = rng.integers(-20000, 20000, channels).astype("int32")
    scale = 0.002 if extreme else 0.01
    if act in ("hardswish", "hardswish_affine"):
        scale /= 1000
    multiplier = (rng.random(channels) * scale + scale / 10).astype("float32")
    res = codes(rng, out_shape, residual, extreme) if residual else None
    return bias, multiplier, res


# How the tests schedule an INT8 conv2d or dense kernel. The weight layout goes with the mode: int16 pairs
# (int8_ref.to_pairs) for the pair steps, int8 16x4 blocks otherwise.
#   host           pairs at the host's vector width: what the INT8 passes hand a CPU without VNNI
#   avx2           pairs, 256-bit step (the AVX2 path, on any AVX2 host)
#   pairs-generic  pairs, the step's description as code
#   generic        int8 blocks, the generic step
#   vnni-tiles     int8 blocks, the VNNI tiling with the generic step (checks it on CPUs without VNNI)
#   maddubs        7-bit int8 blocks marked exact for pairs (int8.EXACT_PAIRS_ATTR), 256-bit vpmaddubsw step:
#                  what the INT8 passes hand a CPU without VNNI for the weights they quantize
MODES = ("host", "avx2", "pairs-generic", "generic", "vnni-tiles", "maddubs")


def weight_codes(rng, shape, mode, extreme):
    """Weight codes for ``mode``: 7-bit (``int8_ref.PAIR_SAFE_CODE``) for the vpmaddubsw steps."""
    return codes(rng, shape, "int8", extreme, int8_ref.PAIR_SAFE_CODE if mode.startswith("maddubs") else 127)


def pairs(mode: str) -> bool:
    """Whether ``mode`` takes the weight as int16 pairs."""
    return mode in ("host", "avx2", "pairs-generic")


def weight_placeholder(blocks: tuple, mode: str, name: str = "w"):
    """The packed weight's placeholder: ``blocks`` is the int8 16x4-block shape."""
    if pairs(mode):
        return te.placeholder(tuple(blocks[:-2]) + (2, 16, 2), "int16", name=name)
    return te.placeholder(tuple(blocks), "int8", name=name)


def packed_for(packed: np.ndarray, mode: str) -> np.ndarray:
    """An int8 16x4-block weight in the layout ``mode`` takes."""
    return int8_ref.to_pairs(packed) if pairs(mode) else packed


def schedule_with(rule, func, mode, default_config):
    """Schedule ``func`` (built with :func:`weight_placeholder`'s layout for ``mode``) as ``mode`` says."""
    if mode == "host":
        return rule.apply(func, HOST_BITS, False)
    if mode == "avx2":
        return rule.apply(func, 256, False)
    if mode.startswith("maddubs"):
        return rule.apply(func.with_attr(int8.EXACT_PAIRS_ATTR, True), 512 if mode == "maddubs512" else 256, False)
    if mode in ("generic", "pairs-generic"):
        return rule.apply(func, HOST_BITS, False, dataclasses.replace(default_config(HOST_BITS, False), dot="generic"))
    return rule.apply(func, 512, True, dataclasses.replace(default_config(512, True), dot="generic"))


# ----------------------------------------------------------------------------------------------- conv2d


@dataclasses.dataclass(frozen=True)
class Conv:
    c: int
    o: int
    hw: int | tuple[int, int]
    k: int
    stride: int = 1
    pad: int | tuple[int, int, int, int] = 0  # or (top, left, bottom, right)
    dilation: int = 1
    act: str | None = None
    out: str = "uint8"
    residual: str | None = None
    za: int = 37
    n: int = 1

    def in_shape(self) -> tuple[int, ...]:
        h, w = (self.hw, self.hw) if isinstance(self.hw, int) else self.hw
        return self.n, self.c, h, w

    def out_shape(self) -> tuple[int, ...]:
        top, left, bottom, right = (self.pad,) * 4 if isinstance(self.pad, int) else self.pad
        span = self.dilation * (self.k - 1) + 1
        _, _, h, w = self.in_shape()
        return self.n, self.o, (h + top + bottom - span) // self.stride + 1, (w + left + right - span) // self.stride + 1


def conv_kernel(case: Conv, mode: str = "generic"):
    """The INT8 conv2d compute of ``case`` (weights in ``mode``'s layout) as a PrimFunc, and its output tensor."""
    x = te.placeholder(case.in_shape(), "uint8", name="x")
    w = weight_placeholder((-(-case.o // 16), -(-case.c // 4), case.k, case.k, 16, 4), mode)
    b, m = te.placeholder((case.o,), "int32", name="b"), te.placeholder((case.o,), "float32", name="m")
    r = te.placeholder(case.out_shape(), case.residual, name="r") if case.residual else None
    out = int8.conv2d_compute(x, w, b, m, r, out_channels=case.o, strides=case.stride, padding=case.pad,
                              dilation=case.dilation, input_zero_point=case.za,
                              epilogue=epilogue(case.out, case.act, case.residual))
    return int8.prim_func([x, w, b, m] + ([r] if r is not None else []) + [out]), out


def check_conv(case: Conv, mode: str, extreme: bool = False, seed: int = 0):
    """``case`` scheduled as ``mode`` runs it, on random codes (``extreme``: the range's ends only), equals
    ``int8_ref``; returns the reference."""
    func, out = conv_kernel(case, mode)
    ow = case.out_shape()[3]
    sched = schedule_with(int8_conv2d, func, mode,
                      lambda bits, vnni_: int8_conv2d.default_config(-(-case.o // 16), ow, bits, vnni_))
    assert sched is not None
    rng = np.random.default_rng(seed)
    x = codes(rng, case.in_shape(), "uint8", extreme)
    w = weight_codes(rng, (case.o, case.c, case.k, case.k), mode, extreme)
    bias, mult, res = kernel_data(rng, case.out_shape(), case.o, case.residual, extreme, case.act)
    args = [x, packed_for(int8_ref.pack_conv2d_weight(w), mode), int8_ref.fold_zero_point(bias, w, case.za), mult]
    got = run(sched, args + ([res] if res is not None else []), out)
    ref = int8_ref.conv2d_ref(x, w, bias, mult, res, strides=case.stride, padding=case.pad,
                              dilation=case.dilation, input_zero_point=case.za,
                              epilogue=epilogue(case.out, case.act, case.residual))
    np.testing.assert_array_equal(got, ref)
    return ref
