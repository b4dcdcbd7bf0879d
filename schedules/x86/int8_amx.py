"""INT8 conv2d on AMX tiles (:func:`tvmfuse.schedules.computes.int8_amx.conv2d_compute`), x86 with ``amx-int8``.

An output tile is ``oc_blocks`` blocks of 16 channels by ``pixels`` pixels of one or two output rows; the whole
reduction (64-channel chunks, kernel rows, kernel columns) is one call of the tile kernel of
:mod:`.intrin.amx`, which keeps the tile's accumulators in AMX tiles throughout and stores them to a local
int32 buffer, from which the requantize epilogue writes the output (vectorized, as the VNNI rule does). The
input is repacked into 64-channel pixels with the zero point around (``data_pack``, one parallel pass); the
parallel axis is (batch, channel tile, output rows).

Tiles: the row is cut into the widest tile of at most 2 runs of 16 pixels that divides it (28 -> 2 x 14, 56 ->
2 x 14, 7 -> 7); a tile of one run per row takes two rows (14 -> 2 rows of 14); 2 channel blocks where the outputs
allow (4 accumulators at most, AMX has 8 tiles: 2 for pixel runs, 2 for weights). The process asks Linux for the tile state once per kernel call
(:data:`.intrin.amx.PERMISSION_SYSCALL`, a syscall of well under a microsecond).

The tile shapes are loaded once per thread and kernel call (:func:`with_tile_state`): ``ldtilecfg`` costs a few
hundred cycles, and loaded per output tile it took 60% of a 24 -> 144 1x1 conv at 56 x 56 on a Sapphire Rapids
(one thread: 248 -> 180 us with the loaded shapes read back and compared instead; every extra ``ldtilecfg`` a
tile added 150-300 us to the 56 x 56 layers of MobileNetV2 and ResNet-50).
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import s_tir, tirx

from ..common import (SERIAL_MACS, accumulate_in_registers, anchor_loops, inline_epilogue, iterations,
                      read_coefficients, vectorize_tile)
from ..computes import int8_amx
from .intrin import amx

ANCHOR, PAD = int8_amx.ANCHOR, int8_amx.PAD
KIND = "amx"  # the tile kernel; tests pass "emulated" to run the same program without AMX
TILES_MARK = "tvmfuse.amx_tiles"  # on the root block of a kernel that runs AMX tile instructions
ZEROED_MARK = "tvmfuse.amx_zeroed_by_tiles"  # on the init block that the tile program's tilezero makes dead


@dataclasses.dataclass(frozen=True)
class Config:
    """``oc_blocks`` x 16 output channels by ``out_rows`` rows of ``pixels`` output pixels per tile; ``kind``
    the tile kernel's implementation (:data:`.intrin.amx.KINDS`)."""

    oc_blocks: int
    pixels: int
    kind: str = KIND
    out_rows: int = 1


def default_config(out_channel_blocks: int, out_width: int, kind: str = KIND, out_height: int = 1) -> Config:
    """The widest pixel count of a row (2 runs of at most 16, or one) that divides it; a row of one run takes
    a second output row when the height allows (2 A tiles then, as 2 runs of one row); 2 channel blocks when they
    divide the outputs. With 2 runs and 2 blocks each loaded tile serves two ``tdpbusd``, against 1.5 loads
    per ``tdpbusd`` with one run (ResNet-50's 14- and 7-wide rows)."""
    pixels = max((p for p in range(1, 2 * amx.MAX_ROWS + 1) if out_width % p == 0 and amx.fits(p)), default=1)
    runs, _ = amx.groups_of(pixels)
    out_rows = 2 if runs == 1 and out_height % 2 == 0 else 1
    oc_blocks = 2 if out_channel_blocks % 2 == 0 else 1
    return Config(oc_blocks, pixels, kind, out_rows)


def matches(sch: s_tir.Schedule) -> bool:
    """Whether ``sch`` holds the AMX compute's anchor (10 loops: n, ob, oh, ow, oi, rc, ry, rx, rk, rq)."""
    return anchor_loops(sch, ANCHOR, 10, needs=(PAD,)) is not None


def apply(func: tirx.PrimFunc, config: Config | None = None) -> tirx.PrimFunc | None:
    """Schedule an AMX INT8 conv2d kernel; None when ``func`` is not one (or ``config`` does not divide it)."""
    sch = s_tir.Schedule(func)
    return sch.mod["main"] if schedule(sch, config) else None


