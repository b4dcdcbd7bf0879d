"""A warp per output: the GEMV of batch-1 dense layers and squeeze-excite 1x1 convs on CUDA (FP32, fp16, INT8)."""

from __future__ import annotations

from tvm import s_tir, tirx

from ..common import inline_epilogue, inline_producers, loops_below
from .common import WARP

WARPS = 4  # outputs (one warp each) per thread block


def lanes_for(k: int) -> int:
    """Lanes splitting a reduction of ``k``: 32, or the largest power of two not above ``k``, so every lane
    has at least one term. A lane with none would never initialise its partial sum (the initialisation sits
    under the split's bounds check) and add a register's garbage to the warp's sum: a squeeze-excite conv
    reading 24 channels gave mobilenet_v3_large wrong, run-dependent outputs on the H100 that way."""
    return min(WARP, 1 << (max(k, 1).bit_length() - 1))


def vector_for(block, k: int) -> int:
    """Elements a lane reads at once: 16 bytes of a float GEMV's operands (8 halves, 4 floats) where K is a whole
    number of a warp's vector steps, so no step is partial; 1 otherwise and for INT8 (whose operands are read
    through its channel blocks)."""
    dtypes = {str(r.source.dtype) for r in block.reads}
    if len(dtypes) != 1 or next(iter(dtypes)) not in ("float16", "float32"):
        return 1
    vector = 16 // (2 if "float16" in dtypes else 4)
    return vector if k % (vector * lanes_for(k // vector)) == 0 and k // vector >= WARP else 1


def _unblock(sch: s_tir.Schedule, main, out) -> None:
    """Lay ``main``'s output out as ``out`` reads it where that read goes through ``//`` and ``%`` (an INT8
    conv writes channels as ``[o // 16, ..., o % 16]``): placed under a warp, ``out`` then covers that warp's
    one output. Read through ``//`` and ``%``, its region widened to the whole block of 16 (the analysis
    cannot invert them), and each warp stored 16 outputs of which it had computed one."""
    written = sch.get(main).writes[0].source
    read = next(r for r in sch.get(out).reads if r.source.same_as(written))
    index = [r.min for r in read.region]
    order = [iv.var for iv in sch.get(out).iter_vars]

    def plain(e) -> bool:  # one of out's axes, as it is
        return isinstance(e, tirx.Var) and any(e.same_as(v) for v in order)

    def blocked(e) -> bool:  # one of out's axes through // or % by a constant
        return isinstance(e, (tirx.FloorDiv, tirx.FloorMod)) and plain(e.a) and isinstance(e.b, tirx.IntImm)

    if not any(blocked(i) for i in index) or not all(plain(i) or blocked(i) for i in index):
        return

    def unblocked(*axes):
        parts = {v: 0 for v in order}
        for axis, i in zip(axes, index):
            if isinstance(i, tirx.FloorDiv):
                parts[i.a] = parts[i.a] + axis * i.b
            elif isinstance(i, tirx.FloorMod):
                parts[i.a] = parts[i.a] + axis
            else:
                parts[i] = axis
        return [parts[v] for v in order]

    sch.transform_layout(main, ("write", 0), unblocked)


def schedule_rows(sch: s_tir.Schedule, anchor: str) -> bool:
    """A warp per output element of ``anchor``, whose reduction reads a weight contiguous along its
    (fused) reduction axes: lanes split K, the partial sums added by warp shuffles, the epilogue after."""
    inline_producers(sch, anchor)
    main = sch.get_sblock(anchor)
    out = inline_epilogue(sch, anchor)
    if out is not None:
        sch.set_scope(main, 0, "local")
        _unblock(sch, main, out)
    kinds = [iv.iter_type for iv in sch.get(main).iter_vars]
    loops = sch.get_loops(main)
    sch.fuse(*[lp for lp, kind in zip(loops, kinds) if kind == tirx.IterVar.DataPar])  # the outputs, one loop
    reduce = sch.fuse(*[lp for lp, kind in zip(loops, kinds) if kind == tirx.IterVar.CommReduce])
    extent = int(sch.get(reduce).extent)
    vector = vector_for(sch.get(main), extent)
    if vector > 1:
        ko, lane, v = sch.split(reduce, [None, lanes_for(extent // vector), vector])
    else:
        ko, lane = sch.split(reduce, [None, lanes_for(extent)])
    partial = sch.rfactor(lane, 0)
    sch.set_scope(partial, 0, "local")
    j, ko, lane, *v = sch.get_loops(partial)
    jo, warp = sch.split(j, [None, WARPS])
    sch.reorder(jo, warp, lane, ko, *v)
    sch.bind(jo, "blockIdx.x")
    sch.bind(warp, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    sch.annotate(ko, "pragma_auto_unroll_max_step", 8)
    sch.annotate(ko, "pragma_unroll_explicit", 1)
    if v:
        # Each lane reads ``vector`` neighbouring elements of the input and the weight row as one 16-byte load
        # (a warp a contiguous 512 bytes a step, where one element a lane made 64 or 128).
        sch.unroll(v[0])
        for index in range(len(sch.get(partial).reads)):
            cached = sch.cache_read(partial, index, "local")
            sch.compute_at(cached, ko)
            sch.vectorize(sch.get_loops(cached)[-1])
    sch.reverse_compute_at(main, warp)
    sch.bind(loops_below(sch, main, warp)[0], "threadIdx.x")
    if out is not None:
        sch.reverse_compute_at(out, warp, preserve_unit_loops=True)
    return True
