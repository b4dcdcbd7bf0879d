"""Helpers shared by the schedule rules: block lookup, epilogue inlining, tile-size choices."""

from __future__ import annotations

import math

from tvm import s_tir

from .computes.int8_epilogue import TABLE_STAGE


def read_coefficients(block, source: str, axis: int, variables: list) -> list[int] | None:
    """The integer coefficients of ``variables`` in the index along ``axis`` of ``block``'s (an ``SBlock``) read
    of the buffer whose name starts with ``source`` (a conv's input: ``y * stride + ry * dilation`` gives
    ``[stride, dilation]``); None when there is no such read or the index is not linear in them."""
    from tvm import tirx
    from tvm.sym.pattern import detect_linear_equation

    read = next((r for r in block.reads if r.source.name.startswith(source)), None)
    if read is None or len(read.region) <= axis:
        return None
    found = detect_linear_equation(read.region[axis].min, variables)
    if len(found) != len(variables) + 1 or not all(isinstance(c, tirx.IntImm) for c in found[:-1]):
        return None
    return [int(c) for c in found[:-1]]


def block_names(sch: s_tir.Schedule) -> list[str]:
    """Names of the root's child blocks, in program order."""
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def annotate_child(func, block: str, key: str, value: str):
    """``func`` with the root's child block ``block`` annotated ``key = value``, as ``Schedule.annotate`` leaves
    it (structurally equal), without building a schedule (2 ms a kernel, 0.1 s of a model whose kernels all
    come from the cache); None when the root has no such child."""
    from tvm import tirx

    found = []

    def walk(s):
        if isinstance(s, tirx.SeqStmt):
            return tirx.SeqStmt([walk(x) for x in s.seq])
        if isinstance(s, tirx.For):
            return tirx.For(s.loop_var, s.min, s.extent, s.kind, walk(s.body), s.thread_binding, s.annotations,
                            s.step)
        if isinstance(s, s_tir.SBlockRealize) and s.block.name_hint == block and not found:
            b = s.block
            found.append(b)
            marks = dict(b.annotations)
            marks[key] = value
            return s_tir.SBlockRealize(s.iter_values, s.predicate, s_tir.SBlock(
                b.iter_vars, b.reads, b.writes, b.name_hint, b.body, b.init, b.alloc_buffers, b.match_buffers, marks))
        return s

    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize) or realize.block.name_hint != "root":
        return None
    root = realize.block
    body = walk(root.body)
    if not found:
        return None
    root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body, root.init, root.alloc_buffers,
                        root.match_buffers, root.annotations)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, root))


