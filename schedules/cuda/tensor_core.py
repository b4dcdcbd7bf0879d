"""fp16 and INT8 conv2d and dense on tensor cores: the implicit GEMM of :mod:`.conv2d` computed by ``wmma``
16x16x16 fragments (float16 operands and float32 accumulators, or int8 operands and int32 accumulators: the
INT8 kernels' input shifted to int8, ``computes.int8.SIGNED_SHIFT``; on sm_80 and later nvcc lowers the s8
fragments to the ``mma.sync`` m16n8k16/m16n8k32 s8 instructions).

The kernel is seen as ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` as in :mod:`.conv2d` (conv2d: I the output
pixels, J the output channels, K = input channels x window; the im2col gather happens on the load into shared
memory). A thread block owns a ``tile_i x tile_j`` tile of C:

- its warps form a ``warps_i x warps_j`` grid, each warp ``frags_i x frags_j`` accumulator fragments;
- K is walked ``step_k`` at a time; both operand tiles are staged in shared memory, double-buffered (the next
  step's global loads are issued, through registers, while the tensor cores work on this one), rows padded
  by 16 bytes so ``ldmatrix``-style fragment loads do not conflict on banks (int8: each 16-wide K slice a
  block of 16-byte rows, so every fragment starts 32-byte aligned as wmma loads require);
- the accumulators are stored to shared memory (the operand buffers' space, reused) and the epilogue (bias,
  folded batch-norm, residual add, activation, the cast to fp16; INT8: requantize, clip, residual, table) is
  applied on the way to the single global store, consecutive threads writing consecutive output pixels.

The tile shrinks until the grid has a block for every SM, skipping tiles that pad the GEMM by more than the
conv2d rule allows; ``step_k`` is the largest that keeps the block's shared memory within 48 KiB. Where the
grid still leaves the SMs short of warps (a late ResNet stage: a 7x7 map times 512 channels is 128 fragments
of 16x16, so 128 one-warp blocks walking K = 4,608 with one warp per SM, every load's latency exposed), the
block splits K over ``warps_k`` groups of warps: each group accumulates its own slices of every step (the
operand tiles are staged ``warps_k`` slices wide, by all the block's warps), the groups' accumulators meet in
shared memory and each output is their sum, then the epilogue (TVM's ``rfactor``; no second kernel and no
global workspace, so CUDA graph capture is unaffected). This is
TVM's own ``wmma`` recipe (dlight's ``MatmulTensorization``) with tvmfuse's tile choice: dlight's fixed
128x128 tile padded a 64-channel ResNet layer to 128 columns and gave 25 blocks to 132 SMs.
"""

from __future__ import annotations

import contextlib
import dataclasses

from tvm import s_tir

from .common import MAX_SHARED_BYTES, WARP, fill_sms

FRAG = 16  # the wmma fragment edge
PAD_BYTES = 16  # row padding of an fp16 operand tile (wmma loads need rows a multiple of 16 bytes apart)
VECTOR = 4  # elements per thread in an operand copy (an int8 conv weight is contiguous in fours along K)
OPERANDS = {"float16": "float32", "int8": "int32"}  # operand dtype -> accumulator dtype
# (warps_i, warps_j, frags_i, frags_j), largest tile first.
TILES = ((2, 2, 4, 2), (2, 2, 2, 4), (2, 2, 2, 2), (2, 2, 2, 1), (2, 2, 1, 2), (2, 2, 1, 1), (2, 1, 1, 1),
         (1, 1, 1, 1))
STEPS_K = {"float16": (64, 32, 16), "int8": (128, 64, 32, 16)}
SPLITS_K = (2, 4, 8)  # the warps_k a block may split K over
WARPS_PER_SM = 8  # warps the grid should give each SM before K is split (latency hiding of the operand loads)
MAX_WARPS = 16  # a split block's warps at most (512 threads)
MIN_GROUP_K = 128  # K a group of a split block reduces at least (below, the split's sum costs what it saves)
# False only for the CPU check (tvmfuse.fuzz.cuda_cpu, :func:`untensorized`): every stage tiled, placed and laid
# out, the fragment loads, products and stores left as the loops the wmma instructions would replace.
TENSORIZE = True


@contextlib.contextmanager
def untensorized():
    """Tensor-core schedules made without their final tensorize steps while inside (:data:`TENSORIZE`)."""
    global TENSORIZE
    saved, TENSORIZE = TENSORIZE, False
    try:
        yield
    finally:
        TENSORIZE = saved


