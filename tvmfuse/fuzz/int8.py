"""Random INT8 kernel cases, each built as compile builds it and compared bit for bit with its numpy reference.

A case (:class:`KernelCase`, drawn by :func:`random_case`) is one conv2d, depthwise conv2d (multiplier 1) or
dense with random shapes (channel counts that are and are not multiples of 4 and 16, batch 1-2, non-square
maps), kernel 1-7, strides 1/2, dilation 1/2, asymmetric padding, input and output zero points, output
dtype (uint8, int8, or float32 dequantized), activation (none, relu, relu6, hardswish), and an optional uint8/int8
residual, added after codes requantized first (a QDQ model's residual add, ``int8.Requantized``) in some of
them; one case in six draws only the ends of the ranges (0/255 inputs, -127/127 weights, or -64/64 where the
target's kernels take 7-bit weights: ``passes.int8.kernels.weight_limit``).

The kernel comes from the family registry (``families.FAMILIES[family].int8``: compute and weight packing)
and is scheduled by the target's backend from its ``tvmfuse.family`` attribute, as ``ScheduleKernels`` does
in a compile (on x86: VNNI, the exact AVX2 16x4 step, or the generic step, by the target's features). The
reference is :mod:`tvmfuse.schedules.computes.int8_ref`, whose arithmetic the kernels repeat operation by operation:
every output, float32 ones included, must be equal. (Grouped convolutions have no INT8 kernel; the quantized
graphs of :func:`tvmfuse.fuzz.check.check_quantized` cover them staying FP32.)
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from tvmfuse import targets
from tvmfuse.schedules import families
from tvmfuse.schedules.computes import int8, int8_ref

from .check import HOST, OutputCheck, Result, one_line

FAMILIES = tuple(f.name for f in (families.CONV2D, families.DEPTHWISE_CONV2D, families.DENSE))
CODE_RANGE = {"uint8": (0, 255), "int8": (-127, 127)}  # weights: -128 excluded (int8.py)


@dataclasses.dataclass(frozen=True)
class KernelCase:
    """One INT8 kernel and its parameters. Dense uses ``channels`` as K, ``out_channels`` as N, ``batch`` as
    M and ignores the window fields."""

    family: str
    batch: int
    channels: int
    out_channels: int
    size: tuple[int, int] = (1, 1)
    kernel: int = 1
    strides: int = 1
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    dilation: int = 1
    input_zero_point: int = 0
    out_dtype: str = "uint8"
    zero_point: int = 0
    out_scale: float = 0.05  # s_y: relu6's bound in codes
    activation: str | None = None
    residual: str | None = None  # the residual's dtype
    residual_zero_point: int = 0
    residual_scale: float = 0.5
    extreme: bool = False
    seed: int = 0
    # (dtype, zero point, scale / out_scale) of codes requantized before the residual add (int8.Requantized):
    # the residual's scale is then residual_scale * out_scale, in real units
    requantized: tuple | None = None

    @property
    def matmul(self) -> bool:
        return families.FAMILIES[self.family].matmul

    @property
    def conv(self) -> dict:
        if self.matmul:
            return {}
        return {"strides": self.strides, "padding": self.padding, "dilation": self.dilation}

    def in_shape(self) -> tuple[int, ...]:
        if self.matmul:
            return self.batch, self.channels
        return (self.batch, self.channels) + tuple(self.size)

    def weight_shape(self) -> tuple[int, ...]:
        """Unpacked, output channel first: OIHW, depthwise ``[C, 1, k, k]``, dense ``[N, K]``."""
        if self.matmul:
            return self.out_channels, self.channels
        depthwise = families.FAMILIES[self.family] is families.DEPTHWISE_CONV2D
        return self.out_channels, 1 if depthwise else self.channels, self.kernel, self.kernel

    def out_shape(self) -> tuple[int, ...]:
        if self.matmul:
            return self.batch, self.out_channels
        top, left, bottom, right = self.padding
        span = self.dilation * (self.kernel - 1) + 1
        h, w = self.size
        return (self.batch, self.out_channels, (h + top + bottom - span) // self.strides + 1,
                (w + left + right - span) // self.strides + 1)

    def epilogue(self) -> int8.Epilogue:
        # A hardswish works on real values: the residual's scale R = s_r / s_y becomes s_r.
        real = self.out_scale if self.activation == "hardswish" or self.requantized else 1.0
        res = int8.Residual(self.residual_zero_point, self.residual_scale * real) if self.residual else None
        ep = int8.Epilogue.make(self.out_dtype, self.zero_point, self.out_scale, self.activation, res)
        if self.requantized is None:
            return ep
        dtype, zero_point, scale = self.requantized
        return dataclasses.replace(ep, requantized=int8.Requantized(dtype, zero_point, scale * self.out_scale,
                                                                    self.out_scale))

    def describe(self) -> str:
        shape = "x".join(map(str, self.in_shape()))
        text = f"{self.family} {shape} -> {self.out_channels}"
        if not self.matmul:
            text += f" k{self.kernel} s{self.strides} d{self.dilation} pad{list(self.padding)}"
        text += f" za={self.input_zero_point} -> {self.out_dtype}"
        text += f" zy={self.zero_point}" if self.out_dtype != "float32" else ""
        text += f" {self.activation}" if self.activation else ""
        text += f" +residual {self.residual} zr={self.residual_zero_point}" if self.residual else ""
        text += f" after {self.requantized[0]} codes zq={self.requantized[1]}" if self.requantized else ""
        return text + (" extreme" if self.extreme else "")


def random_case(seed: int, family: str | None = None) -> KernelCase:
    """A random :class:`KernelCase` (``family`` random unless given); the same case for the same seed."""
    rng = np.random.default_rng(seed)
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    family = family or pick(FAMILIES)
    out_dtype = pick(("uint8", "uint8", "int8", "float32"))
    lo, hi = int8.QUANT_RANGE.get(out_dtype, (0, 0))
    zero_point = int(rng.integers(lo + (hi - lo) // 8, hi - (hi - lo) // 4, endpoint=True)) if hi > lo else 0
    residual = pick((None, None, "uint8", "int8"))
    common = dict(input_zero_point=int(rng.integers(0, 256)), out_dtype=out_dtype, zero_point=zero_point,
                  out_scale=float(rng.uniform(0.02, 0.2)), activation=pick((None, "relu", "relu6", "hardswish")),
                  residual=residual, extreme=bool(rng.random() < 1 / 6), seed=seed,
                  residual_zero_point=int(rng.integers(*int8.QUANT_RANGE[residual], endpoint=True)) if residual else 0,
                  residual_scale=float(rng.uniform(0.05, 0.4)))
    if families.FAMILIES[family].matmul:
        return _with_requantized(KernelCase(family, int(rng.integers(1, 5)), int(rng.integers(1, 300)),
                                            int(rng.integers(1, 70)), **common), rng)
    kernel = pick((1, 3, 3, 5, 7))
    dilation = pick((1, 1, 1, 2)) if kernel > 1 else 1
    span = dilation * (kernel - 1) + 1
    size = tuple(int(s) for s in rng.integers(max(1, span - 2 * (kernel // 2)), 20, 2))
    padding = tuple(int(p) for p in rng.integers(0, kernel, 4)) if rng.random() < 0.5 else (kernel // 2,) * 4
    if min(size[0] + padding[0] + padding[2], size[1] + padding[1] + padding[3]) < span:
        padding = (span // 2, span // 2, span - 1 - span // 2, span - 1 - span // 2)
    channels = int(rng.integers(1, 41))
    out = channels if families.FAMILIES[family] is families.DEPTHWISE_CONV2D else int(rng.integers(1, 49))
    return _with_requantized(KernelCase(family, pick((1, 1, 2)), channels, out, size, kernel, pick((1, 2)), padding,
                                        dilation, **common), rng)


def _with_requantized(case: KernelCase, rng) -> KernelCase:
    """``case`` with its codes requantized before the residual add (a QDQ model's ``Q, DQ, Add, Q``) one time in
    two where it can take that (a residual, a uint8/int8 output, no hardswish); drawn last, so the other
    fields of a seed's case stay as they were."""
    draw = rng.random(3)
    if not case.residual or case.out_dtype == "float32" or case.activation == "hardswish" or draw[0] < 0.5:
        return case
    dtype = "uint8" if draw[1] < 0.7 else "int8"
    lo, hi = int8.QUANT_RANGE[dtype]
    return dataclasses.replace(case, requantized=(dtype, int(lo + draw[2] * (hi - lo)), float(0.5 + 1.5 * draw[2])))


def _codes(rng, shape, dtype: str, extreme: bool, weight_limit: int = 0) -> np.ndarray:
    """Random codes; weights (``weight_limit``: their largest code) stay in [-weight_limit, weight_limit], within
    [-127, 127] (the kernels' convention); ``extreme`` draws only the ends."""
    lo, hi = ((max(CODE_RANGE[dtype][0], -weight_limit), min(CODE_RANGE[dtype][1], weight_limit)) if weight_limit
              else int8.QUANT_RANGE[dtype])
    if extreme:
        return rng.choice(np.array([lo, hi], dtype), size=shape)
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def case_data(case: KernelCase, limit: int = 127) -> dict:
    """Seeded operands: ``x``, unpacked ``weight``, original int32 ``bias``, float32 ``multiplier``,
    ``residual`` (or None). The multipliers put the accumulator's spread (about ``74 * 73 * sqrt(fan_in)``
    for uniform codes) at some tens of output codes, so outputs neither all saturate nor collapse (a
    hardswish's, in real units, at some tens of ``s_y``)."""
    rng = np.random.default_rng([case.seed, 1])
    weight = _codes(rng, case.weight_shape(), "int8", case.extreme, weight_limit=limit)
    fan_in = int(np.prod(case.weight_shape()[1:]))
    spread = 74.0 * 73.0 * np.sqrt(fan_in) * (2.0 if case.extreme else 1.0)
    return {"x": _codes(rng, case.in_shape(), "uint8", case.extreme), "weight": weight,
            "bias": rng.integers(-20000, 20001, case.out_channels).astype(np.int32),
            "multiplier": (rng.uniform(10, 60, case.out_channels) / spread
                           * (case.out_scale if case.activation == "hardswish" else 1.0)).astype(np.float32),
            "residual": _codes(rng, case.out_shape(), case.residual, case.extreme) if case.residual else None}


def _operands(case: KernelCase, spec) -> tuple[dict, np.ndarray, bool]:
    """The case's operands (:func:`case_data`) with the weight codes in the range compile quantizes to for
    ``spec``, the weight as compile packs it for the family's NCHW INT8 kernel there, and whether the kernel
    is marked to add product pairs in int16 (``int8.EXACT_PAIRS_ATTR``)."""
    from tvmfuse.passes.int8.kernels import exact_pairs, packed_weight, tiles_pack, weight_limit

    family, weights = families.FAMILIES[case.family].int8, spec.backend().int8_weights
    data = case_data(case, weight_limit(family, weights))
    pack = tiles_pack(family, data["weight"], weights) or family.pack  # AMX targets: conv2d on tiles, as compile
    packed = packed_weight(family, data["weight"], pack, weights)
    return data, packed, exact_pairs(family, packed, weights)


def _signed(case: KernelCase, spec) -> bool:
    """Whether the kernel sums ``x - 128`` in int8 (``signed_data``: the CUDA tensor cores' s8 x s8), as compile
    asks it for ``spec`` (``passes.int8.kernels.signed_data``)."""
    return spec.backend().int8_weights == "signed" and families.FAMILIES[case.family].int8.signed_data


def _kernel(case: KernelCase, spec):
    """The case's kernel as compile makes it, scheduled by ``spec``'s backend, its output ``te.Tensor``, and whether
    it is scheduled for a serial run on this CPU (a GPU backend's: ``Backend.serial_check_schedule``)."""
    from tvm import te

    family = families.FAMILIES[case.family]
    channels = case.out_channels
    _, weight, exact = _operands(case, spec)
    tensors = [te.placeholder(case.in_shape(), "uint8", name="data"),
               te.placeholder(weight.shape, str(weight.dtype), name="weight"),
               te.placeholder((channels,), "int32", name="bias"),
               te.placeholder((channels,), "float32", name="multiplier")]
    res = te.placeholder(case.out_shape(), case.residual, name="residual") if case.residual else None
    compute = families.resolve(family.int8.compute)
    signed = {"signed_data": True} if _signed(case, spec) else {}
    out = compute(*tensors, res, channels=channels, input_zero_point=case.input_zero_point,
                  epilogue=case.epilogue(), **signed, **case.conv)
    func = int8.prim_func(tensors + ([res] if res is not None else []) + [out])
    func = func.with_attr(int8.EXACT_PAIRS_ATTR, True) if exact else func
    func = func.with_attr("tvmfuse.family", families.int8_kernel_name(family))
    serial = spec.backend().serial_check_schedule(func)
    if serial is not None:
        return serial, out, True
    # then the backend's kernel passes, as a compile runs them (on AMX: the tile shapes loaded, SIGILL without)
    import tvm

    scheduled = tvm.IRModule({"main": spec.backend().schedule(func)})
    return tvm.transform.Sequential(spec.backend().kernel_passes())(scheduled)["main"], out, False


def _library(func, spec, serially: bool):
    """``func`` (from :func:`_kernel`) built: for this CPU, its threads run serially (:mod:`.cuda_cpu`), where it
    was scheduled for a serial run; else for ``spec``'s target."""
    import tvm

    if serially:
        from .cuda_cpu import build, serial

        return build(serial(func))
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=spec.tvm_target(),
                       tir_pipeline=spec.backend().tir_pipeline())


