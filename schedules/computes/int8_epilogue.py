"""The INT8 kernels' epilogue: what happens to the int32 accumulator of one output element (requantize,
clip, residual add, hardswish), as TE and as the dataclasses that describe it. The arithmetic and why it is
bit-exact against :mod:`tvmfuse.schedules.computes.int8_ref` are in :mod:`tvmfuse.schedules.computes.int8`'s docstring."""

from __future__ import annotations

import dataclasses

import numpy as np
import tvm
from tvm import te, tirx

from tvmfuse.errors import TvmfuseError

# TVM 0.27 marks round, floor and the like vectorizable, not nearbyint: VectorizeLoop then turns a vector loop
# whose body holds one (every requantize) into a serial loop of scalar lanes, which LLVM's SLP pass may or may
# not put back together (a requantize of 451,584 codes alone, AVX2 code on Zen 4: 239 us so, 91 us as vectors).
if tvm.ir.Op.get("tirx.nearbyint").get_attr("TVectorizable") is None:
    tvm.ir.register_op_attr("tirx.nearbyint", "TVectorizable", True)

EPILOGUE = "requantize"
TABLE_STAGE = "table_lookup"  # after EPILOGUE (which then writes int32 codes) when the epilogue has a table
TABLE_SIZE = 256  # codes of a uint8/int8 value: a table entry per code
QUANT_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}
# int32: the accumulator with the bias added, nothing else (no multiplier): for a caller that finishes in
# int32, as ONNX's MatMulInteger does (:mod:`tvmfuse.frontend.integer_matmul`).
OUT_DTYPES = ("uint8", "int8", "float32", "int32")


class Int8KernelError(TvmfuseError, ValueError):
    """The operands or parameters of an INT8 kernel do not fit together (shape, dtype, epilogue)."""


@dataclasses.dataclass(frozen=True)
class Residual:
    """A residual input added before requantization: its zero point and ``R = s_r / s_y`` (float32
    output: ``R = s_r``). ``scale`` is stored rounded to float32, the precision the kernel uses."""

    zero_point: int
    scale: float

    def __post_init__(self):
        object.__setattr__(self, "scale", float(np.float32(self.scale)))
        object.__setattr__(self, "zero_point", int(self.zero_point))


@dataclasses.dataclass(frozen=True)
class HardSwish:
    """``v * clip(v + shift, lo, hi) * scale + offset`` on the real value ``v``: ONNX HardSwish is shift 3, lo 0,
    hi 6, ``scale = 1/6`` and offset 0; a quantized output folds ``1 / s_y`` into ``scale`` and ``offset``, and
    a constant scale ``a`` and shift ``b`` after the activation (Paddle's learnable affine block) make them
    ``a / 6`` and ``b``. With an offset the last multiply and the add are one fused multiply-add (one rounding,
    as ``int8_ref.fma32``). The kernel uses the constants rounded to its float type (:meth:`constants`)."""

    shift: float = 3.0
    lo: float = 0.0
    hi: float = 6.0
    scale: float = 1.0 / 6.0
    offset: float = 0.0

    def __post_init__(self):
        if not (np.isfinite(self.scale) and np.isfinite(self.offset) and self.lo <= self.hi):
            raise Int8KernelError(f"INT8 epilogue: hardswish needs lo <= hi and a finite scale and offset, got {self}")

    def constants(self, dtype: str) -> tuple[float, float, float, float]:
        """``(lo - shift, hi - shift, shift, scale)`` rounded to ``dtype``: the kernel computes the gate as
        ``clip(v, lo - shift, hi - shift) + shift`` (the same value as ``clip(v + shift, lo, hi)`` for the
        ONNX constants, where every bound is exact)."""
        t = np.float32 if dtype == "float32" else np.float64
        return tuple(float(t(v)) for v in (self.lo - self.shift, self.hi - self.shift, self.shift, self.scale))