def inline_epilogue(sch: s_tir.Schedule, anchor: str):
    """Inline every stage after ``anchor`` but the last into its consumer; return the last stage (or None).

    Bias, folded batch-norm, residual add and activation then form one elementwise stage that the rules
    place inside the anchor's output tile, reading the accumulator before the single store. An INT8 kernel's
    table lookup (``int8_epilogue.TABLE_STAGE``) stays a stage after it, for the backend to place
    (``x86.int8_table``).
    """
    names = block_names(sch)
    after = [n for n in names[names.index(anchor) + 1:] if n != TABLE_STAGE]
    for name in after[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    return sch.get_sblock(after[-1]) if after else None


def inline_producers(sch: s_tir.Schedule, anchor: str, keep: tuple = ()) -> None:
    """Inline every stage before ``anchor`` (weight reshapes, padding) except those named in ``keep``."""
    names = block_names(sch)
    for name in names[:names.index(anchor)]:
        if name not in keep:
            sch.compute_inline(sch.get_sblock(name))


def accumulate_in_registers(sch: s_tir.Schedule, anchor, epilogue, tile_loop):
    """Accumulate ``anchor``'s tile in a local buffer and apply ``epilogue`` to it under ``tile_loop``.

    Returns the block that consumes the accumulator (the epilogue, or the write-back when there is none).
    """
    local = sch.cache_write(anchor, 0, "local")
    consumer = local if epilogue is None else epilogue
    if epilogue is not None:
        sch.compute_inline(local)
    # Unit loops kept: the loop count must not depend on tile sizes, or a MetaSchedule trace sampled with
    # one tile size cannot be replayed with another.
    sch.reverse_compute_at(consumer, tile_loop, preserve_unit_loops=True)
    return consumer


def register_tile(sch: s_tir.Schedule, anchor, epilogue, tile_loop, unrolled: list, vector):
    """The register tile every rule builds: ``unrolled`` loops unrolled, ``vector`` vectorized, ``anchor``'s
    tile accumulated in registers under ``tile_loop`` and the epilogue stored from them, vectorized.
    Returns the block that consumes the accumulator."""
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(vector)
    consumer = accumulate_in_registers(sch, anchor, epilogue, tile_loop)
    vectorize_tile(sch, consumer, tile_loop)
    return consumer


def loops_below(sch: s_tir.Schedule, block, loop) -> list:
    """The loops of ``block`` nested inside ``loop`` (empty when the block sits right under it)."""
    loops = sch.get_loops(block)
    target = sch.get_sref(loop)
    for i, candidate in enumerate(loops):
        if sch.get_sref(candidate).same_as(target):
            return list(loops[i + 1:])
    return []


def vectorize_tile(sch: s_tir.Schedule, block, tile_loop, vector_lanes: int | None = None) -> None:
    """Vectorize the innermost loop under ``tile_loop`` and unroll the others (a 1-wide tile has none). With
    ``vector_lanes``, an innermost loop of several whole vectors is split into unrolled vectors first."""
    inner = loops_below(sch, block, tile_loop)
    if not inner:
        return
    extent = int(sch.get(inner[-1]).extent)
    if vector_lanes and extent > vector_lanes and extent % vector_lanes == 0:
        inner[-1:] = sch.split(inner[-1], [None, vector_lanes])
    for loop in inner[:-1]:
        sch.unroll(loop)
    sch.vectorize(inner[-1])


def vectorize_steps(sch: s_tir.Schedule, loop, lanes: int, kept: int | None = None) -> None:
    """Split ``loop`` into steps of ``lanes`` and vectorize each step. ``kept``: how many of the loop's
    iterations do work when fewer than the steps cover (the block's predicate stops the rest: a slice
    inlined into a row kernel's output, a plane no vector divides): the whole steps below ``kept`` form a
    loop of their own (``loop_partition`` of the steps), vectorized, and the rest stays scalar. Vectorized
    under the predicate, a 4 x 6,906 store ran 11x slower (29 against 2.6 us on Zen 4). Partitioning the
    loop before splitting it left the two copies of a fused loop's block sharing their iteration
    variables."""
    steps, lane = sch.split(loop, [None, lanes])
    if kept is None:
        sch.vectorize(lane)
    elif kept // lanes:
        whole, _ = sch.loop_partition(steps, [kept // lanes, None])
        sch.vectorize(sch.get_loops(sch.get_child_blocks(whole)[0])[-1])


# Multiply-adds below which an INT8 conv kernel runs serial (the x86 rules: int8_conv2d, int8_amx). Zen 4,
# x86-avx512, 2 threads, 1x1 map with NCHW input (us, parallel -> serial): 88 -> 22 channels 0.92 -> 0.17,
# 8 -> 2 0.87 -> 0.14; each parallel loop costs about 0.7 us of thread wake-up. 8 -> 8 channels at 24x96
# (147k) stays parallel.
SERIAL_MACS = 1 << 16


def iterations(sch: s_tir.Schedule, block) -> int:
    """Iterations of ``block``'s loop nest: the product of its loop extents."""
    return math.prod(int(sch.get(loop).extent) for loop in sch.get_loops(block))


def largest_divisor(n: int, cap: int, multiple_of: int = 1) -> int:
    """Largest divisor of ``n`` that is <= ``cap`` and a multiple of ``multiple_of`` (1 when none is)."""
    for d in range(min(n, cap), 0, -1):
        if n % d == 0 and d % multiple_of == 0:
            return d
    return 1


def row_vector(width: int, vector_lanes: int) -> int:
    """The pixels per vector of a kernel vectorized along its rows: the widest divisor of ``width`` up to a
    vector, a multiple of 8 where the row is one (the NCHW conv2d rule's ``"ow"`` kernel)."""
    return largest_divisor(width, vector_lanes, multiple_of=8) if width % 8 == 0 else \
        largest_divisor(width, vector_lanes)


def dividing_vector(extent: int, vector_lanes: int) -> int | None:
    """The widest vector (``vector_lanes``, else 8, else 4 lanes) dividing ``extent``; None when none does."""
    return next((v for v in (vector_lanes, 8, 4) if v <= vector_lanes and extent % v == 0), None)


def lanes(vector_bits: int, dtype_bits: int = 32) -> int:
    return vector_bits // dtype_bits


def depthwise_row_tiles(sch: s_tir.Schedule, anchor, epilogue, loops, ow_block: int):
    """The depthwise row kernel shared by the FP32 and INT8 rules; returns the parallel channel loop.

    ``loops`` are the anchor's ``(n, c, oh, ow, ry, rx)``: rows are computed ``ow_block`` outputs at a time
    in vector registers with the window unrolled, the epilogue applied to the registers, channels in parallel.
    """
    n, c, oh, ow, ry, rx = loops
    ow_o, ow_i = sch.split(ow, [None, ow_block])
    sch.reorder(n, c, oh, ow_o, ry, rx, ow_i)
    register_tile(sch, anchor, epilogue, ow_o, [ry, rx], ow_i)
    channel = sch.fuse(n, c)
    sch.parallel(channel)
    return channel, ow_o


def anchor_loops(sch: s_tir.Schedule, anchor: str, depth: int, needs: tuple = ()):
    """``(anchor block, its loops)`` when ``sch`` has block ``anchor`` with ``depth`` loops and every block
    in ``needs``; None otherwise (the rule does not match, ``sch`` untouched)."""
    names = block_names(sch)
    if anchor not in names or any(n not in names for n in needs):
        return None
    block = sch.get_sblock(anchor)
    loops = sch.get_loops(block)
    return (block, loops) if len(loops) == depth else None

