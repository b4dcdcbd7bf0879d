"""The AMX tile kernel of an INT8 conv2d output tile: ``nb`` blocks of 16 output channels by ``pixels`` output
pixels of a row, summed over every input chunk and tap with ``tdpbusd`` (Sapphire Rapids and later).

What it computes (the description, :func:`desc`), for one output row of :mod:`..computes.int8_amx`'s layout::

    C[0, i, 0, p, o] += int32(A[0, c, y * dh, p * sw + x * dw, k, q]) * int32(B[i, c, y, x, k, o, q])
    for c < chunks, y < kh, x < kw (the reduction's outer part), i < nb, p < pixels, o < 16, k < 16, q < 4
    A: the packed input's window, uint8    B: the weight's tiles, int8    C: the int32 accumulator ("local")

How (:func:`impl`, ``"amx"``): the pixels are ``groups`` runs of ``rows`` (at most 16 each, one A tile a run);
the ``nb x groups`` accumulators live in tiles 0-3 from the first chunk to the last, A runs in tiles 4-5, weight
tiles in 6-7. Per (chunk, tap): one ``tileloadd`` per A run (its rows ``sw`` pixels apart in memory), one per
weight tile (1 KB, 64-byte rows), one ``tdpbusd`` per accumulator. The tile shapes are set once per call
(``ldtilecfg``, a 64-byte palette-1 record built on the stack); the accumulators come from C (zeroed by the
rule's init block) and go back to it with ``tilestored``, where the requantize epilogue reads them.

``"emulated"`` runs the same tile program with every tile a local array and every load and store at the same
byte offsets and strides: the tests run it on CPUs without AMX, so the address arithmetic the AMX code uses is
checked against the reference there; only the three instructions themselves need an AMX CPU.

The process must have asked Linux for the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``)
before the first tile instruction: :data:`PERMISSION_SYSCALL` (the rule calls it once per kernel call).
"""

from __future__ import annotations

import functools

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as I

KINDS = ("amx", "emulated")
U8, S8, I32 = "uint8", "int8", "int32"
MAX_ROWS = 16  # rows of a tile
# syscall(SYS_arch_prctl = 158, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18): returns 0 once granted
PERMISSION_SYSCALL = (158, 0x1023, 18)
ACC_TILES, A_TILES, B_TILES = (0, 1, 2, 3), (4, 5), (6, 7)


def groups_of(pixels: int) -> tuple[int, int]:
    """``(groups, rows)``: the pixels of a tile as at most 2 equal runs of at most 16 rows."""
    for groups in (1, 2):
        if pixels % groups == 0 and pixels // groups <= MAX_ROWS:
            return groups, pixels // groups
    raise ValueError(f"an AMX output tile takes at most 2 x {MAX_ROWS} pixels in equal runs, got {pixels}")


def check_shape(nb: int, pixels: int) -> None:
    groups, _ = groups_of(pixels)
    if nb * groups > len(ACC_TILES) or nb > len(B_TILES):
        raise ValueError(f"an AMX output tile holds at most 4 accumulators (2 weight tiles): {nb} blocks x "
                         f"{groups} runs of pixels")


def intrin_name(kind: str, nb: int, pixels: int, chunks: int, kh: int, kw: int, sw: int, dh: int, dw: int) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown AMX kernel kind {kind!r}; kinds {KINDS}")
    return f"tvmfuse_amx_conv_{kind}_{nb}x{pixels}_c{chunks}_k{kh}x{kw}_s{sw}_d{dh}x{dw}"


def _window(pixels: int, kh: int, kw: int, sw: int, dh: int, dw: int) -> tuple[int, int]:
    """Rows and columns of the packed input one output tile reads."""
    return (kh - 1) * dh + 1, (pixels - 1) * sw + (kw - 1) * dw + 1