@dataclasses.dataclass(frozen=True)
class Requantized:
    """The codes of a tensor that a model adds to the residual, as ONNX Runtime's QDQ models write a residual
    add (``conv -> Q -> DQ``, ``DQ(residual)``, ``Add``, ``Q``): the kernel first computes these codes as if
    they were its output (``dtype``, ``zero_point``, clip bounds in codes, the multiplier's ``s_x * s_w /
    scale``), then adds them to the residual in real values and quantizes the sum, as QuantizeLinear does::

        v = (q - zero_point) * scale + (r - r_zero_point) * r_scale    (float32: each product and the sum rounded)
        y = clip(round_half_even(v / out_scale) + y_zero_point, lo, hi)

    With it, :class:`Epilogue`'s ``residual`` scale is ``r_scale`` (real units) and its dtype, zero point
    and clip are the sum's codes'; ``out_scale`` is the sum's scale."""

    dtype: str
    zero_point: int
    scale: float
    out_scale: float
    clip_min: int | None = None
    clip_max: int | None = None

    def __post_init__(self):
        for name in ("scale", "out_scale"):
            value = float(np.float32(getattr(self, name)))
            if not (np.isfinite(value) and value > 0):
                raise Int8KernelError(f"INT8 epilogue: the requantized codes' {name} must be positive, got {value}")
            object.__setattr__(self, name, value)
        if self.dtype not in QUANT_RANGE:
            raise Int8KernelError(f"INT8 epilogue: requantized codes must be uint8/int8, got {self.dtype!r}")
        lo, hi = self.bounds()
        if lo > hi or not QUANT_RANGE[self.dtype][0] <= self.zero_point <= QUANT_RANGE[self.dtype][1]:
            raise Int8KernelError(f"INT8 epilogue: requantized codes' zero point {self.zero_point} or clip "
                                  f"[{lo}, {hi}] do not fit {self.dtype}")

    def bounds(self) -> tuple[int, int]:
        lo, hi = QUANT_RANGE[self.dtype]
        return (max(lo, int(self.clip_min)) if self.clip_min is not None else lo,
                min(hi, int(self.clip_max)) if self.clip_max is not None else hi)


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What the kernel does with its int32 accumulator (see the module docstring for the arithmetic).

    ``clip_min`` / ``clip_max`` are in the output's domain (codes, or real values for float32); None means
    the dtype's range (no clip for float32). Use :meth:`make` to derive them from an activation.
    """

    out_dtype: str = "uint8"
    zero_point: int = 0
    clip_min: float | None = None
    clip_max: float | None = None
    residual: Residual | None = None
    hardswish: HardSwish | None = None  # applied to the real value before the output's rounding and clip
    # The code computed as above (zero point, clip) is looked up in a 256-entry table of output codes passed to
    # the kernel (:data:`TABLE_SIZE`): an elementwise activation after the kernel, evaluated at compile time.
    table: bool = False
    requantized: Requantized | None = None  # codes requantized before the residual add (see Requantized)

    def __post_init__(self):
        if self.out_dtype not in OUT_DTYPES:
            raise Int8KernelError(f"INT8 epilogue: out_dtype must be one of {OUT_DTYPES}, got {self.out_dtype!r}")
        if self.table and not self.quantized:
            raise Int8KernelError("INT8 epilogue: a table of output codes needs a uint8/int8 output")
        if self.out_dtype == "int32" and (self.residual or self.hardswish or self.clip_min is not None
                                          or self.clip_max is not None or self.zero_point):
            raise Int8KernelError("INT8 epilogue: an int32 output is the accumulator plus the bias; it takes no "
                                  "residual, activation, clip or zero point")
        if self.requantized is not None and (self.residual is None or self.hardswish is not None or not self.quantized
                                             or not all(float(b).is_integer() for b in self.bounds())):
            raise Int8KernelError("INT8 epilogue: requantized codes go with a residual and a uint8/int8 output "
                                  "clipped to whole codes, without a hardswish")
        qmin, qmax = QUANT_RANGE.get(self.out_dtype, (0, 0))
        if not qmin <= self.zero_point <= qmax:
            raise Int8KernelError(f"INT8 epilogue: zero point {self.zero_point} is outside {self.out_dtype}'s range "
                                  f"[{qmin}, {qmax}] (a float32 output has zero point 0)")
        lo, hi = self.bounds()
        if lo is not None and hi is not None and lo > hi:
            raise Int8KernelError(f"INT8 epilogue: empty clip range [{lo}, {hi}] for {self.out_dtype}")

    @property
    def quantized(self) -> bool:
        return self.out_dtype in QUANT_RANGE

    def bounds(self) -> tuple[float | None, float | None]:
        """The clip range applied (dtype range intersected with clip_min/clip_max)."""
        lo, hi = QUANT_RANGE.get(self.out_dtype, (None, None))
        if self.clip_min is not None:
            lo = self.clip_min if lo is None else max(lo, self.clip_min)
        if self.clip_max is not None:
            hi = self.clip_max if hi is None else min(hi, self.clip_max)
        return lo, hi

    @classmethod
    def make(cls, out_dtype: str = "uint8", zero_point: int = 0, scale: float = 1.0, activation: str | None = None,
             residual: Residual | None = None) -> "Epilogue":
        """An epilogue with ``activation`` (None, ``"relu"``, ``"relu6"``, ``"hardswish"``).

        ``scale`` is the output scale ``s_y``: relu6's upper bound is ``zy + round(6 / s_y)``, a hardswish's
        factor ``1 / (6 s_y)``; unused for float32 outputs, whose bounds are 0 and 6 themselves. With a
        hardswish the multipliers and the residual's scale are in real units (see the module docstring).
        """
        if activation not in (None, "relu", "relu6", "hardswish"):
            raise Int8KernelError(f"INT8 epilogue: unsupported activation {activation!r} "
                                  "(None, 'relu', 'relu6', 'hardswish')")
        if activation == "hardswish":
            factor = 1.0 / 6.0 if out_dtype == "float32" else 1.0 / (6.0 * scale)
            return cls(out_dtype, int(zero_point), residual=residual, hardswish=HardSwish(scale=factor))
        lo = hi = None
        if activation is not None:
            lo = 0.0 if out_dtype == "float32" else float(zero_point)
        if activation == "relu6":
            hi = 6.0 if out_dtype == "float32" else float(zero_point + round(6.0 / scale))
        return cls(out_dtype, int(zero_point), lo, hi, residual)


def _requantize(acc, scale, res, ep: Epilogue):
    """The epilogue of one element: ``acc`` int32 (bias included), ``scale`` float32, ``res`` the residual
    code or None. Returns the output value in ``ep.out_dtype``; with ``ep.table``, its table index (int32)."""
    if ep.out_dtype == "int32":
        return acc
    dtype = "float32"
    if ep.requantized is not None:
        value = _requantized_sum(acc, scale, res, ep)
    elif ep.residual is None:
        value = acc.astype("float32") * scale
    else:
        # One explicit fused multiply-add: LLVM may or may not contract a product feeding an add, but an
        # llvm.fma is one rounding on every target (int8_ref.fma32 is its exact numpy twin).
        shift = (res.astype("int32") - ep.residual.zero_point).astype("float32") * tirx.const(ep.residual.scale,
                                                                                               "float32")
        value = tirx.call_llvm_pure_intrin("float32", "llvm.fma", acc.astype("float32"), scale, shift)
    if ep.hardswish is not None:
        # The gate clips before it adds: no multiply feeds an add, so nothing can fuse into an FMA.
        lo, hi, shift, factor = ep.hardswish.constants(dtype)
        gate = tirx.Min(tirx.Max(value, tirx.const(lo, dtype)), tirx.const(hi, dtype)) + tirx.const(shift, dtype)
        if ep.hardswish.offset:
            value = tirx.call_llvm_pure_intrin(dtype, "llvm.fma", value * gate, tirx.const(factor, dtype),
                                               tirx.const(ep.hardswish.offset, dtype))
        else:
            value = value * gate * tirx.const(factor, dtype)
    lo, hi = ep.bounds()
    if ep.quantized and float(lo).is_integer() and float(hi).is_integer():
        code = _rounded_code(value, ep.zero_point, lo, hi)
        return code - QUANT_RANGE[ep.out_dtype][0] if ep.table else code.astype(ep.out_dtype)
    if ep.quantized:
        value = tirx.nearbyint(value) + tirx.const(float(ep.zero_point), dtype)
    elif dtype != "float32":
        value = value.astype("float32")
        dtype = "float32"
    if lo is not None:
        value = tirx.Max(value, tirx.const(float(lo), dtype))
    if hi is not None:
        value = tirx.Min(value, tirx.const(float(hi), dtype))
    if ep.quantized:
        # Through int32: LLVM scalarizes a direct float -> u8/s8 vector conversion (x86 has no such
        # instruction); float -> i32 -> i8 stays vectorized. Exact, the value is a clipped integer.
        code = value.astype("int32")
        return code - QUANT_RANGE[ep.out_dtype][0] if ep.table else code.astype(ep.out_dtype)
    return value


def _product(a, b: float):
    """``a * b`` rounded to float32 and never fused into a following add: ``llvm.fma`` with the addend +0.0,
    which LLVM may not turn back into a multiply (``-0.0`` differs) nor contract further."""
    return tirx.call_llvm_pure_intrin("float32", "llvm.fma", a, tirx.const(b, "float32"), tirx.const(0.0, "float32"))


def _requantized_sum(acc, scale, res, ep: Epilogue):
    """The real value of :class:`Requantized`'s sum, divided by its scale (rounded and clipped by the caller)."""
    rq = ep.requantized
    lo, hi = rq.bounds()
    code = _rounded_code(acc.astype("float32") * scale, rq.zero_point, lo, hi)
    mine = _product((code - rq.zero_point).astype("float32"), rq.scale)
    other = _product((res.astype("int32") - ep.residual.zero_point).astype("float32"), ep.residual.scale)
    return (mine + other) / tirx.const(rq.out_scale, "float32")