def schedule(sch: s_tir.Schedule, config: Config | None = None) -> bool:
    """Apply the rule to ``sch`` in place; False (``sch`` untouched) when it does not match."""
    match = anchor_loops(sch, ANCHOR, 10, needs=(PAD,))
    if match is None:
        return False
    anchor, (n, ob, oh, ow, oi, rc, ry, rx, rk, rq) = match
    o_blocks, out_height, out_width, chunks, kh, kw = (int(sch.get(loop).extent) for loop in (ob, oh, ow, rc, ry, rx))
    cfg = config or default_config(o_blocks, out_width, out_height=out_height)
    if o_blocks % cfg.oc_blocks or out_width % cfg.pixels or out_height % cfg.out_rows:
        return False
    shape = amx.Shape(cfg.oc_blocks, cfg.out_rows, cfg.pixels, chunks, kh, kw, *_geometry(sch, anchor))
    epilogue = inline_epilogue(sch, ANCHOR)
    ob_o, ob_i = sch.split(ob, [None, cfg.oc_blocks])
    oh_o, oh_i = sch.split(oh, [None, cfg.out_rows])
    ow_o, ow_i = sch.split(ow, [None, cfg.pixels])
    sch.reorder(n, ob_o, oh_o, ow_o, rc, ry, rx, ob_i, oh_i, ow_i, oi, rk, rq)
    vectorize_tile(sch, accumulate_in_registers(sch, anchor, epilogue, ow_o), ow_o)
    serial = iterations(sch, anchor) < SERIAL_MACS
    rows = sch.fuse(n, ob_o, oh_o)
    if not serial:
        sch.parallel(rows)
    init = sch.decompose_reduction(anchor, rc)
    vectorize_tile(sch, init, ow_o)
    sch.tensorize(rc, amx.ensure(cfg.kind, shape))
    if cfg.kind == "amx":
        sch.annotate(sch.get_sblock("root"), TILES_MARK, amx.tile_config(shape))
        sch.annotate(init, ZEROED_MARK, 1)  # the tile program starts from tilezero: with_tile_state drops it
    _schedule_pack(sch, serial)
    return True


def _geometry(sch: s_tir.Schedule, anchor) -> tuple[int, int, int, int]:
    """(sh, sw, dh, dw): strides and dilations, read off the packed input's indices."""
    block = sch.get(anchor)
    y, x, ry, rx = (block.iter_vars[i].var for i in (2, 3, 6, 7))
    found = [read_coefficients(block, PAD, axis, [var]) for axis, var in ((2, y), (3, x), (2, ry), (3, rx))]
    return tuple(f[0] if f else 1 for f in found)


def _schedule_pack(sch: s_tir.Schedule, serial: bool) -> None:
    """NCHW(16c) -> 64-channel pixels with the zero-point border: parallel over (batch, chunk, row). From
    NCHW16c each 16 channels of a pixel are one 16-byte vector (4 per 64-channel pixel; vectorized over all 64
    they were gathers, 63 ``vpgatherdd`` per kernel); from NCHW a pixel's channels lie a plane apart anyway."""
    pack = sch.get_sblock(PAD)
    b, cb, y, x, k, q = sch.get_loops(pack)
    rows = sch.fuse(b, cb, y)
    if not serial:
        sch.parallel(rows)
    source = sch.get(pack).reads[0].source
    if len(source.shape) == 5 and int(source.shape[4]) == 16:
        kb, kl = sch.split(k, [None, 4])  # channels 16 kb .. 16 kb + 15: one NCHW16c block
        sch.unroll(kb)
        sch.vectorize(sch.fuse(kl, q))
    else:
        sch.vectorize(sch.fuse(k, q))


