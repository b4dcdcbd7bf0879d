"""The AMX tile kernel of an INT8 conv2d output tile: ``nb`` blocks of 16 output channels by ``out_rows`` output
rows of ``pixels`` pixels, summed over every input chunk and tap with ``tdpbusd`` (Sapphire Rapids and later).

What it computes (the description, :func:`desc`), for one output tile of :mod:`..computes.int8_amx`'s layout::

    C[0, i, r, p, o] += int32(A[0, c, r * sh + y * dh, p * sw + x * dw, k, q]) * int32(B[i, c, y, x, k, o, q])
    for c < chunks, y < kh, x < kw (the reduction's outer part), i < nb, r < out_rows, p < pixels, o < 16,
    k < 16, q < 4
    A: the packed input's window, uint8    B: the weight's tiles, int8    C: the int32 accumulator ("local")

How (:func:`impl`, ``"amx"``): the tile's pixels are at most 2 *runs* (one A tile each, at most 16 rows): the
pixels of one row in 1 or 2 equal runs, or one run in each of 2 output rows. The ``nb x runs`` accumulators live
in tiles 0-3 from the first chunk to the last, A runs in tiles 4-5, weight tiles in 6-7. Per (chunk, tap): one
``tileloadd`` per A run (its rows ``sw`` pixels apart in memory), one per weight tile (1 KB, 64-byte rows), one
``tdpbusd`` per accumulator: with 2 runs x 2 blocks each loaded tile serves two ``tdpbusd``. The program loads no
tile shapes: the kernel loads :func:`tile_config`'s record once per thread (``ldtilecfg``; the rule marks the
kernel with it, ``..int8_amx.with_tile_state`` loads it). The accumulators start at zero (``tilezero``) and go to
C with ``tilestored``, where the requantize epilogue reads them: the program sums the whole reduction, so it
never reads C, and the zeroing of C that the description's ``C +=`` implies (the rule's init block) is dead; the
kernel pass drops it. (A memset of C and a ``tileloadd`` of it right after stalled on the store: 7% of a
256 -> 64 1x1 conv at 56 x 56.)

``"emulated"`` runs the same tile program with every tile a local array (zeroed as ``tilezero`` does) and every
load and store at the same byte offsets and strides: the tests run it on CPUs without AMX, so the address arithmetic the AMX code uses is
checked against the reference there; only the instructions themselves need an AMX CPU.

The process must have asked Linux for the tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``)
before the first tile instruction: :data:`PERMISSION_SYSCALL` (the rule calls it once per kernel call).
"""

from __future__ import annotations

import dataclasses
import functools

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as I

KINDS = ("amx", "emulated")
U8, S8, I32 = "uint8", "int8", "int32"
MAX_ROWS = 16  # rows of a tile
# syscall(SYS_arch_prctl = 158, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18): returns 0 once granted
PERMISSION_SYSCALL = (158, 0x1023, 18)
ACC_TILES, A_TILES, B_TILES = (0, 1, 2, 3), (4, 5), (6, 7)


