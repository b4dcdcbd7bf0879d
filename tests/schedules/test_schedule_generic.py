"""The generic x86 schedule of the kernels TVM's default path lowers (schedules/x86/generic.py): ops outside
every partition run parallel and vectorized, compute what TVM's unscheduled kernels compute, and a tuning
log's "default kept" record replays this schedule."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import te, topi
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.x86 import generic

from helpers.schedules import run_in_place
from helpers import HOST, ort_run
from helpers import make_model

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32


def _loop_kinds(func) -> list:
    """The kinds of every loop above the stages of ``func``."""
    sch = tvm.s_tir.Schedule(func)
    return [sch.get(loop).kind for block in sch.get_child_blocks(sch.get_sblock("root"))
            for loop in sch.get_loops(block)]


def _same_as_unscheduled(func, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in func.params]
    want = run_in_place(func, [a.copy() for a in arrays])
    scheduled = generic.apply(func, LANES)
    assert scheduled is not None
    np.testing.assert_allclose(run_in_place(scheduled, arrays), want, rtol=1e-6, atol=1e-6)
    return scheduled


def test_elementwise_chain_is_one_parallel_vectorized_stage():
    a, b = te.placeholder((4, 64, 28, 28), name="a"), te.placeholder((1, 64, 1, 1), name="b")
    out = topi.nn.relu(topi.add(a, b))
    s = _same_as_unscheduled(te.create_prim_func([a, b, out]))
    kinds = _loop_kinds(s)
    assert kinds.count(ForKind.PARALLEL) == 1 and kinds.count(ForKind.VECTORIZED) == 1
    sch = tvm.s_tir.Schedule(s)
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) == 1  # the add inlined into the relu


def test_reduction_runs_its_rows_in_parallel():
    a = te.placeholder((64, 1000), name="a")
    kinds = _loop_kinds(_same_as_unscheduled(te.create_prim_func([a, topi.nn.softmax(a, axis=1)])))
    assert ForKind.PARALLEL in kinds


def _sum_matches_float64(func, shape):
    # A sum in another order rounds differently: compare with float64, relative to the sum of magnitudes.
    a = np.random.default_rng(0).standard_normal(shape).astype("float32")
    got = run_in_place(func, [a, np.zeros((), "float32")])
    assert abs(float(got) - a.astype(np.float64).sum()) <= 1e-6 * np.abs(a).astype(np.float64).sum()
    return func


@pytest.mark.parametrize("reduce", [topi.min, topi.max, topi.sum])
@pytest.mark.parametrize("shape", [(1, 96, 112, 112), (1, 3, 224, 224), (1, 24, 56, 56)])
def test_whole_tensor_reduction_is_split_into_parallel_vector_partials(reduce, shape):
    # Dynamic quantization reduces every activation to its min and max: one scalar loop unscheduled.
    a = te.placeholder(shape, name="a")
    func = te.create_prim_func([a, reduce(a)])
    s = (_sum_matches_float64(generic.apply(func, LANES), shape) if reduce is topi.sum
         else _same_as_unscheduled(func))
    sch = tvm.s_tir.Schedule(s)
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert len(blocks) == 2 and blocks[0].endswith("_rf")  # partial results, then their combination
    partial = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])
    kinds = [sch.get(loop).kind for loop in partial]
    assert kinds[0] == ForKind.PARALLEL and kinds[-1] == ForKind.VECTORIZED
    assert int(sch.get(partial[-1]).extent) == (LANES if shape[-1] % LANES == 0 else 8)


def _row_ops():
    a, g, b = (te.placeholder(s, name=n) for s, n in [((40, 480), "a"), ((480,), "g"), ((480,), "b")])
    return {"softmax": ([a], topi.nn.fast_softmax(a, axis=-1)),
            "layer_norm": ([a, g, b], topi.nn.layer_norm(a, g, b, axis=[-1], epsilon=1e-5)),
            "mean": ([a], topi.sum(a, axis=-1, keepdims=True))}


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "mean"])
def test_row_reduction_keeps_a_vector_of_partials_per_row(op):
    # A recognizer's CTC head is a 40 x 18720 Softmax: one scalar chain per row unscheduled (1.9 ms), 0.26 ms
    # with the rows' partial results in vectors (Zen 4).
    inputs, out = _row_ops()[op]
    func = te.create_prim_func([*inputs, out])
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in t.shape]).astype("float32") for t in [*inputs, out]]
    want = run_in_place(func, [a.copy() for a in arrays])
    s = generic.apply(func, LANES)
    np.testing.assert_allclose(run_in_place(s, arrays), want, rtol=1e-5, atol=1e-5)  # sums in another order
    sch = tvm.s_tir.Schedule(s)
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(sch.get_sblock("root"))}
    partials = [n for n in blocks if n.endswith("_rf")]
    assert partials
    for name in partials:
        loops = sch.get_loops(blocks[name])
        assert sch.get(loops[0]).kind == ForKind.PARALLEL
        assert sch.get(loops[-1]).kind == ForKind.VECTORIZED and int(sch.get(loops[-1]).extent) == LANES
        # the lanes are combined under the same parallel row loop, not in a serial pass of their own
        combine = blocks[name[:-3]] if name[:-3] in blocks else None
        assert combine is None or sch.get_sref(sch.get_loops(combine)[0]).same_as(sch.get_sref(loops[0]))


@pytest.mark.parametrize("hw", [(160, 160), (7, 7)])
def test_mean_over_height_and_width_is_one_vectorized_row(hw):
    # An SE block's ReduceMean over H and W of a float NCHW map, fused with the quantize of the INT8 conv
    # after it: rfactor takes one loop, so the two reduction loops are fused first. It used to fail to
    # schedule and ran scalar on one core (1.35 ms for 64 x 160 x 160 in an INT8 PP-OCR detector).
    a = te.placeholder((1, 128, *hw), name="a")
    total = topi.sum(a, axis=[2, 3], keepdims=True)
    mean = te.compute(total.shape, lambda *i: total(*i) / float(hw[0] * hw[1]), name="mean")
    codes = te.compute(mean.shape, lambda *i: (mean(*i) * 50.0 + 128.0).astype("int32").astype("uint8"),
                       name="quantize")
    func = te.create_prim_func([a, codes])
    x = np.random.default_rng(0).standard_normal((1, 128, *hw)).astype("float32")
    s = generic.apply(func, LANES)
    assert s is not None
    want = np.clip(x.astype(np.float64).mean(axis=(2, 3), keepdims=True) * 50 + 128, 0, 255)
    got = run_in_place(s, [x, np.zeros((1, 128, 1, 1), "uint8")])
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1  # truncation at the float's edge
    sch = tvm.s_tir.Schedule(s)
    partial = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.endswith("_rf")]
    assert len(partial) == 1
    loops = sch.get_loops(partial[0])
    assert sch.get(loops[0]).kind == ForKind.PARALLEL and sch.get(loops[-1]).kind == ForKind.VECTORIZED
    assert int(sch.get(loops[-1]).extent) == (LANES if hw[0] * hw[1] % LANES == 0 else 7)


def test_row_no_vector_divides_takes_its_largest_divisor():
    # 18710 classes (PP-OCRv6's recognizer) or here 470: a 16-lane split would need a predicate, which
    # scalarizes the loop; 10 lanes divide both. The normalization reads each row in the same 10-lane vectors
    # instead of 16-lane vectors across rows (a gather per lane).
    a = te.placeholder((8, 470), name="a")
    func = te.create_prim_func([a, topi.nn.fast_softmax(a, axis=-1)])
    x = np.random.default_rng(0).standard_normal((8, 470)).astype("float32")
    s = generic.apply(func, 16)
    np.testing.assert_allclose(run_in_place(s, [x, np.zeros_like(x)]), run_in_place(func, [x, np.zeros_like(x)]), rtol=1e-5,
                               atol=1e-7)
    sch = tvm.s_tir.Schedule(s)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        name, loops = sch.get(block).name_hint, sch.get_loops(block)
        if name.endswith("_rf") or name == "T_softmax_norm":
            assert sch.get(loops[-1]).kind == ForKind.VECTORIZED and int(sch.get(loops[-1]).extent) == 10, name


def test_short_or_odd_rows_are_not_split():
    a = te.placeholder((64, 8), name="a")  # a row of one vector: nothing to split
    s = _same_as_unscheduled(te.create_prim_func([a, topi.sum(a, axis=-1)]))
    sch = tvm.s_tir.Schedule(s)
    assert not [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.endswith("_rf")]
    odd = te.placeholder((64, 97), name="odd")  # no vector divides the row
    s = _same_as_unscheduled(te.create_prim_func([odd, topi.max(odd, axis=-1)]))
    assert ForKind.VECTORIZED not in _loop_kinds(s)


def test_small_whole_tensor_reduction_stays_serial():
    a = te.placeholder((4, 100), name="a")
    assert generic.apply(te.create_prim_func([a, topi.max(a)]), LANES) is not None  # inlined, not split
    sch = tvm.s_tir.Schedule(generic.apply(te.create_prim_func([a, topi.max(a)]), LANES))
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) == 1


def test_small_or_odd_kernels_stay_serial_or_scalar():
    small = te.placeholder((2, 8), name="small")
    kinds = _loop_kinds(_same_as_unscheduled(te.create_prim_func([small, topi.exp(small)])))
    assert ForKind.PARALLEL not in kinds and ForKind.VECTORIZED in kinds  # 16 elements: no threads
    odd = te.placeholder((3, 101, 97), name="odd")  # no vector width divides a row (97) or the tensor (29391)
    script = _same_as_unscheduled(te.create_prim_func([odd, topi.sigmoid(odd)])).script()
    # ... but each 101 x 97 plane is contiguous: its whole vectors, then a scalar tail of 9797 % LANES
    assert "T.parallel(3)" in script and f"range({9797 // LANES}):" in script and f"T.vectorized({LANES})" in script


def test_long_row_no_vector_divides_takes_whole_vectors_and_a_scalar_tail():
    """A padded dense output sliced back to its 389 columns (a prime): whole vectors over the first 384, the
    last 5 in a scalar loop, rows in parallel; before, 1-lane (389 is prime) or 5-lane (18385) vectors."""
    a = te.placeholder((40, 400), name="a")
    out = topi.reshape(topi.strided_slice(a, [0, 0], [40, 389]), (1, 40, 389))
    s = _same_as_unscheduled(te.create_prim_func([a, out]))
    script = s.script()  # the partitioned loops nest under blocks of their own: read the loops from the text
    assert re.findall(r"T\.vectorized\((\d+)\)", script) == [str(LANES)]
    assert script.count("T.parallel(") == 1 and "range(384, 389)" in script.replace("T.int64(", "(")
    short = te.placeholder((40, 100), name="short")  # under 8 vectors a row: left to the partial vectors
    kinds = _loop_kinds(_same_as_unscheduled(te.create_prim_func([short, topi.exp(short)])))
    assert kinds.count(ForKind.VECTORIZED) == 1


def _model():
    """Two conv branches -> Concat -> Mul by a Sigmoid gate -> Softmax over channels -> Transpose to NHWC: every
    op after the convs is outside a partition."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) / 8).astype("float32"), "W0"),
             numpy_helper.from_array((rng.standard_normal((16, 8, 1, 1)) / 3).astype("float32"), "W1")]
    nodes = [helper.make_node("Conv", ["x", "W0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["a0"]),
             helper.make_node("Conv", ["x", "W1"], ["c1"], kernel_shape=[1, 1]),
             helper.make_node("Concat", ["a0", "c1"], ["cat"], axis=1),
             helper.make_node("Sigmoid", ["cat"], ["gate"]),
             helper.make_node("Mul", ["cat", "gate"], ["m"]),
             helper.make_node("Softmax", ["m"], ["sm"], axis=1),
             helper.make_node("Transpose", ["sm"], ["y"], perm=[0, 2, 3, 1])]
    return make_model(nodes, [("x", [1, 8, 24, 24])], [("y", None)], inits)


@pytest.mark.parametrize("pad", [1, 0])
def test_padded_pool_is_left_as_tvm_lowers_it(pad):
    x = te.placeholder((1, 16, 32, 32), "float32", name="x")
    y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (pad,) * 4, "max", layout="NCHW")
    func = te.create_prim_func([x, y])
    if pad:
        assert generic.apply(func, LANES) is None  # unscheduled beats the generic schedule on a padded window
    else:
        assert ForKind.PARALLEL in _loop_kinds(_same_as_unscheduled(func))


def test_ops_outside_partitions_match_onnxruntime_and_run_parallel():
    model = _model()
    x = np.random.default_rng(1).standard_normal((1, 8, 24, 24)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    tvm_kernels = {gv.name_hint: f for gv, f in cm.lowered.functions_items()
                   if isinstance(f, tvm.tirx.PrimFunc) and not (f.attrs and "tvmfuse.family" in f.attrs)}
    assert tvm_kernels  # concat, the gate, softmax, transpose: fused by TVM into a few kernels
    for name, func in tvm_kernels.items():
        assert ForKind.PARALLEL in _loop_kinds(func), name


def test_default_kept_record_replays_the_generic_schedule():
    from tvm import s_tir

    from tvmfuse.tune.tuner import _default_trace, extract_tasks

    tasks = [t for t in extract_tasks(_model(), SPEC) if t.family is None]
    assert tasks
    for task in tasks:
        sch = s_tir.Schedule(task.mod)
        _default_trace(task, None, SPEC).apply_to_schedule(sch, remove_postproc=False)
        want = generic.apply(task.mod["main"], LANES)
        assert want is not None
        tvm.ir.assert_structural_equal(sch.mod["main"], want)


@pytest.mark.parametrize("shape,axis", [((1, 3, 7, 5), 2), ((2, 16, 4, 4), 1)])
def test_concat_of_odd_shapes(shape, axis):
    a, b = te.placeholder(shape, name="a"), te.placeholder(shape, name="b")
    _same_as_unscheduled(te.create_prim_func([a, b, topi.concatenate([a, b], axis)]), seed=3)


def _quantize_dequantize(x, scale: float):
    """A simulated QDQ step as TVM lowers it: 9 expression nodes per step."""
    codes = topi.cast(topi.clip(topi.round(topi.divide(x, scale)) + 3.0, 0.0, 255.0), "uint8")
    return topi.multiply(topi.subtract(topi.cast(codes, "float32"), 3.0), scale)


def _stages(func) -> int:
    sch = tvm.s_tir.Schedule(func)
    return len(sch.get_child_blocks(sch.get_sblock("root")))


def test_costly_concat_parts_are_stored_cheap_ones_inlined():
    """Parts of a concatenate that take many expression nodes (a QDQ-simulated chain) are stored each over its
    own extent; inlined, every output element would compute every part (``if_then_else`` in vectors). A
    part that is a copy or one multiply stays inlined."""
    parts = [te.placeholder((1, 16, 16, 16), name=f"p{i}") for i in range(4)]
    heavy = []
    for i, p in enumerate(parts):
        x = p
        for step in range(4):  # no add after a multiply: an FMA would round differently scheduled or not
            x = _quantize_dequantize(x, 0.05 * (i + 1) + 0.01 * step)
        heavy.append(x)
    s = _same_as_unscheduled(te.create_prim_func(parts + [topi.concatenate(heavy, axis=1)]))
    assert _stages(s) == 5  # the four parts, then the concatenate
    assert sum(k == ForKind.PARALLEL for k in _loop_kinds(s)) >= 4
    cheap = [parts[0], topi.multiply(parts[1], 2.0)]
    s = _same_as_unscheduled(te.create_prim_func(parts[:2] + [topi.concatenate(cheap, axis=1)]))
    assert _stages(s) == 1


def _shuffle(c=58, hw=14):
    """ShuffleNet's channel shuffle of two halves: concat, reshape to 2 groups, transpose, reshape back."""
    a, b = te.placeholder((1, c, hw, hw), name="a"), te.placeholder((1, c, hw, hw), name="b")
    cat = topi.concatenate([a, b], axis=1)
    out = topi.reshape(topi.transpose(topi.reshape(cat, (1, 2, c, hw, hw)), (0, 2, 1, 3, 4)), (1, 2 * c, hw, hw))
    return te.create_prim_func([a, b, out]), (a, b)


def test_a_channel_shuffle_runs_in_plane_vectors():
    """14 x 14 planes: rows of 14 take no whole vector, but each output plane copies one input plane, so the
    plane's 196 values run in whole vectors (12 of 16 lanes on AVX-512) and a scalar tail of 4."""
    func, _ = _shuffle()
    scheduled = generic.apply(func, LANES)
    script = scheduled.script()
    assert f"T.vectorized({LANES})" in script and f"range({196 // LANES})" in script, script
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((1, 58, 14, 14)).astype("float32") for _ in range(2))
    want = np.concatenate([a, b], 1).reshape(1, 2, 58, 14, 14).transpose(0, 2, 1, 3, 4).reshape(1, 116, 14, 14)
    np.testing.assert_array_equal(run_in_place(scheduled, [a, b, np.zeros_like(want)]), want)


def test_per_channel_operands_join_the_plane_but_a_spatial_transpose_does_not():
    x, bias = te.placeholder((1, 32, 14, 14), name="x"), te.placeholder((1, 32, 1, 1), name="bias")
    added = te.create_prim_func([x, bias, topi.add(x, bias)])
    flipped = te.create_prim_func([x, topi.transpose(x, (0, 1, 3, 2))])
    for func, planes in ((added, True), (flipped, False)):
        sch = tvm.s_tir.Schedule(func)
        block = sch.get_child_blocks(sch.get_sblock("root"))[-1]
        assert generic._plane_runs(sch, block) is planes
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((1, 32, 14, 14)).astype("float32")
    bs = rng.standard_normal((1, 32, 1, 1)).astype("float32")
    np.testing.assert_array_equal(run_in_place(generic.apply(added, LANES), [xs, bs, np.zeros_like(xs)]), xs + bs)
    flipped_out = run_in_place(generic.apply(flipped, LANES), [xs, np.zeros_like(xs)])
    np.testing.assert_array_equal(flipped_out, xs.transpose(0, 1, 3, 2))


def test_a_single_plane_or_a_blocked_tensor_keeps_its_rows(monkeypatch):
    """[1, 80, 2100] fused whole would leave nothing to run in parallel (YOLOv8's head: 56 -> 220 us); a
    blocked tensor's last axis is its channel block, already whole vectors (an NCHW8c concat ran slower).
    Both schedule as they did before plane vectors; a 14 x 14 map does not."""
    shapes = {(1, 80, 2100): True, (1, 3, 32, 32, 8): True, (1, 8, 14, 14): False}
    for shape, same in shapes.items():
        x = te.placeholder(shape, name="x")
        func = te.create_prim_func([x, topi.sigmoid(x)])
        with monkeypatch.context() as m:
            m.setattr(generic, "PLANES", False)
            rows = generic.apply(func, LANES).script()
        assert (generic.apply(func, LANES).script() == rows) is same, shape


def _tap_loops(func) -> list[int]:
    """Extents of the serial loops right above the vectorized one (the column split's tap loop)."""
    lines = [line.strip() for line in func.script().splitlines() if line.strip().startswith("for ")]
    return [int(m) for line in lines for m in re.findall(r"T\.grid\((?:T\.int64\()?(\d+)", line)]


@pytest.mark.parametrize("case", ["depth_to_space", "upsample"])
def test_columns_read_as_x_div_k_split_into_taps(case):
    """A stage whose reads take its last axis only as ``x // k`` and ``x % k`` (depth-to-space, nearest
    upsampling) runs each tap ``t`` of ``x = k * xs + t`` over whole vectors of ``xs``: a tap loop of ``k``
    above the vector loop, instead of lanes that each divide their own index."""
    x = te.placeholder((1, 32, 8, 16), name="x")
    if case == "depth_to_space":
        out = topi.nn.relu(topi.nn.depth_to_space(x, 2, mode="CRD"))
    else:
        out = te.compute((1, 32, 16, 32), lambda n, c, h, w: x[n, c, h // 2, w // 2], name="upsample")
    s = _same_as_unscheduled(te.create_prim_func([x, out]))
    assert _tap_loops(s)[:1] == [2] and ForKind.VECTORIZED in _loop_kinds(s)


def test_a_column_read_whole_keeps_the_row_vectors():
    """An upsampled map added to a full-resolution one reads ``x`` itself too: no tap split."""
    small, big = te.placeholder((1, 16, 8, 16), name="small"), te.placeholder((1, 16, 16, 32), name="big")
    out = te.compute((1, 16, 16, 32), lambda n, c, h, w: small[n, c, h // 2, w // 2] + big[n, c, h, w], name="add")
    s = _same_as_unscheduled(te.create_prim_func([small, big, out]))
    assert 2 not in _tap_loops(s)
