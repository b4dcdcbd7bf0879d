"""conv2d (groups 1, NCHW, any window/stride/dilation) and dense as an implicit GEMM on CUDA cores, fp32.

The kernel is seen as ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` (conv2d: I the output pixels, J the output
channels, K = input channels x window; dense: I the rows, J the columns): the operands are re-indexed into
that form without being materialised (the im2col gather happens on the load into shared memory), padded to
whole tiles, and computed in tiles:

- a thread block owns a ``tile_i x tile_j`` tile of C and walks K ``step_k`` at a time, both operand tiles
  staged in shared memory by all its threads (rows padded by one word against bank conflicts);
- each thread accumulates a ``micro_i x micro_j`` register tile from them;
- the epilogue (bias, folded batch-norm, residual add, activation) is applied to the registers and stored
  once.

The tile shrinks (64x64, 32x64, 64x32, 32x32, 16x32, 16x16) until the grid has a block for every SM, so the
late ResNet stages (7x7 maps, 2,048 channels) do not run on a sixth of the GPU, skipping tiles that would pad
the GEMM by more than 15% (96 channels in 64-wide tiles).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import s_tir, tirx

from .. import families
from ..common import block_names
from .common import fill_sms

ANCHOR = "conv2d_nchw"
# (threads_i, threads_j, micro_i, micro_j), largest tile first.
TILES = ((16, 16, 4, 4), (8, 16, 4, 4), (16, 8, 4, 4), (8, 8, 4, 4), (8, 8, 2, 4), (8, 8, 2, 2))


@dataclasses.dataclass(frozen=True)
class Config:
    threads_i: int
    threads_j: int
    micro_i: int
    micro_j: int
    step_k: int = 16

    @property
    def tile_i(self) -> int:
        return self.threads_i * self.micro_i

    @property
    def tile_j(self) -> int:
        return self.threads_j * self.micro_j

    @property
    def threads(self) -> int:
        return self.threads_i * self.threads_j


def default_config(i: int, j: int, k: int, sms: int = 132, whole_j: bool = False) -> Config | None:
    """The largest tile whose grid gives every SM a block (else the smallest), among those padding I and J by at
    most ``MAX_WASTE`` (or as little as any tile does); ``step_k`` 8 for short reductions (a 3-channel stem: K = 27). Measured on the
    H100: a 1x1 conv to 96 channels on a 112x112 map ran at 0.71x of dlight's speed in 64x64 tiles, a third of
    each a padded column. ``whole_j``: only tiles that divide J (a batched GEMM, :func:`schedule_gemm`); None
    when none does."""
    step_k = 8 if k <= 32 else 16
    configs = [Config(*tile, step_k=step_k) for tile in TILES]
    configs = [c for c in configs if not whole_j or j % c.tile_j == 0]
    return fill_sms(configs, i, j, sms) if configs else None


STEPS_K = (8, 16, 32)  # the reduction step a tile is staged in (shared memory: (tile_i + tile_j) x step_k words)


def candidates(i: int, j: int, k: int, sms: int = 132, whole_j: bool = False) -> list[Config]:
    """The configs an offline tuning round times for a GEMM of ``I x J x K``: the default first (what compile
    gives without logs), then every tile of :data:`TILES` with every reduction step no longer than K, each
    once (``whole_j``: those dividing J)."""
    default = default_config(i, j, k, sms, whole_j)
    steps = [s for s in STEPS_K if s <= max(k, STEPS_K[0])]
    found = ([default] if default else []) + [Config(*tile, step_k=s) for tile in TILES for s in steps]
    return list(dict.fromkeys(c for c in found if not whole_j or j % c.tile_j == 0))


def gemm_dims(func, anchor: str = ANCHOR) -> tuple[int, int, int] | None:
    """(I, J, K) of the GEMM ``func``'s ``anchor`` block is seen as, None when it is not one or is a GEMV
    (a one-pixel conv: no tile to choose)."""
    extents = gemm_extents(func, anchor)
    return extents[1:] if extents else None


def gemm_extents(func, anchor: str = ANCHOR) -> tuple[int, int, int, int] | None:
    """(S, I, J, K) of :func:`gemm_dims`'s GEMM: S the batch (a grouped conv's groups; 1 otherwise)."""
    from tvm.s_tir.dlight.gpu.matmul import get_index_map

    sch = s_tir.Schedule(func)
    main = _main_block(sch, anchor)
    if main is None or not get_index_map(sch.get(main)):
        return None
    if anchor == ANCHOR and one_pixel(sch.get(main)):
        return None
    block_map = get_index_map(sch.get(main))[0]
    sch.transform_block_layout(main, block_map)
    batch = [int(iv.dom.extent) for iv in sch.get(main).iter_vars][:-3]
    return (int(np.prod(batch)) if batch else 1, *gemm_shape(sch, main))


def gemm_shape(sch: s_tir.Schedule, block) -> tuple[int, int, int]:
    """(I, J, K) of the re-indexed main block."""
    extents = [int(iv.dom.extent) for iv in sch.get(block).iter_vars]
    return extents[-3], extents[-2], extents[-1]


def _main_block(sch: s_tir.Schedule, anchor: str):
    if anchor not in block_names(sch):
        return None
    block = sch.get_sblock(anchor)
    if not any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars):
        return None
    return block


def gemm_candidates(func, sms: int, anchor: str = ANCHOR) -> list:
    """The tiles an offline tuning round times for the GEMM of ``func``'s ``anchor`` block: the tensor-core
    tiles (:func:`.tensor_core.candidates`) for float16 or int8 operands, else :func:`candidates`; none for a
    GEMV."""
    from . import tensor_core

    extents = gemm_extents(func, anchor)
    if not extents:
        return []
    batch, *dims = extents
    sch = s_tir.Schedule(func)
    operand = tensor_core_operand(sch.get(sch.get_sblock(anchor)))
    if operand:
        return tensor_core.candidates(*dims, sms, operand, whole_j=batch > 1)
    return candidates(*dims, sms, whole_j=batch > 1)


def tensor_core_operand(block) -> str | None:
    """The dtype of the GEMM block's (a ``SBlock``) two operands when the tensor cores take them (float16, or
    int8: the INT8 kernels' shifted input and weight); None: the CUDA-core tiles."""
    from .tensor_core import OPERANDS

    dtypes = {str(block.reads[n].source.dtype) for n in (0, 1)}
    return dtypes.pop() if len(dtypes) == 1 and next(iter(dtypes)) in OPERANDS else None