def fits(pixels: int) -> bool:
    """Whether ``pixels`` of a row make at most 2 equal runs of at most 16 rows (:func:`groups_of`)."""
    return 0 < pixels <= MAX_ROWS or (pixels % 2 == 0 and pixels // 2 <= MAX_ROWS)


def groups_of(pixels: int) -> tuple[int, int]:
    """``(groups, rows)``: the pixels of a row as at most 2 equal runs of at most 16 rows."""
    if fits(pixels):
        groups = 1 if pixels <= MAX_ROWS else 2
        return groups, pixels // groups
    raise ValueError(f"an AMX output tile takes at most 2 x {MAX_ROWS} pixels of a row in equal runs, got {pixels}")


@dataclasses.dataclass(frozen=True)
class Shape:
    """One output tile and the reduction it sums: ``nb`` channel blocks, ``out_rows`` rows of ``pixels``
    pixels; ``chunks`` of 64 input channels, a ``kh x kw`` kernel; strides and dilations."""

    nb: int
    out_rows: int
    pixels: int
    chunks: int
    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1

    def __post_init__(self):
        groups, _ = groups_of(self.pixels)
        if self.out_rows not in (1, 2) or self.out_rows * groups > len(A_TILES):
            raise ValueError(f"an AMX output tile takes at most 2 runs of pixels: {self.out_rows} rows of "
                             f"{self.pixels} pixels")
        if self.nb * len(self.runs) > len(ACC_TILES) or self.nb > len(B_TILES):
            raise ValueError(f"an AMX output tile holds at most 4 accumulators (2 weight tiles): {self.nb} blocks x "
                             f"{len(self.runs)} runs of pixels")

    @property
    def rows(self) -> int:
        """Pixels per run: the A and accumulator tiles' rows."""
        return groups_of(self.pixels)[1]

    @property
    def runs(self) -> list[tuple[int, int]]:
        """(output row, run within the row) of each A tile."""
        return [(r, g) for r in range(self.out_rows) for g in range(groups_of(self.pixels)[0])]

    @property
    def window(self) -> tuple[int, int]:
        """Rows and columns of the packed input the tile reads."""
        return ((self.out_rows - 1) * self.sh + (self.kh - 1) * self.dh + 1,
                (self.pixels - 1) * self.sw + (self.kw - 1) * self.dw + 1)

    def accumulators(self) -> list[tuple[int, int, int]]:
        """(block, run, tile) of each accumulator."""
        runs = len(self.runs)
        return [(i, j, ACC_TILES[i * runs + j]) for i in range(self.nb) for j in range(runs)]

    def name(self, kind: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"unknown AMX kernel kind {kind!r}; kinds {KINDS}")
        return (f"tvmfuse_amx_conv_{kind}_{self.nb}x{self.out_rows}x{self.pixels}_c{self.chunks}_k{self.kh}x{self.kw}"
                f"_s{self.sh}x{self.sw}_d{self.dh}x{self.dw}")


def _buffers(shape: Shape, strided: bool):
    """A, B and C of the description (compact) or of the implementation (symbolic strides)."""
    rows, cols = shape.window
    a, b, c = (I.arg(n, tirx.Var(n, "handle")) for n in "abc")

    def match(name, handle, dims, dtype, scope="global"):
        strides = [tirx.Var(f"{name}s{d}", "int32") for d in range(len(dims))] if strided else None
        return I.match_buffer(handle, dims, dtype, strides=strides, offset_factor=1, scope=scope)

    A = match("A", a, (1, shape.chunks, rows, cols, 16, 4), U8)
    B = match("B", b, (shape.nb, shape.chunks, shape.kh, shape.kw, 16, 16, 4), S8)
    C = match("C", c, (1, shape.nb, shape.out_rows, shape.pixels, 16), I32, "local")
    return A, B, C


def _regions(A, B, C, shape: Shape) -> None:
    """The root block's reads and writes: all of A, B and C."""
    rows, cols = shape.window
    I.reads(C[0, 0:shape.nb, 0:shape.out_rows, 0:shape.pixels, 0:16], A[0, 0:shape.chunks, 0:rows, 0:cols, 0:16, 0:4],
            B[0:shape.nb, 0:shape.chunks, 0:shape.kh, 0:shape.kw, 0:16, 0:16, 0:4])
    I.writes(C[0, 0:shape.nb, 0:shape.out_rows, 0:shape.pixels, 0:16])


@functools.cache
def desc(shape: Shape):
    """The description PrimFunc. Loops of extent 1 stay but bind no block axis, as in the blockized nest."""
    axes = [("c", shape.chunks, "R"), ("y", shape.kh, "R"), ("x", shape.kw, "R"), ("i", shape.nb, "S"),
            ("r", shape.out_rows, "S"), ("p", shape.pixels, "S"), ("o", 16, "S"), ("k", 16, "R"), ("q", 4, "R")]
    # the block's axes in the compute's order (spatial, then reduction), its loops in the schedule's
    order = "irpocyxkq"
    kept = sorted((a for a in axes if a[1] > 1), key=lambda a: order.index(a[0]))
    with IRBuilder() as builder:
        with I.prim_func(s_tir=True):
            I.func_name("amx_conv_desc")
            A, B, C = _buffers(shape, strided=False)
            with I.sblock("root"):
                _regions(A, B, C, shape)
                with I.grid(*(a[1] for a in axes)) as loops:
                    loops = dict(zip((a[0] for a in axes), [loops] if isinstance(loops, tirx.Var) else list(loops)))
                    with I.sblock("update"):
                        bound = dict(zip((a[0] for a in kept),
                                         I.axis.remap("".join(a[2] for a in kept), [loops[a[0]] for a in kept])))
                        v = {name: bound.get(name, 0) for name, _, _ in axes}
                        out = [0, v["i"], v["r"], v["p"], v["o"]]
                        data = A[0, v["c"], v["r"] * shape.sh + v["y"] * shape.dh, v["p"] * shape.sw + v["x"] * shape.dw,
                                 v["k"], v["q"]]
                        weight = B[v["i"], v["c"], v["y"], v["x"], v["k"], v["o"], v["q"]]
                        I.buffer_store(C, C[tuple(out)] + tirx.Cast(I32, data) * tirx.Cast(I32, weight), out)
    return builder.get()


def tile_config(shape: Shape) -> list[int]:
    """The 64-byte ``ldtilecfg`` record: palette 1; per tile its bytes per row (at offset 16 + 2t, 16-bit)
    and rows (at 48 + t)."""
    record = [0] * 64
    record[0] = 1
    tiles = {t: shape.rows for _, _, t in shape.accumulators()}
    tiles.update({A_TILES[j]: shape.rows for j in range(len(shape.runs))})
    tiles.update({B_TILES[i]: 16 for i in range(shape.nb)})
    for tile, tile_rows in tiles.items():
        record[16 + 2 * tile] = 64  # every row is 64 bytes: 16 int32, or 64 uint8 / int8
        record[48 + tile] = tile_rows
    return record


class _Layout:
    """Element offsets and byte strides of the tiles in A, B and C (strides of the matched buffers)."""

    def __init__(self, A, B, C, shape: Shape):
        self.A, self.B, self.C, self.shape = A, B, C, shape

    def acc(self, i, run):
        r, g = self.shape.runs[run]
        s = self.C.strides
        return i * s[1] + r * s[2] + g * self.shape.rows * s[3]

    def acc_stride(self):
        return self.C.strides[3] * 4

    def data(self, run, c, y, x):
        (r, g), sh, s = self.shape.runs[run], self.shape, self.A.strides
        return c * s[1] + (r * sh.sh + y * sh.dh) * s[2] + (g * sh.rows * sh.sw + x * sh.dw) * s[3]

    def data_stride(self):
        return self.A.strides[3] * self.shape.sw

    def weight(self, i, c, y, x):
        s = self.B.strides
        return i * s[0] + c * s[1] + y * s[2] + x * s[3]

    def weight_stride(self):
        return self.B.strides[4]


def _tile_op(name: str, *args) -> None:
    I.evaluate(tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args))