def build(case: KernelCase, target=HOST):
    """The case's kernel as compile makes it, scheduled by ``target``'s backend, built: ``(library, output
    te.Tensor)``; the library's ``main`` takes ``(x, weight, bias, multiplier[, residual], out)``. A GPU
    target's kernel is built for this CPU, its threads run serially (:mod:`.cuda_cpu`)."""
    spec = targets.resolve(target)
    func, out, serially = _kernel(case, spec)
    return _library(func, spec, serially), out


def run_case(case: KernelCase, target=HOST) -> tuple[np.ndarray, np.ndarray]:
    """(kernel output, reference output) of the case on its seeded operands. A GPU target's kernel runs on
    this CPU (:mod:`.cuda_cpu`), its blocks in order and in reverse: the output is the run that differs from
    the reference, if either does."""
    import tvm

    spec = targets.resolve(target)
    d, packed, _ = _operands(case, spec)
    family = families.FAMILIES[case.family]
    shift = int8.SIGNED_SHIFT if _signed(case, spec) else 0
    args = [d["x"], packed,
            int8_ref.fold_zero_point(d["bias"], d["weight"], case.input_zero_point - shift), d["multiplier"]]
    args += [d["residual"]] if d["residual"] is not None else []
    window = {"input_zero_point": case.input_zero_point, **case.conv}
    want = families.resolve(family.int8.reference)(d["x"], d["weight"], d["bias"], d["multiplier"], d["residual"],
                                   epilogue=case.epilogue(), **window)
    func, _, serially = _kernel(case, spec)
    lib = _library(func, spec, serially)
    result = tvm.runtime.tensor(np.zeros(case.out_shape(), case.out_dtype))
    lib["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in args], result)
    if not serially or not np.array_equal(result.numpy(), want):
        return result.numpy(), want
    from .cuda_cpu import block_orders, outputs, serial

    backward = serial(func, reverse_blocks=True)
    return outputs(backward, block_orders(backward) + args + [np.zeros(case.out_shape(), case.out_dtype)]), want


def check_case(case: KernelCase, target=HOST) -> Result:
    """Build and run the case; ``ok`` only when every output equals the reference's. A mismatch says how
    many elements differ (``worst``) and by how much at most (``max_abs``)."""
    start = time.perf_counter()
    label = f"int8 {targets.resolve(target).name}"
    try:
        got, want = run_case(case, target)
    except Exception as exc:  # noqa: BLE001 - one failing case must not end a campaign
        return Result(label, "error", stage="build/run", error=one_line(exc), seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if got.shape != want.shape:
        inf = float("inf")
        check = OutputCheck(case.describe(), inf, inf, inf, f"shape {got.shape} != {want.shape}")
        return Result(label, "mismatch", [check], seconds=seconds)
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    wrong = int(np.count_nonzero(diff))
    message = f"{wrong} of {diff.size} elements differ, by up to {diff.max():g}" if wrong else ""
    check = OutputCheck(case.describe(), float(diff.max(initial=0)), wrong / max(diff.size, 1), float(wrong), message)
    return Result(label, "mismatch" if wrong else "ok", [check], seconds=seconds)