@functools.cache
def desc(nb: int, pixels: int, chunks: int, kh: int, kw: int, sw: int, dh: int, dw: int):
    """The description PrimFunc. Loops of extent 1 stay but bind no block axis, as in the blockized nest."""
    rows, cols = _window(pixels, kh, kw, sw, dh, dw)
    axes = [("c", chunks, "R"), ("y", kh, "R"), ("x", kw, "R"), ("i", nb, "S"), ("p", pixels, "S"), ("o", 16, "S"),
            ("k", 16, "R"), ("q", 4, "R")]
    # the block's axes in the compute's order (spatial, then reduction), its loops in the schedule's
    order = "ipocyxkq"
    kept = sorted((a for a in axes if a[1] > 1), key=lambda a: order.index(a[0]))
    with IRBuilder() as builder:
        with I.prim_func(s_tir=True):
            I.func_name("amx_conv_desc")
            a, b, c = (I.arg(n, tirx.Var(n, "handle")) for n in "abc")
            A = I.match_buffer(a, (1, chunks, rows, cols, 16, 4), U8, offset_factor=1)
            B = I.match_buffer(b, (nb, chunks, kh, kw, 16, 16, 4), S8, offset_factor=1)
            C = I.match_buffer(c, (1, nb, 1, pixels, 16), I32, offset_factor=1, scope="local")
            with I.sblock("root"):
                I.reads(C[0, 0:nb, 0, 0:pixels, 0:16], A[0, 0:chunks, 0:rows, 0:cols, 0:16, 0:4],
                        B[0:nb, 0:chunks, 0:kh, 0:kw, 0:16, 0:16, 0:4])
                I.writes(C[0, 0:nb, 0, 0:pixels, 0:16])
                with I.grid(*(a[1] for a in axes)) as loops:
                    loops = dict(zip((a[0] for a in axes), loops))
                    with I.sblock("update"):
                        bound = dict(zip((a[0] for a in kept),
                                         I.axis.remap("".join(a[2] for a in kept), [loops[a[0]] for a in kept])))
                        v = {name: bound.get(name, 0) for name, _, _ in axes}
                        out = C[0, v["i"], 0, v["p"], v["o"]]
                        data = A[0, v["c"], v["y"] * dh, v["p"] * sw + v["x"] * dw, v["k"], v["q"]]
                        weight = B[v["i"], v["c"], v["y"], v["x"], v["k"], v["o"], v["q"]]
                        I.buffer_store(C, out + tirx.Cast(I32, data) * tirx.Cast(I32, weight),
                                       [0, v["i"], 0, v["p"], v["o"]])
    return builder.get()


def tile_config(nb: int, pixels: int) -> list[int]:
    """The 64-byte ``ldtilecfg`` record: palette 1; per tile its bytes per row (at offset 16 + 2t, 16-bit)
    and rows (at 48 + t)."""
    groups, rows = groups_of(pixels)
    record = [0] * 64
    record[0] = 1
    shapes = {}
    for i in range(nb):
        for g in range(groups):
            shapes[ACC_TILES[i * groups + g]] = rows
    for g in range(groups):
        shapes[A_TILES[g]] = rows
    for i in range(nb):
        shapes[B_TILES[i]] = 16
    for tile, tile_rows in shapes.items():
        record[16 + 2 * tile] = 64  # every row is 64 bytes: 16 int32, or 64 uint8 / int8
        record[48 + tile] = tile_rows
    return record


class _Layout:
    """Element offsets and byte strides of the tiles in A, B and C (strides of the matched buffers)."""

    def __init__(self, A, B, C, rows: int, sw: int, dh: int, dw: int):
        self.A, self.B, self.C, self.rows, self.sw, self.dh, self.dw = A, B, C, rows, sw, dh, dw

    def acc(self, i, g):
        return i * self.C.strides[1] + g * self.rows * self.C.strides[3]

    def acc_stride(self):
        return self.C.strides[3] * 4

    def data(self, g, c, y, x):
        s = self.A.strides
        return c * s[1] + y * self.dh * s[2] + (g * self.rows * self.sw + x * self.dw) * s[3]

    def data_stride(self):
        return self.A.strides[3] * self.sw

    def weight(self, i, c, y, x):
        s = self.B.strides
        return i * s[0] + c * s[1] + y * s[2] + x * s[3]

    def weight_stride(self):
        return self.B.strides[4]


def _strided(name: str, handle, shape, dtype, scope="global"):
    """``match_buffer`` of ``handle`` with a symbolic stride per dimension (the last included)."""
    strides = [tirx.Var(f"{name}s{d}", "int32") for d in range(len(shape))]
    return I.match_buffer(handle, shape, dtype, strides=strides, offset_factor=1, scope=scope)


def _tile_op(name: str, *args) -> None:
    I.evaluate(tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args))


def _i8(value: int):
    return tirx.const(value, "int8")


def _i64(value):
    return tirx.Cast("int64", value) if not isinstance(value, int) else tirx.const(value, "int64")


@functools.cache
def impl(kind: str, nb: int, pixels: int, chunks: int, kh: int, kw: int, sw: int, dh: int, dw: int):
    """The tile program (see the module's doc); ``kind`` ``"amx"`` or ``"emulated"``. Built with TVM's IR
    builder: the Python loops over tiles unroll into one instruction per tile."""
    check_shape(nb, pixels)
    groups, rows = groups_of(pixels)
    wrows, wcols = _window(pixels, kh, kw, sw, dh, dw)
    acc = [(i, g, ACC_TILES[i * groups + g]) for i in range(nb) for g in range(groups)]
    with IRBuilder() as builder:
        with I.prim_func(s_tir=True):
            I.func_name(f"amx_conv_{kind}")
            a, b, c = (I.arg(n, tirx.Var(n, "handle")) for n in "abc")
            A = _strided("A", a, (1, chunks, wrows, wcols, 16, 4), U8)
            B = _strided("B", b, (nb, chunks, kh, kw, 16, 16, 4), S8)
            C = _strided("C", c, (1, nb, 1, pixels, 16), I32, "local")
            with I.sblock("root"):
                I.reads(C[0, 0:nb, 0, 0:pixels, 0:16], A[0, 0:chunks, 0:wrows, 0:wcols, 0:16, 0:4],
                        B[0:nb, 0:chunks, 0:kh, 0:kw, 0:16, 0:16, 0:4])
                I.writes(C[0, 0:nb, 0, 0:pixels, 0:16])
                lay = _Layout(A, B, C, rows, sw, dh, dw)
                if kind == "emulated":
                    _emulated_program(A, B, C, lay, acc, groups, nb, chunks, kh, kw)
                else:
                    _amx_program(A, B, C, lay, acc, groups, nb, pixels, chunks, kh, kw)
    return builder.get()


