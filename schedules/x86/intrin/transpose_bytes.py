"""A 16 x 16 byte transpose in registers: 16 pixels of a NCHW16c row (256 contiguous bytes) to 16 NCHW rows.

What it computes (the description)::

    B[c, x] = A[x, c]      for c, x < 16
    A: (16, 16) uint8 or int8, 16 pixels of one channel block (contiguous)
    B: (16, 1, 16), 16 pixels of 16 channels (one channel plane to the next ``s`` bytes; the middle axis is
       the image row, so that the region matches NCHW's, whose channel axis comes before the row)

Vectorized by TVM, one side of a transpose is strided, and LLVM moved bytes one at a time (an extract and an
insert each): the INT8 layout transform back to NCHW of a 96 x 160 x 160 map took 351 us alone with AVX2 code
on Zen 4 (95 us this way; in a model, where the transforms wait on memory, 720 -> 660 us for all of
ch_ppocrv4_det's). Here the 16 pixel vectors go through four rounds of interleaves of 1, 2, 4 and 8 bytes (each a
``punpckl*``/``punpckh*`` of two registers; the pixels enter in bit-reversed order so that each result holds
one channel's pixels in order): 16 loads, 64 interleaves, 16 stores per 256 bytes.
"""

from __future__ import annotations

import functools

from tvm import script
from tvm.s_tir import TensorIntrin

SIDE = 16
DTYPES = ("uint8", "int8")


def intrin_name(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"byte transpose of {dtype!r}; dtypes {DTYPES}")
    return f"tvmfuse_transpose_16x16_{dtype}"


def _header(dtype: str, name: str) -> list[str]:
    return ["@T.prim_func(s_tir=True)",
            f"def {name}(a: T.handle, b: T.handle) -> None:",
            "    s = T.int32()",
            "    row = T.int32()",
            f"    A = T.match_buffer(a, ({SIDE}, {SIDE}), '{dtype}', offset_factor=1)",
            f"    B = T.match_buffer(b, ({SIDE}, 1, {SIDE}), '{dtype}', strides=[s, row, 1], offset_factor=1)",
            "    with T.sblock('root'):",
            f"        T.reads(A[0:{SIDE}, 0:{SIDE}])",
            f"        T.writes(B[0:{SIDE}, 0, 0:{SIDE}])"]


def _parse(lines: list[str]):
    return script.from_source("\n".join(lines))


def rounds() -> list[list[tuple[int, int, list[int]]]]:
    """For each of the 4 rounds, result slot -> ``(a, b, indices)``: the shuffle of the round's inputs ``a``
    and ``b`` (slots of the previous round; round 0 reads the pixels in bit-reversed order)."""
    out = []
    for unit in (1, 2, 4, 8):
        slots = [None] * SIDE
        for k in range(SIDE // 2):
            lo, hi = [], []
            for block in range(SIDE // (2 * unit)):
                lo += [block * unit + j for j in range(unit)] + [SIDE + block * unit + j for j in range(unit)]
                hi += [8 + block * unit + j for j in range(unit)] + [SIDE + 8 + block * unit + j for j in range(unit)]
            slots[2 * k], slots[2 * k + 1] = (k, k + 8, lo), (k, k + 8, hi)
        out.append(slots)
    return out


def _bit_reversed(i: int) -> int:
    return int(f"{i:04b}"[::-1], 2)


@functools.cache
def desc(dtype: str):
    return _parse(_header(dtype, "transpose_desc") + [
        f"        for c, x in T.grid({SIDE}, {SIDE}):",
        "            with T.sblock('transpose'):",
        "                vc, vx = T.axis.remap('SS', [c, x])",
        "                B[vc, 0, vx] = A[vx, vc]"])


@functools.cache
def impl(dtype: str):
    vector = f"T.{dtype}x{SIDE}"
    lines = _header(dtype, "transpose_impl")
    names = []
    for i in range(SIDE):
        lines.append(f"        p{i}: {vector} = A[{_bit_reversed(i)}, T.Ramp(0, 1, {SIDE})]")
        names.append(f"p{i}")
    for r, slots in enumerate(rounds()):
        made = []
        for slot, (a, b, indices) in enumerate(slots):
            lines.append(f"        r{r}_{slot}: {vector} = T.Shuffle([{names[a]}, {names[b]}], {indices})")
            made.append(f"r{r}_{slot}")
        names = made
    lines += [f"        B[{c}, 0, T.Ramp(0, 1, {SIDE})] = {names[c]}" for c in range(SIDE)]
    return _parse(lines)


@functools.cache
def register(dtype: str) -> str:
    name = intrin_name(dtype)
    TensorIntrin.register(name, desc(dtype), impl(dtype), override=True)
    return name