# 1.5 * 2^23: every float32 from 2^23 to 2^24 is an integer, so ``u + ROUNDER`` for |u| < 2^22 is rounded to
# ``ROUNDER + nearbyint(u)`` (half to even: ROUNDER is even) and the integer sits in the sum's low mantissa bits.
ROUNDER = 1.5 * 2**23
ROUNDER_BITS = 0x4B400000  # its float32 bit pattern


def _rounded_code(value, zero_point: int, lo: float, hi: float):
    """``clip(nearbyint(value) + zero_point, lo, hi)`` as int32, for integer bounds: the value clipped to
    ``[lo - zp, hi - zp]`` first (the same result: rounding is monotonic and keeps integers), then rounded by
    adding :data:`ROUNDER` and reading the sum's bits back as an integer. Two vector operations (an add and an
    integer add) instead of a rounding, an add and a float -> int conversion: the INT8 epilogue runs once per
    output, as often as a depthwise kernel's multiply-adds. Exact wherever float32 arithmetic rounds to
    nearest, as nearbyint does, on every target."""
    zp = int(zero_point)
    clipped = tirx.Min(tirx.Max(value, tirx.const(float(lo) - zp, "float32")), tirx.const(float(hi) - zp, "float32"))
    bits = tirx.reinterpret("int32", clipped + tirx.const(ROUNDER, "float32"))
    return bits + tirx.const(zp - ROUNDER_BITS, "int32")