def _i8(value: int):
    return tirx.const(value, "int8")


def _i64(value):
    return tirx.Cast("int64", value) if not isinstance(value, int) else tirx.const(value, "int64")


@functools.cache
def impl(kind: str, shape: Shape):
    """The tile program (see the module's doc); ``kind`` ``"amx"`` or ``"emulated"``. Built with TVM's IR
    builder: the Python loops over tiles unroll into one instruction per tile."""
    with IRBuilder() as builder:
        with I.prim_func(s_tir=True):
            I.func_name(f"amx_conv_{kind}")
            A, B, C = _buffers(shape, strided=True)
            with I.sblock("root"):
                _regions(A, B, C, shape)
                lay = _Layout(A, B, C, shape)
                (_emulated_program if kind == "emulated" else _amx_program)(A, B, C, lay, shape)
    return builder.get()


def _amx_program(A, B, C, lay: _Layout, shape: Shape) -> None:
    acc = shape.accumulators()
    for _, _, t in acc:
        _tile_op("tilezero", _i8(t))
    with I.grid(shape.chunks, shape.kh, shape.kw) as (rc, ry, rx):
        for j in range(len(shape.runs)):
            _tile_op("tileloadd64", _i8(A_TILES[j]), A.access_ptr("r", offset=lay.data(j, rc, ry, rx)),
                     _i64(lay.data_stride()))
        for i in range(shape.nb):
            _tile_op("tileloadd64", _i8(B_TILES[i]), B.access_ptr("r", offset=lay.weight(i, rc, ry, rx)),
                     _i64(lay.weight_stride()))
        for i, j, t in acc:
            _tile_op("tdpbusd", _i8(t), _i8(A_TILES[j]), _i8(B_TILES[i]))
    for i, j, t in acc:
        _tile_op("tilestored64", _i8(t), C.access_ptr("w", offset=lay.acc(i, j)), _i64(lay.acc_stride()))


def _emulated_program(A, B, C, lay: _Layout, shape: Shape) -> None:
    """The tile program on local arrays, loads and stores at :class:`_Layout`'s offsets (see the module)."""
    rows, flat = shape.rows, 1 << 30
    Af = I.decl_buffer((flat,), U8, data=A.data, elem_offset=A.elem_offset)
    Bf = I.decl_buffer((flat,), S8, data=B.data, elem_offset=B.elem_offset)
    Cf = I.decl_buffer((flat,), I32, data=C.data, elem_offset=C.elem_offset, scope="local")
    tiles = I.alloc_buffer((4, 16, 16), I32, scope="local")
    ta = I.alloc_buffer((2, 16, 64), U8, scope="local")
    tb = I.alloc_buffer((2, 16, 64), S8, scope="local")
    acc, acc_row = shape.accumulators(), lay.acc_stride() // 4
    for _, _, t in acc:
        with I.grid(rows, 16) as (r, e):
            I.buffer_store(tiles, tirx.const(0, I32), [t, r, e])
    with I.grid(shape.chunks, shape.kh, shape.kw) as (rc, ry, rx):
        for j in range(len(shape.runs)):
            with I.grid(rows, 64) as (r, e):
                I.buffer_store(ta, Af[lay.data(j, rc, ry, rx) + r * lay.data_stride() + e], [j, r, e])
        for i in range(shape.nb):
            with I.grid(16, 64) as (r, e):
                I.buffer_store(tb, Bf[lay.weight(i, rc, ry, rx) + r * lay.weight_stride() + e], [i, r, e])
        for i, j, t in acc:
            with I.grid(rows, 16, 16, 4) as (r, e, k, q):
                product = tirx.Cast(I32, ta[j, r, 4 * k + q]) * tirx.Cast(I32, tb[i, k, 4 * e + q])
                I.buffer_store(tiles, tiles[t, r, e] + product, [t, r, e])
    for i, j, t in acc:
        with I.grid(rows, 16) as (r, e):
            I.buffer_store(Cf, tiles[t, r, e], [lay.acc(i, j) + r * acc_row + e])


def ensure(kind: str, shape: Shape) -> str:
    """Register the variant unless it is; return its name."""
    name = shape.name(kind)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc(shape), impl(kind, shape))
    return name