@dataclasses.dataclass(frozen=True)
class Config:
    warps_i: int
    warps_j: int
    frags_i: int
    frags_j: int
    step_k: int = 32
    operand: str = "float16"  # a key of OPERANDS
    warps_k: int = 1  # groups of warps splitting K (each the warps_i x warps_j grid), summed in shared memory

    @property
    def tile_i(self) -> int:
        return self.warps_i * self.frags_i * FRAG

    @property
    def tile_j(self) -> int:
        return self.warps_j * self.frags_j * FRAG

    @property
    def warps(self) -> int:
        """Warps of one group (the tile's grid); the block has ``warps * warps_k``."""
        return self.warps_i * self.warps_j

    @property
    def block_warps(self) -> int:
        return self.warps * self.warps_k

    @property
    def span_k(self) -> int:
        """K staged per step of the main loop: one ``step_k`` slice for each group."""
        return self.step_k * self.warps_k

    @property
    def element_bytes(self) -> int:
        return 1 if self.operand == "int8" else 2

    @property
    def pad_elements(self) -> int:
        """Row padding of a shared operand tile: 16 bytes of halves; none for int8, whose tiles are stored as
        16-byte rows of one K slice each (:func:`schedule_gemm`)."""
        return 0 if self.operand == "int8" else PAD_BYTES // self.element_bytes

    def operand_bytes(self, rows: int) -> int:
        """Shared memory of one double-buffered operand tile of ``rows`` rows."""
        return 2 * rows * (self.span_k + self.pad_elements) * self.element_bytes

    @property
    def pad_floats(self) -> int | None:
        """Row padding of the shared accumulator tile: a multiple of 4 (wmma's store), at least 4, and enough
        that the tile is larger than either operand tile; None when that takes a padding of 32 or more (the
        operand tiles are then long in K for their width: not a config worth building). TVM's StorageRewrite
        would otherwise place the float32 tile in a dead, larger float16 operand buffer, whose accesses
        through the wmma store then fail to lower (``tvm_access_ptr element type must match the source
        buffer``)."""
        for pad in range(4, 32, 4):
            if self.warps_k * self.tile_i * (self.tile_j + pad) * 4 > max(self.operand_bytes(self.tile_i),
                                                           self.operand_bytes(self.tile_j)):
                return pad
        return None

    def shared_bytes(self) -> int:
        """Shared memory of one block: the double-buffered operand tiles, or the accumulator tile that reuses
        their space after the main loop, whichever is larger (float32 and int32 accumulators alike)."""
        operands = self.operand_bytes(self.tile_i) + self.operand_bytes(self.tile_j)
        return max(operands, self.warps_k * self.tile_i * (self.tile_j + (self.pad_floats or 0)) * 4)