def kernel_candidates(func, sms: int) -> list:
    """The tiles an offline tuning round times for a conv2d kernel (:func:`gemm_candidates`)."""
    return gemm_candidates(func, sms)


def schedule(sch: s_tir.Schedule, sms: int, config: Config | None = None) -> bool:
    """Schedule a conv2d partition kernel in place; False (``sch`` untouched) when it is not one. A conv whose
    output is one pixel (squeeze-excite) is a GEMV over its OIHW weight (:func:`.gemv.schedule_rows`)."""
    from . import gemv

    if ANCHOR in block_names(sch) and one_pixel(sch.get(sch.get_sblock(ANCHOR))):
        return gemv.schedule_rows(sch, ANCHOR)
    return schedule_gemm(sch, ANCHOR, sms, config)


def one_pixel(block) -> bool:
    """Whether a conv's accumulation block (an ``SBlock``, NCHW or NCHW[b]c: height and width its 3rd and 4th
    axes) has a one-pixel output (squeeze-excite): a GEMV, no tile to choose."""
    out_h, out_w = (int(iv.dom.extent) for iv in block.iter_vars[2:4])
    return out_h == out_w == 1


def schedule_gemm(sch: s_tir.Schedule, anchor: str, sms: int, config=None) -> bool:
    """Schedule the kernel whose reduction block is ``anchor`` (``conv2d_nchw``, ``T_matmul_NN``) in place;
    False (``sch`` untouched) when it is not a GEMM-shaped reduction. Float16 and int8 operands go to the
    tensor cores (:mod:`.tensor_core`; ``config`` then one of its configs)."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain, auto_inline_producers, get_index_map

    from . import tensor_core

    main = _main_block(sch, anchor)
    if main is None or not get_index_map(sch.get(main)):
        return False
    operand = tensor_core_operand(sch.get(main))
    extents = gemm_extents(sch.mod["main"], anchor)
    if extents is not None and extents[0] > 1:
        # A batched GEMM (a grouped conv) takes only tiles that divide J: the store of a padded column lands
        # in the next group's channels (its guard bounds the flattened channel, not the column), where blocks
        # race. An H200 showed it: 12-26% of the outputs wrong for groups of 2 and 24 output channels.
        _, i, j, k = extents
        if config is None:
            config = (tensor_core.default_config(i, j, k, sms, operand, whole_j=True) if operand
                      else default_config(i, j, k, sms, whole_j=True))
        if config is None or not whole_columns(j, config):
            return False
    if operand:
        four_pixels = pixels_in_fours(sch.get(main))
        _taps_outer(sch, main)
    reindex_a = sch.reindex(main, ("read", 0))
    reindex_b = sch.reindex(main, ("read", 1))
    reindex_c = sch.reindex(main, ("write", 0))
    block_map, a_map, b_map, c_map = get_index_map(sch.get(main))
    sch.transform_layout(reindex_a, ("write", 0), a_map)
    sch.transform_layout(reindex_b, ("write", 0), b_map)
    sch.transform_layout(reindex_c, ("read", 0), c_map)
    sch.transform_block_layout(main, block_map)
    i, j, k = gemm_shape(sch, main)
    if operand:
        config = config or tensor_core.default_config(i, j, k, sms, operand)
        vector_rows = four_pixels and (operand != "int8" or _unconditioned_int8_load(sch, k, config.span_k))
        tensor_core.schedule_gemm(sch, main, config, pixels_inner=anchor != families.DENSE.anchor_block,
                                  vector_rows=vector_rows)
        return True
    if config is None:
        config = default_config(i, j, k, sms)
    sch.pad_einsum(main, [1, config.tile_i, config.tile_j, config.step_k])
    batch, li, lj, lk = sch.get_loops(main)
    bi, ti, mi = sch.split(li, [None, config.threads_i, config.micro_i])
    bj, tj, mj = sch.split(lj, [None, config.threads_j, config.micro_j])
    ko, ki = sch.split(lk, [None, config.step_k])
    sch.reorder(bi, bj, ti, tj, ko, ki, mi, mj)
    block_x = sch.fuse(batch, bi, bj)
    thread = sch.fuse(ti, tj)
    sch.bind(block_x, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.annotate(thread, "pragma_auto_unroll_max_step", 256)
    sch.annotate(thread, "pragma_unroll_explicit", 1)
    store = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(store, thread, preserve_unit_loops=True)
    for index in (0, 1):
        fetch = sch.cache_read(main, index, "shared")
        sch.compute_at(fetch, ko, preserve_unit_loops=True)
        depth = len(sch.get_loops(fetch)) - 3  # the fetch's own (batch, rows, k) loops
        _, tx = sch.split(sch.fuse(*sch.get_loops(fetch)[depth:]), [None, config.threads])
        sch.bind(tx, "threadIdx.x")
        sch.storage_align(fetch, 0, axis=1, factor=32, offset=1)
        auto_inline_producers(sch, fetch)
    auto_inline_consumer_chain(sch, store)
    sch.decompose_reduction(main, ko)
    return True


def whole_columns(j: int, config) -> bool:
    """Whether ``config``'s tile divides a grouped conv's columns ``j`` (its group's output channels). Where it
    does not, a padded column's store is guarded by the flattened channel's bound, not the group's, and lands in
    the next group's channels, which another block owns: a race on a GPU, which a serial run of the blocks in
    reverse order shows on the CPU (``tvmfuse.fuzz.cuda_cpu``, ``tests/schedules/test_cuda_group_conv.py``)."""
    return j % config.tile_j == 0


def pixels_in_fours(block) -> bool:
    """Whether a conv's GEMM block (an ``SBlock``, before re-indexing) reads its input in aligned runs of 4 along
    its output pixels: a 1x1 window, stride 1, no padding (the input's map the output's) and a map of a
    multiple of 4 pixels, so 4 neighbouring output pixels are 4 neighbouring input elements, and no run
    crosses a channel or an image. The tensor-core rule then loads the input tile 4 elements a thread."""
    kinds = [iv.iter_type for iv in block.iter_vars]
    spatial = kinds.count(tirx.IterVar.DataPar)
    shape = block.reads[0].source.shape
    if (spatial, len(kinds) - spatial) not in ((4, 3), (5, 4)) or len(shape) < 4:  # NCHW or INT8's; not a dense
        return False
    extents = [int(iv.dom.extent) for iv in block.iter_vars]
    window = extents[spatial + 1:spatial + 3]  # (row, column) of (c, r, s) and of INT8's (c // 4, r, s, c % 4)
    out_h, out_w = extents[2:4]
    in_h, in_w = (int(d) for d in shape[2:4])
    return window == [1, 1] and (in_h, in_w) == (out_h, out_w) and out_h * out_w % 4 == 0


def _unconditioned_int8_load(sch: s_tir.Schedule, k: int, span_k: int) -> bool:
    """Whether an INT8 conv's input is read with no condition in the load: its repacking (NCHW4c,
    ``families.CONV2D.int8.pad_block``) pads no channel (its blocks of 4 hold the input's channels exactly) and
    K is not padded to the step. With a condition, TVM's CUDA code for a vector of 4 conditional bytes does not
    compile (``int v_ = make_ushort4(...)``, seen on ShuffleNet's 116 channels), so the tile is loaded a byte a
    thread."""
    if k % span_k:
        return False
    pack = families.CONV2D.int8.pad_block
    if pack not in block_names(sch):
        return True
    block = sch.get(sch.get_sblock(pack))
    return int(block.writes[0].source.shape[1]) * 4 == int(block.reads[0].source.shape[1])


def _taps_outer(sch: s_tir.Schedule, main) -> None:
    """Order a windowed conv's reduction (input channel, kernel row, kernel column) as (row, column, channel),
    so K's steps walk the channels of one tap: with the channels a multiple of 16, the tap, its padding
    test and its offset are the same for a whole step and leave the per-element index arithmetic (the input
    channel of a step a shift of K, not a division by 9 and two by 3). nvcc's PTX for ResNet's fp16 3x3
    layers: 334-786 instructions instead of 792-1,410. An INT8 conv reduces (channel block of 4, row, column,
    channel in the block) and becomes (row, column, block, channel): its weight's 4 channels of a block stay
    one 32-bit load. The sum's order changes, not its terms (INT8 stays exact). A 1x1 conv, or channels not
    a multiple of 16 (a 3-channel stem, whose taps then split fragments), keep the order."""
    block = sch.get(main)
    kinds = [iv.iter_type for iv in block.iter_vars]
    spatial = kinds.count(tirx.IterVar.DataPar)
    if kinds != [tirx.IterVar.DataPar] * spatial + [tirx.IterVar.CommReduce] * (len(kinds) - spatial):
        return
    extents = [int(iv.dom.extent) for iv in block.iter_vars[spatial:]]
    if (spatial, len(extents)) == (4, 3):  # NCHW: (c, r, s)
        channels, rows, columns = extents
        order = lambda n, f, y, x, c, r, s: (n, f, y, x, r, s, c)  # noqa: E731
    elif (spatial, len(extents)) == (5, 4):  # INT8: (c // 4, r, s, c % 4), output channels blocked
        blocks, rows, columns, lanes = extents
        channels = blocks * lanes
        order = lambda n, ob, y, x, oi, cb, r, s, ci: (n, ob, y, x, oi, r, s, cb, ci)  # noqa: E731
    else:
        return
    if channels % 16 or rows * columns == 1:
        return
    sch.transform_block_layout(main, order)