def _amx_program(A, B, C, lay, acc, groups, nb, pixels, chunks, kh, kw) -> None:
    config = I.alloc_buffer((8,), "uint64", scope="local")  # the record as 8 little-endian words: 8 stores
    record = bytes(tile_config(nb, pixels))
    for j in range(8):
        I.buffer_store(config, tirx.const(int.from_bytes(record[8 * j:8 * j + 8], "little"), "uint64"), [j])
    _tile_op("ldtilecfg", config.access_ptr("r"))
    for i, g, t in acc:
        _tile_op("tileloadd64", _i8(t), C.access_ptr("r", offset=lay.acc(i, g)), _i64(lay.acc_stride()))
    with I.grid(chunks, kh, kw) as (rc, ry, rx):
        for g in range(groups):
            _tile_op("tileloadd64", _i8(A_TILES[g]), A.access_ptr("r", offset=lay.data(g, rc, ry, rx)),
                     _i64(lay.data_stride()))
        for i in range(nb):
            _tile_op("tileloadd64", _i8(B_TILES[i]), B.access_ptr("r", offset=lay.weight(i, rc, ry, rx)),
                     _i64(lay.weight_stride()))
        for i, g, t in acc:
            _tile_op("tdpbusd", _i8(t), _i8(A_TILES[g]), _i8(B_TILES[i]))
    for i, g, t in acc:
        _tile_op("tilestored64", _i8(t), C.access_ptr("w", offset=lay.acc(i, g)), _i64(lay.acc_stride()))


def _emulated_program(A, B, C, lay, acc, groups, nb, chunks, kh, kw) -> None:
    """The tile program on local arrays, loads and stores at :class:`_Layout`'s offsets (see the module)."""
    rows, flat = lay.rows, 1 << 30
    Af = I.decl_buffer((flat,), U8, data=A.data, elem_offset=A.elem_offset)
    Bf = I.decl_buffer((flat,), S8, data=B.data, elem_offset=B.elem_offset)
    Cf = I.decl_buffer((flat,), I32, data=C.data, elem_offset=C.elem_offset, scope="local")
    tiles = I.alloc_buffer((4, 16, 16), I32, scope="local")
    ta = I.alloc_buffer((2, 16, 64), U8, scope="local")
    tb = I.alloc_buffer((2, 16, 64), S8, scope="local")
    acc_row = lay.acc_stride() // 4
    for i, g, t in acc:
        with I.grid(rows, 16) as (r, j):
            I.buffer_store(tiles, Cf[lay.acc(i, g) + r * acc_row + j], [t, r, j])
    with I.grid(chunks, kh, kw) as (rc, ry, rx):
        for g in range(groups):
            with I.grid(rows, 64) as (r, j):
                I.buffer_store(ta, Af[lay.data(g, rc, ry, rx) + r * lay.data_stride() + j], [g, r, j])
        for i in range(nb):
            with I.grid(16, 64) as (r, j):
                I.buffer_store(tb, Bf[lay.weight(i, rc, ry, rx) + r * lay.weight_stride() + j], [i, r, j])
        for i, g, t in acc:
            with I.grid(rows, 16, 16, 4) as (r, j, k, q):
                product = tirx.Cast(I32, ta[g, r, 4 * k + q]) * tirx.Cast(I32, tb[i, k, 4 * j + q])
                I.buffer_store(tiles, tiles[t, r, j] + product, [t, r, j])
    for i, g, t in acc:
        with I.grid(rows, 16) as (r, j):
            I.buffer_store(Cf, tiles[t, r, j], [lay.acc(i, g) + r * acc_row + j])


def ensure(kind: str, nb: int, pixels: int, chunks: int, kh: int, kw: int, sw: int, dh: int, dw: int) -> str:
    """Register the variant unless it is; return its name."""
    name = intrin_name(kind, nb, pixels, chunks, kh, kw, sw, dh, dw)
    if TensorIntrin.get(name, allow_missing=True) is None:
        shape = (nb, pixels, chunks, kh, kw, sw, dh, dw)
        TensorIntrin.register(name, desc(*shape), impl(kind, *shape))
    return name


def target_has_amx(target) -> bool:
    """True when the LLVM target (``tvm.target.Target``) has AMX with int8 tiles."""
    from tvm.target import codegen

    return target.kind.name == "llvm" and bool(codegen.llvm_cpu_has_features(["amx-int8", "amx-tile"], target))
