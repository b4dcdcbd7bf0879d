"""A conv whose output channels have no block (12, 42, 4, ... : ``blocked.block_for`` gives None) reads its
already-blocked input in place and writes NCHW: ``compute.plain_output_block`` (the rule), ``blocked.plain_crop``
(the compute), ``conv2d_nchwc.schedule_plain`` (the x86 schedule) and its MetaSchedule template. Checked
against onnxruntime, by the layout transforms it removes, and by the shape of its schedule."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax, s_tir
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import targets
from tvmfuse.passes.lower import make_kernel
from tvmfuse.schedules import x86
from tvmfuse.schedules.computes import blocked
from tvmfuse.schedules.computes.partition import plain_output_block
from tvmfuse.schedules.x86 import conv2d_nchwc, templates

from helpers import HOST, make_model, ort_run
from helpers.layout import transforms
from helpers.schedules import Structure, _partition_fn

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32


def _head(mid, out, hw, k=1, stride=1, pads=None, act="Relu", residual=False, width=None, seed=0):
    """x[1, 3, hw, width] -> Conv 3x3 to ``mid`` channels (blocked) -> Relu -> Conv k x k to ``out`` channels with
    a bias [-> Add(r)] [-> act]: the second conv is a network's head."""
    rng = np.random.default_rng(seed)
    w0 = (rng.standard_normal((mid, 3, 3, 3)) / 5).astype("float32")
    w1 = (rng.standard_normal((out, mid, k, k)) / np.sqrt(mid * k * k)).astype("float32")
    b1 = rng.standard_normal(out).astype("float32")
    pads = pads or [k // 2] * 4
    width = width or hw
    nodes = [helper.make_node("Conv", ["x", "W0"], ["a"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "W1", "B1"], ["c"], kernel_shape=[k, k], strides=[stride] * 2, pads=pads)]
    inputs, last = [("x", [1, 3, hw, width])], "c"
    if residual:
        out_hw = [(size + pads[i] + pads[i + 2] - k) // stride + 1 for i, size in enumerate((hw, width))]
        nodes.append(helper.make_node("Add", ["c", "res"], ["s"]))
        inputs.append(("res", [1, out, *out_hw]))
        last = "s"
    nodes.append(helper.make_node(act or "Identity", [last], ["y"]))
    model = make_model(nodes, inputs, [("y", None)], [numpy_helper.from_array(w0, "W0"),
                                                       numpy_helper.from_array(w1, "W1"),
                                                       numpy_helper.from_array(b1, "B1")])
    return model, {name: rng.standard_normal(shape).astype("float32") for name, shape in inputs}


def _conv(cin, cout, k=1):
    """A Relax conv2d call with its types inferred (what the rule reads)."""
    x = relax.Var("x", relax.TensorType([1, cin, 16, 16], "float32"))
    w = relax.Var("w", relax.TensorType([cout, cin, k, k], "float32"))
    return relax.BlockBuilder().normalize(relax.op.nn.conv2d(x, w))


@pytest.mark.parametrize("cin,cout,k,lanes,block", [
    (128, 42, 1, 16, 16),  # 42 -> 48: three 16-channel blocks
    (48, 12, 1, 16, 16),  # 12 -> 16: one block (two of 8 pad as much; the wider wins)
    (96, 18, 1, 16, 8),  # 18 -> 24 in blocks of 8 (32 in blocks of 16)
    (16, 4, 1, 16, 8), (32, 1, 1, 16, 8),  # 7 zero channels of 1 x 1 taps: 7 <= 8
    (32, 14, 2, 16, 16),  # 2 padded channels x 4 taps = 8
    (128, 42, 1, 8, 8), (48, 12, 1, 8, 8),  # AVX2: blocks of 8
    (24, 12, 2, 16, None),  # 4 padded channels x 4 taps: the to_plain + NCHW kernel stays
    (480, 60, 3, 16, None),  # 4 x 9
    (24, 58, 1, 16, None),  # widens its channels: the NCHW kernel's pixel vectors
    (64, 48, 1, 16, None), (64, 24, 1, 16, None),  # channels with a block: the ordinary blocked kernel
])
def test_rule(cin, cout, k, lanes, block):
    assert plain_output_block(_conv(cin, cout, k), lanes) == block


def test_rule_needs_vectors():
    assert plain_output_block(_conv(128, 42), None) is None  # CUDA: no blocked layout


HEADS = [
    # mid, out, hw, k, stride, pads, width
    (32, 12, 20, 1, 1, None, None),
    (64, 42, 13, 1, 1, None, 19),  # 42 -> 48; a 13 x 19 map (odd row: a dividing tile width)
    (48, 18, 10, 1, 1, None, None),  # 18 -> 24 in blocks of 8 (AVX-512) or 8 (AVX2)
    (32, 4, 17, 1, 1, None, None),
    (16, 1, 9, 1, 1, None, None),  # one output channel
    (32, 14, 11, 2, 1, [0, 0, 1, 1], None),  # 2x2 with bottom/right padding
    (32, 12, 15, 1, 2, None, None),  # strided 1x1: reads the gathered input
]


@pytest.mark.parametrize("act,residual", [("Relu", False), (None, False), ("Sigmoid", True)])
@pytest.mark.parametrize("mid,out,hw,k,stride,pads,width", HEADS)
def test_head_matches_onnxruntime_with_no_transform(mid, out, hw, k, stride, pads, width, act, residual):
    model, feeds = _head(mid, out, hw, k, stride, pads, act, residual, width)
    # Both convs blocked (the stem writes NCHW[b]c, the head reads it), no to_plain anywhere.
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 0, "nchwc": 2}
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
    head = cm.opcheck(feeds)[-1]  # the kernel unpacked (padded weights cropped) against the partition
    assert head.max_abs_error <= 1e-4 * max(1.0, head.max_abs_reference)
    layouts = [str(f.attrs["tvmfuse.layout"]) for _, f in cm.lowered.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.layout" in f.attrs]
    block = plain_output_block(_conv(mid, out, k), LANES)
    assert any(text.startswith(f"NCHW (computed NCHW{block}c)") for text in layouts), layouts


def test_nchw_layout_keeps_every_kernel_nchw():
    model, feeds = _head(32, 12, 20)
    assert transforms(model, SPEC, layout="nchw") == {"to_blocked": 0, "to_plain": 0, "nchwc": 0}
    cm = tvmfuse.compile(model, target=HOST, logs=False, layout="nchw")
    np.testing.assert_allclose(cm.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_plain_input_keeps_the_nchw_kernel():
    # The conv reads the model's plain input directly: nothing to save, no padded channels.
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((12, 32, 1, 1)) / 6).astype("float32")
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"])], [("x", [1, 32, 8, 8])], [("y", None)],
                       [numpy_helper.from_array(w, "W")])
    assert transforms(model, SPEC) == {"to_blocked": 0, "to_plain": 0, "nchwc": 0}


def _head_alone(mid=64, out=42, hw=12):
    """x[1, mid, hw, hw] -> Relu -> Conv 1x1 (bias) -> Relu, its inputs and its head partition's function."""
    model, feeds = _head(mid, out, hw)
    model.graph.node.remove(model.graph.node[0])
    model.graph.node[0].input[0] = "x"
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = mid
    feeds = {"x": np.random.default_rng(3).standard_normal((1, mid, hw, hw)).astype("float32")}
    return model, feeds, _partition_fn(model)


def _plain_kernel(mid=64, out=42, hw=12):
    """The head conv's unscheduled kernel, as LowerPartitions makes it (input blocked), and its layout."""
    _, _, fn = _head_alone(mid, out, hw)
    kernel, layout = make_kernel(fn, SPEC, schedule=False, blocks={0: blocked.block_for(mid, LANES)})
    assert layout.plain_out and layout.out_block == plain_output_block(_conv(mid, out), LANES)
    return kernel.without_attr("global_symbol"), layout


def test_schedule_stores_rows_from_a_tile_sized_local_buffer():
    kernel, _ = _plain_kernel()
    s = Structure(conv2d_nchwc.apply(kernel, LANES))
    update = s.loops[f"{conv2d_nchwc.ANCHOR}_update"]
    assert update[-1].kind == ForKind.VECTORIZED and int(update[-1].extent) == LANES  # channel vectors
    store = s.loops[list(s.blocks)[-1]]
    cfg = conv2d_nchwc.default_config(48 // LANES, 12, LANES, dividing=True)
    # the store: ``ow_block`` pixels of one channel per vector, along the NCHW row
    assert store[-1].kind == ForKind.VECTORIZED and int(store[-1].extent) == cfg.ow_block
    assert store[0].kind == ForKind.PARALLEL
    local = [shape for scope, shape in s.compacted_alloc().values() if scope == "local"]
    assert [cfg.oc_vectors, 1, cfg.ow_block, LANES] in [[int(d) for d in shape][1:] for shape in local], local


def test_schedule_refuses_a_width_that_does_not_divide_the_row():
    kernel, _ = _plain_kernel(hw=12)
    assert conv2d_nchwc.apply(kernel, LANES, conv2d_nchwc.Config(1, 5)) is None
    assert conv2d_nchwc.apply(kernel, LANES, conv2d_nchwc.Config(1, 4)) is not None


def test_default_config_can_ask_for_dividing_widths():
    assert conv2d_nchwc.default_config(1, 160, 16) == conv2d_nchwc.Config(1, 23)  # a predicated tail
    assert conv2d_nchwc.default_config(1, 160, 16, dividing=True) == conv2d_nchwc.Config(1, 20)


def test_template_default_is_the_hand_schedule_and_samples_dividing_widths():
    kernel, _ = _plain_kernel(hw=12)  # marked for the template, as LowerPartitions leaves it
    sch = s_tir.Schedule(kernel)
    (out,) = templates.template("conv2d_nchwc", LANES)(sch, sch.get_sblock(conv2d_nchwc.ANCHOR))
    hand = x86._unmarked(kernel)
    assert conv2d_nchwc.schedule(hand, LANES)
    tvm.ir.assert_structural_equal(out.mod["main"], hand.mod["main"])
    widths = [inst for inst in out.trace.insts if inst.kind.name == "SampleCategorical"][1].attrs[0]
    # widths that divide the 12-pixel row and fit the accumulators: 12 of them on AVX-512, 8 on AVX2
    budget = conv2d_nchwc.accumulators(LANES)  # a 1x1 conv on blocked input: no plain window
    assert sorted(int(w) for w in widths) == [w for w in range(1, 13) if 12 % w == 0 and w <= budget]


@pytest.mark.parametrize("oc_vectors,row_block", [(1, 1), (3 if LANES == 16 else 2, 3), (1, 12)])
def test_tiles_and_row_blocks_keep_the_numbers(oc_vectors, row_block):
    model, feeds, fn = _head_alone(64, 42, 12)
    kernel, layout = _plain_kernel(64, 42, 12)
    blocks = 48 // LANES
    config = conv2d_nchwc.Config(oc_vectors if blocks % oc_vectors == 0 else 1, 4, 1, row_block)
    scheduled = conv2d_nchwc.apply(kernel, LANES, config)
    parallel = [loop for loops in Structure(scheduled).loops.values() for loop in loops
                if loop.kind == ForKind.PARALLEL and int(loop.extent) > 1]
    assert int(parallel[-1].extent) == blocks // config.oc_vectors * (12 // row_block)
    x = np.maximum(feeds["x"], 0).reshape(1, 64 // LANES, LANES, 12, 12).transpose(0, 1, 3, 4, 2)  # the Relu before
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    arrays = [np.ascontiguousarray(x), layout.pack(1, init["W1"]), init["B1"].reshape(1, 42, 1, 1)]
    out = tvm.runtime.tensor(np.zeros((1, 42, 12, 12), "float32"))
    lib = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    lib["main"](*[tvm.runtime.tensor(a) for a in arrays], out)
    np.testing.assert_allclose(out.numpy(), ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