def table_index(codes: np.ndarray, out_dtype: str) -> np.ndarray:
    """The table entry of each code (uint8: the code; int8: the code + 128)."""
    return np.asarray(codes).astype(np.int32) - QUANT_RANGE[out_dtype][0]


def check_table(kernel: str, table, ep: Epilogue) -> None:
    """A table tensor is given exactly when ``ep.table``, and holds :data:`TABLE_SIZE` output codes."""
    if (table is None) == ep.table:
        raise Int8KernelError(f"{kernel}: a table tensor needs Epilogue.table, and vice versa")
    if table is not None and ([int(d) for d in table.shape] != [TABLE_SIZE] or str(table.dtype) != ep.out_dtype):
        raise Int8KernelError(f"{kernel}: table must be [{TABLE_SIZE}] {ep.out_dtype}, got "
                              f"{[int(d) for d in table.shape]} {table.dtype}")


def _epilogue_stage(acc_at, bias, multiplier, residual, ep: Epilogue, out_shape: list[int], table=None):
    """The ``requantize`` stage: ``acc_at(*index)`` reads the accumulator of one output element. A 5-D
    ``out_shape`` is NCHW16c: the channel of ``(b, cb, y, x, ci)`` is ``cb * 16 + ci``. With ``ep.table`` it
    writes table indices and a :data:`TABLE_STAGE` stage looks them up in ``table`` (a stage of its own, so that
    a backend can do the lookups a vector at a time)."""

    def body(*idx):
        channel = idx[1] * out_shape[4] + idx[4] if len(out_shape) == 5 else idx[1]
        res = residual[idx] if residual is not None else None
        scale = multiplier[channel] if multiplier is not None else None
        return _requantize(acc_at(*idx) + bias[channel], scale, res, ep)

    codes = te.compute(out_shape, body, name=EPILOGUE)
    return te.compute(out_shape, lambda *i: table[codes[i]], name=TABLE_STAGE) if ep.table else codes