def _steps(k: int, operand: str) -> list[int]:
    """The reduction steps for a K: those not longer than K rounded up to whole fragments."""
    return [s for s in STEPS_K[operand] if s <= -(-k // FRAG) * FRAG]


def _fits(config: Config) -> bool:
    return config.pad_floats is not None and config.shared_bytes() <= MAX_SHARED_BYTES


def default_config(i: int, j: int, k: int, sms: int = 132, operand: str = "float16",
                   whole_j: bool = False) -> Config | None:
    """The largest tile whose grid gives every SM a block (else the smallest that pads least), with the
    largest ``step_k`` (not above K in whole fragments) that fits 48 KiB of shared memory, K split over warps
    where the grid is short of them (:func:`split_k`); ``whole_j``: only tiles that divide J (None when none
    does, see :func:`.conv2d.schedule_gemm`)."""
    steps = _steps(k, operand)
    configs = []
    for tile in TILES:
        if whole_j and j % (tile[1] * tile[3] * FRAG):
            continue
        fitting = [Config(*tile, step_k=s, operand=operand) for s in steps
                   if _fits(Config(*tile, step_k=s, operand=operand))]
        if fitting:
            configs.append(fitting[0])
    return split_k(fill_sms(configs, i, j, sms), i, j, k, sms) if configs else None


def split_k(config: Config, i: int, j: int, k: int, sms: int = 132) -> Config:
    """``config`` with the fewest ``warps_k`` groups (2, 4, 8) that give the grid ``WARPS_PER_SM`` warps per SM
    (as many as allowed where none does): at most ``MAX_WARPS`` in a block, two steps of the main loop or more
    for each group and ``MIN_GROUP_K`` of K, K padded no further than ``config`` pads it, steps of two
    fragments or more (a one-fragment step gets no software pipeline); the step re-chosen for each split, the
    largest that fits shared memory. ``config`` itself where the grid has the warps already."""
    blocks = -(-i // config.tile_i) * -(-j // config.tile_j)
    whole_k = -(-k // FRAG) * FRAG

    def padded(c: Config) -> int:
        return -(-k // c.span_k) * c.span_k

    best = config
    for warps_k in SPLITS_K:
        if blocks * best.block_warps >= WARPS_PER_SM * sms or config.warps * warps_k > MAX_WARPS:
            break
        options = [dataclasses.replace(config, warps_k=warps_k, step_k=s) for s in _steps(k, config.operand)]
        options = [c for c in options if c.step_k > FRAG and _fits(c) and padded(c) <= padded(config)
                   and whole_k >= max(2 * c.span_k, MIN_GROUP_K * warps_k)]
        if not options:
            break
        best = max(options, key=lambda c: c.step_k)
    return best


def candidates(i: int, j: int, k: int, sms: int = 132, operand: str = "float16",
               whole_j: bool = False) -> list[Config]:
    """The configs an offline tuning round times: the default first, then every tile with every step that fits
    shared memory and is not longer than K, and every tile with K split as :func:`split_k` splits it, each
    once (``whole_j``: those dividing J)."""
    steps = _steps(k, operand)
    default = default_config(i, j, k, sms, operand, whole_j)
    plain = [Config(*t, step_k=s, operand=operand) for t in TILES for s in steps
             if _fits(Config(*t, step_k=s, operand=operand))]
    found = ([default] if default else []) + plain + [split_k(c, i, j, k, sms) for c in plain]
    return list(dict.fromkeys(c for c in found if not whole_j or j % c.tile_j == 0))


def schedule_gemm(sch: s_tir.Schedule, main, config: Config, pixels_inner: bool, vector_rows: bool = False) -> None:
    """Schedule the re-indexed GEMM block ``main`` (``C[S, I, J] += A[S, I, K] * B[S, J, K]``, operands of
    ``config.operand`` cast to a float32 or int32 sum) on wmma fragments, in place. ``pixels_inner``: a conv (A, the input, and
    the output contiguous along I, the pixels; B, the OIHW weight, along K); else a dense (A along K; B, the
    ``[K, N]`` weight, and the output along J). ``vector_rows``: the conv's input tile is read 4 pixels a thread
    (:func:`.conv2d.schedule_gemm` says when)."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain, auto_inline_producers
    from tvmfuse.tvmscript import light_tensor_intrin

    light_tensor_intrin("cuda")
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    sch.pad_einsum(main, [1, config.tile_i, config.tile_j, config.span_k])
    batch, i, j, k = sch.get_loops(main)
    final = group = None
    if config.warps_k > 1:
        # K as (steps, group, slice); the group axis factored out of the sum becomes a spatial axis of the
        # GEMM block (partial sums [group, S, I, J]) and ``final`` sums the groups.
        ko, group, k = sch.split(k, [None, config.warps_k, config.step_k])
        final, main = main, sch.rfactor(group, factor_axis=0)
        batch, i, j, ko, group, k = sch.get_loops(main)
    i, i_frag = sch.split(i, [None, FRAG])
    j, j_frag = sch.split(j, [None, FRAG])
    k, k_frag = sch.split(k, [None, FRAG])
    if group is None:
        sch.reorder(i, j, k, i_frag, j_frag, k_frag)
    else:
        sch.reorder(i, j, group, ko, k, i_frag, j_frag, k_frag)
    inner = main
    outer = sch.blockize(i_frag)

    bi, wi, fi = sch.split(i, [None, config.warps_i, config.frags_i])
    bj, wj, fj = sch.split(j, [None, config.warps_j, config.frags_j])
    if group is None:
        ko, ki = sch.split(k, [None, config.step_k // FRAG])
        sch.reorder(bi, bj, wi, wj, ko, ki, fi, fj)
    else:
        ki = k
        sch.reorder(bi, bj, wi, wj, group, ko, ki, fi, fj)
    # Two-stage pipeline over K: the next step's operand loads (global -> registers -> shared) overlap this
    # step's fragment loads and mma (TVM's software pipelining; the order lists the blocks under ko).
    if config.step_k > FRAG:  # (with one fragment per step, ki vanishes and the pipeline fails to lower)
        sch.annotate(ko, "software_pipeline_order", [0, 3, 1, 4, 5, 2, 6])
        sch.annotate(ko, "software_pipeline_stage", [0, 0, 0, 0, 0, 1, 1])
        sch.annotate(ki, "software_pipeline_order", [0, 1, 2])
        sch.annotate(ki, "software_pipeline_stage", [0, 0, 1])
    block_x = sch.fuse(batch, bi, bj)
    warp = sch.fuse(wi, wj) if group is None else sch.fuse(wi, wj, group)
    sch.bind(block_x, "blockIdx.x")
    sch.bind(warp, "threadIdx.y")

    # Each operand tile is read along the axis its global tensor is contiguous in, so a warp's loads coalesce:
    # an NCHW conv's input along the pixels (I), a dense's [K, N] weight along the columns (J), the rest
    # along K (in vectors of 4).
    for index, rows_inner in ((0, pixels_inner), (1, not pixels_inner)):
        fetch = sch.cache_read(outer, index, "shared.dyn")
        sch.compute_at(fetch, ko)
        rows, red = sch.get_loops(fetch)[-2:]
        if rows_inner:
            sch.reorder(red, rows)
        vector = not rows_inner or (vector_rows and index == 0)
        loop = sch.fuse(red, rows) if rows_inner else sch.fuse(rows, red)
        _, ty, tx, *vec = sch.split(loop, [None, config.block_warps, WARP] + [VECTOR] * vector)
        if vector:
            sch.vectorize(vec[0])
        sch.bind(tx, "threadIdx.x")
        sch.bind(ty, "threadIdx.y")
        if config.operand == "int8":
            # A wmma load needs a 32-byte aligned fragment, and an int8 fragment is 16 bytes of K: in rows the
            # odd ones would start mid-way. Each 16-wide K slice is stored as a block of its own rows instead
            # ([K/16, rows, 16]: fragments 256 bytes apart, rows 16 bytes, which no bank conflict needs padded).
            sch.transform_layout(fetch, ("write", 0), lambda s, i, k: (s, k // FRAG, i, k % FRAG))
        else:
            sch.storage_align(fetch, 0, axis=-2, factor=2 * config.pad_elements, offset=config.pad_elements)
        sch.annotate(fetch, "tirx.manifest_shared_memory_local_stage", 1)
        sch.annotate(fetch, "double_buffer_scope", 0)
        auto_inline_producers(sch, fetch)

    frag_a = sch.cache_read(outer, 0, "wmma.matrix_a")
    frag_b = sch.cache_read(outer, 1, "wmma.matrix_b")
    sch.compute_at(frag_a, ki)
    sch.compute_at(frag_b, ki)
    staged = sch.cache_write(outer, 0, "shared.dyn")
    store = sch.cache_write(outer, 0, "wmma.accumulator")
    sch.reverse_compute_at(store, warp)
    if final is None:
        sch.reverse_compute_at(staged, warp)
    si, sj = sch.get_loops(store)[-2:]
    si0, si1 = sch.split(si, [None, FRAG])
    sj0, sj1 = sch.split(sj, [None, FRAG])
    sch.reorder(si0, sj0, si1, sj1)
    init = sch.get_child_blocks(sch.decompose_reduction(outer, ko))[0]

    intrin = get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared.dyn", in_dtype=config.operand,
                                   out_dtype=OPERANDS[config.operand], trans_b=True)
    for frag, name in ((frag_a, "load_a"), (frag_b, "load_b")):
        fi_, fj_ = sch.get_loops(frag)[-2:]
        fi0, fi1 = sch.split(fi_, [None, FRAG])
        fj0, fj1 = sch.split(fj_, [None, FRAG])
        sch.reorder(fi0, fj0, fi1, fj1)
        sch.unroll(fi0)
        sch.unroll(fj0)
        if TENSORIZE:
            sch.tensorize(fi1, intrin[name])
    store_name = sch.get(store).name_hint
    if TENSORIZE:
        sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
        sch.tensorize(sch.get_loops(store)[-2], intrin["store"])
        store_name += "_o"
    # Rows of the shared accumulator tile padded, set on the block the tensorized store became (tensorize
    # drops the annotation of the block it replaces).
    stride = config.tile_j + config.pad_floats
    sch.storage_align(sch.get_sblock(store_name), 0, -2, 32, stride % 32)
    if TENSORIZE:
        sch.tensorize(sch.get_loops(inner)[-3], intrin["compute"])

    if final is not None:
        _sum_groups(sch, staged, final, block_x, config, pixels_inner)
        return
    auto_inline_consumer_chain(sch, staged)
    _, tx = sch.split(_store_order(sch, staged, pixels_inner), [None, WARP])
    sch.bind(tx, "threadIdx.x")


def _store_order(sch: s_tir.Schedule, block, pixels_inner: bool):
    """The epilogue and store of ``block`` as one loop, the output's contiguous axis innermost (the pixels of
    a conv, the columns of a dense), so consecutive threads write neighbours."""
    oi, oj = sch.get_loops(block)[-2:]
    if pixels_inner:
        sch.reorder(oj, oi)
        oi, oj = oj, oi
    return sch.fuse(oi, oj)


def _sum_groups(sch: s_tir.Schedule, staged, final, block_x, config: Config, pixels_inner: bool) -> None:
    """A split block's end: the groups' accumulators, stored to one shared tile each (``staged`` made the
    partial sums' own buffer, which then lives in shared memory), are summed by every thread of the block for
    its outputs (``final``, in a register), and the epilogue is applied on the way to the single store."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain

    sch.compute_inline(staged)
    total = sch.cache_write(final, 0, "local")
    sch.reverse_compute_at(final, block_x)
    sch.reverse_compute_at(total, block_x)
    auto_inline_consumer_chain(sch, total)
    _, ty, tx = sch.split(_store_order(sch, total, pixels_inner), [None, config.block_warps, WARP])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(final, tx)