def uses_tiles(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` was scheduled by this rule with the AMX tile kernel (its root block's mark)."""
    return _tile_record(func) is not None


def _tile_record(func: tirx.PrimFunc) -> list[int] | None:
    """The ``ldtilecfg`` record of a kernel on AMX tiles (the root block's mark), None for any other."""
    body = func.body
    if not isinstance(body, s_tir.SBlockRealize) or TILES_MARK not in body.block.annotations:
        return None
    return [int(v) for v in body.block.annotations[TILES_MARK]]


def _with_body(block, body):
    """``block`` (an ``SBlock``) with another body."""
    return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                        block.alloc_buffers, block.match_buffers, block.annotations)


def _without_zeroing(stmt):
    """``stmt`` without the accumulators' init block (:data:`ZEROED_MARK`) and the loops that hold only it; None
    when nothing else is left. Walks the statement kinds a scheduled kernel's loop nests are made of."""
    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        if ZEROED_MARK in block.annotations:
            return None
        body = _without_zeroing(block.body)
        if body is None or body.same_as(block.body):
            return stmt if body is not None else None
        return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, _with_body(block, body))
    if isinstance(stmt, tirx.SeqStmt):
        kept = [_without_zeroing(s) for s in stmt.seq]
        if all(k is not None and k.same_as(s) for k, s in zip(kept, stmt.seq)):
            return stmt
        kept = [k for k in kept if k is not None]
        return None if not kept else kept[0] if len(kept) == 1 else tirx.SeqStmt(kept)
    if isinstance(stmt, tirx.For):
        body = _without_zeroing(stmt.body)
        if body is None or body.same_as(stmt.body):
            return stmt if body is not None else None
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step)
    return stmt


def _tile_op(name: str, *args):
    return tirx.Evaluate(tirx.call_llvm_intrin("void", f"llvm.x86.{name}", *args))


def _configured(stmt, record: list[int]):
    """``stmt`` (the loop nest of the output tiles) between loading the kernel's tile shapes and putting back the
    thread's own. A parallel loop becomes TVM's parallel launch point, so that each thread of the pool does both
    once, before and after its share of the iterations (``pragma_parallel_launch_point``: the code around the
    parallel loop runs once per task).

    The shapes a thread had are put back (``sttilecfg`` before, ``ldtilecfg`` after; ``tilerelease`` when it had
    none) because other libraries keep theirs per thread: onnxruntime's AMX QGEMM loads its shapes once per
    thread and then counts on them, and ran into SIGILL on the calling thread after one of our kernels had
    loaded others there."""
    saved = tirx.decl_buffer((8,), "uint64", name="amx_saved_config", scope="local")
    config = tirx.decl_buffer((8,), "uint64", name="amx_tile_config", scope="local")
    record = bytes(record)
    words = [int.from_bytes(record[8 * j:8 * j + 8], "little") for j in range(8)]
    load = [_tile_op("sttilecfg", saved.access_ptr("w"))]
    load += [tirx.BufferStore(config, tirx.const(w, "uint64"), [j]) for j, w in enumerate(words)]
    load.append(_tile_op("ldtilecfg", config.access_ptr("r")))
    palette = tirx.BufferLoad(saved, [0]) & tirx.const(255, "uint64")  # 0: the thread had no shapes (INIT)
    restore = tirx.IfThenElse(palette != tirx.const(0, "uint64"), _tile_op("ldtilecfg", saved.access_ptr("r")),
                              _tile_op("tilerelease"))
    body = tirx.SeqStmt(load + [stmt, restore])
    block = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "amx_tile_state", body,
                                                       alloc_buffers=[saved, config]))
    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL:
        return tirx.AttrStmt(tirx.const(0, "int32"), "pragma_parallel_launch_point", tirx.const(0, "int32"), block)
    return block


def with_tile_state(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` asking Linux for the AMX tile state first and loading its tile shapes where each thread starts
    on the output tiles, without the accumulators' dead zeroing (:data:`ZEROED_MARK`), when it uses tiles
    (unchanged otherwise). A tile instruction before the request faults
    (SIGILL), and a library loaded by any process cannot count on the host having asked: granted once per
    process, later requests return at once. The tile program itself (:func:`.intrin.amx.impl`) loads no
    shapes."""
    record = _tile_record(func)
    if record is None:
        return func
    root = func.body.block
    parts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    # the output tiles' loop nest is the one holding the accumulators' init block, which the tiles make dead
    stripped = [_without_zeroing(part) for part in parts]
    tiled = [i for i, (part, kept) in enumerate(zip(parts, stripped)) if kept is None or not kept.same_as(part)]
    if len(tiled) != 1 or stripped[tiled[0]] is None:
        raise ValueError(f"an AMX kernel runs its tiles in one loop nest after its init block, found {len(tiled)}")
    parts[tiled[0]] = _configured(stripped[tiled[0]], record)
    body = parts[0] if len(parts) == 1 else tirx.SeqStmt(parts)
    root = _with_body(root, body)
    grant = tirx.call_extern("int64", "syscall", *(tirx.const(v, "int64") for v in amx.PERMISSION_SYSCALL))
    realize = s_tir.SBlockRealize(func.body.iter_values, func.body.predicate, root)
    return func.with_body(tirx.SeqStmt([tirx.Evaluate(grant), realize]))


def GrantTileState() -> tvm.transform.Pass:  # noqa: N802 - TVM pass naming
    """:func:`with_tile_state` on every PrimFunc of a module (a backend kernel pass)."""

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="tvmfuse.GrantTileState")
    def _pass(func, _mod, _ctx):
        return with_tile_state(func)

    return _pass
