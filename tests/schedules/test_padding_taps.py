"""Skipping the reduction steps that read only padding (schedules/padding_taps.py): where the guard goes,
that the kernels give the same numbers with it as without (and as numpy), that it leaves other kernels
alone, and that compile and the tuner's builder both run it on x86."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import te, tirx, topi
from tvm.topi.testing import conv2d_nchw_python, dilate_python

import tvmfuse
from tvmfuse.schedules import padding_taps, x86
from tvmfuse.schedules.computes import blocked, packing
from tvmfuse.schedules.padding_taps import skip_padding_taps
from tvmfuse.schedules.x86 import conv2d_nchwc, depthwise_nchwc

from helpers import HOST, make_model, ort_run
from helpers.layout import to_blocked, to_plain
from helpers.schedules import _build, _host_lanes

LANES = _host_lanes()


def _ref_conv(x, w, stride, pads, dilation):
    """NCHW conv in float64 (topi's reference on the dilated weight): ``pads`` (top, left, bottom, right)."""
    w = dilate_python(w.astype("float64"), (1, 1, dilation, dilation))
    return conv2d_nchw_python(x.astype("float64"), w, stride, pads)


def _conv_kernel(c_in, c_out, hw, k, stride, pads, dilation, blocked_in=True):
    """The NCHW[b]c conv2d kernel + ReLU, scheduled by the x86 rule; (func, x, w, packed w)."""
    rng = np.random.default_rng(c_in * 100 + dilation)
    x = rng.standard_normal((1, c_in, hw, hw)).astype("float32")
    w = (rng.standard_normal((c_out, c_in, k, k)) / np.sqrt(c_in * k * k)).astype("float32")
    bi = LANES if blocked_in else 1
    packed = packing.pack_conv_weight(w, bi, LANES)
    data = te.placeholder(to_blocked(x, LANES).shape if blocked_in else x.shape, name="data")
    weight = te.placeholder(packed.shape, name="weight")
    out = topi.nn.relu(blocked.conv2d(data, weight, (stride, stride), pads, (dilation, dilation)))
    func = conv2d_nchwc.apply(te.create_prim_func([data, weight, out]), LANES)
    assert func is not None
    return func, (to_blocked(x, LANES) if blocked_in else x), x, w, packed


def _run(func, *arrays):
    lib = _build(func)
    out = tvm.runtime.tensor(np.zeros([int(d) for d in func.params[-1].ty.shape], "float32"))
    lib.mod["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays], out)
    return out.numpy()


def _guards(func) -> list:
    found = []

    def visit(s):
        if isinstance(s, tirx.IfThenElse):
            found.append(s)
        for child in padding_taps._children(s):
            visit(child)

    visit(func.body)
    return found


CASES = {
    "aspp_dilation_18": (32, 32, 20, 3, 1, (18, 18, 18, 18), 18, True),
    "aspp_dilation_6": (32, 32, 20, 3, 1, (6, 6, 6, 6), 6, True),
    "3x3_pad_1": (16, 32, 7, 3, 1, (1, 1, 1, 1), 1, True),
    "asymmetric_stride_2": (16, 16, 11, 3, 2, (2, 0, 1, 3), 2, True),
    "7x7_stem_nchw": (3, 16, 16, 7, 2, (3, 3, 3, 3), 1, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_guarded_conv_gives_the_same_numbers(case, monkeypatch):
    c_in, c_out, hw, k, stride, pads, dilation, blocked_in = CASES[case]
    func, data, x, w, packed = _conv_kernel(c_in, c_out, hw, k, stride, pads, dilation, blocked_in)
    monkeypatch.setattr(padding_taps, "MIN_SKIPPED", 0.0)  # a guard on every case, however few steps it skips
    guarded = skip_padding_taps(func)
    assert _guards(guarded), "a padded conv gets a guard"
    assert not _guards(func)
    got, plain = _run(guarded, data, packed), _run(func, data, packed)
    # Only ``0 * w`` terms are dropped: the sums are the same, term for term.
    np.testing.assert_array_equal(got, plain)
    ref = np.maximum(_ref_conv(x, w, stride, pads, dilation), 0)
    np.testing.assert_allclose(to_plain(got), ref, rtol=1e-4, atol=1e-4)


def test_the_guard_wraps_the_innermost_tap_loop_and_names_the_padded_rows():
    func = _conv_kernel(*CASES["aspp_dilation_18"])[0]
    guard = _guards(skip_padding_taps(func))
    assert len(guard) == 1
    text = str(guard[0].condition)
    assert "ry" in text and "rx" in text, text  # rows and columns both tested
    # The body it guards is one reduction step: the input-channel loop and the register tile, no init.
    body = str(guard[0].then_case)
    assert "conv2d_NCHWc_update" in body and "_init" not in body


def _steps_through_guard(guarded) -> tuple[int, int]:
    """(steps the guard lets through, steps) over the loops around it, counted by binding every loop value."""
    guard = _guards(guarded)[0]
    loops = {}

    def visit(s, path):
        if isinstance(s, tirx.IfThenElse) and s.same_as(guard):
            loops["path"] = path
        for child in padding_taps._children(s):
            visit(child, path + [s] if isinstance(s, tirx.For) else path)

    visit(guarded.body, [])
    path = loops["path"]
    space = [range(int(lp.min), int(lp.min) + int(lp.extent)) for lp in path]
    taken = total = 0
    for values in itertools.product(*space):
        analyzer = tvm.sym.Analyzer()
        for lp, v in zip(path, values):
            analyzer.bind(lp.loop_var, tirx.IntImm("int32", v))
        total += 1
        taken += bool(int(analyzer.simplify(guard.condition)))
    return taken, total


def test_most_steps_of_a_large_dilation_are_skipped():
    """Count the steps the guard lets through on the 20x20 map with dilation 18. Of the 60 (output row,
    kernel row) pairs 24 read data (2 kernel rows for the 4 border rows, 1 for the 16 others), of the
    (column tile, kernel column) pairs at most 2 in 3: with 16 lanes 27 % of the steps run (192 of 720), with
    8 lanes 19 %, against 100 % without the guard."""
    taken, total = _steps_through_guard(skip_padding_taps(_conv_kernel(*CASES["aspp_dilation_18"])[0]))
    assert taken / total < 0.35, (taken, total)  # 16 % of the multiply-adds read data; tiles round it up


def test_the_counted_share_is_the_steps_the_guard_lets_through():
    """``_run_share`` counts what the guard's condition lets through: on the dilation-18 map, the share the
    test above counts through the guard itself (192 of 720 steps with 16 lanes; the column tiles, and so the
    share, follow the target's vector width)."""
    func = _conv_kernel(*CASES["aspp_dilation_18"])[0]
    captured = {}
    real = padding_taps._pays

    def spy(terms, loops):
        captured["share"] = padding_taps._run_share(terms, loops)
        return real(terms, loops)

    padding_taps._pays = spy
    try:
        guarded = skip_padding_taps(func)
    finally:
        padding_taps._pays = real
    taken, total = _steps_through_guard(guarded)
    assert captured["share"] == pytest.approx(taken / total)
    if LANES == 16:
        assert (taken, total) == (192, 720)


@pytest.mark.parametrize("case", ["aspp_dilation_6", "aspp_dilation_18"])
def test_the_dilated_convs_keep_their_guard(case):
    """The ASPP convs skip 20 % (dilation 6) and 73 % (dilation 18) of the tap loop's steps: guarded."""
    assert _guards(skip_padding_taps(_conv_kernel(*CASES[case])[0]))


@pytest.mark.parametrize("case", ["3x3_pad_1", "asymmetric_stride_2", "7x7_stem_nchw"])
def test_a_guard_that_skips_few_steps_is_left_out(case):
    """Below ``MIN_SKIPPED`` of the steps (a 3x3 conv with padding 1 skips only its border rows' outer taps:
    9.5 % on a 7x7 map) the kernel is left as the rule made it: a test around the taps can cost the register
    tile more than the skipped steps save."""
    func = _conv_kernel(*CASES[case])[0]
    assert skip_padding_taps(func).same_as(func)


def test_a_tile_one_pixel_past_the_map_gets_no_guard(monkeypatch):
    """73 columns in tiles of 4 (the last holds one real pixel): the guard would skip 1.4 % of the steps, and
    with it LLVM kept this kernel's register tile in memory (1.24 against 1.02 ms, Zen 4). No guard; with
    the threshold at 0 it would get one."""
    data = te.placeholder((1, 2, 73, 73, LANES), name="data")
    weight = te.placeholder((4, 2, 3, 3, LANES, LANES), name="weight")
    out = blocked.conv2d(data, weight, (1, 1), (1, 1, 1, 1), (1, 1))
    func = conv2d_nchwc.apply(te.create_prim_func([data, weight, out]), LANES, conv2d_nchwc.Config(4, 4))
    assert skip_padding_taps(func).same_as(func)
    monkeypatch.setattr(padding_taps, "MIN_SKIPPED", 0.0)
    assert _guards(skip_padding_taps(func))


def test_kernels_without_padding_or_with_another_pad_value_are_unchanged():
    data = te.placeholder((1, 2, 8, 8, LANES), name="data")
    weight = te.placeholder((2, 2, 1, 1, LANES, LANES), name="weight")
    func = conv2d_nchwc.apply(te.create_prim_func(
        [data, weight, blocked.conv2d(data, weight, (1, 1), (0, 0, 0, 0), (1, 1))]), LANES)
    assert skip_padding_taps(func).same_as(func)
    # A pad of ones is not zeros: steps on it add ``w``, nothing may be skipped.
    padded = topi.nn.pad(data, [0, 0, 1, 1, 0], [0, 0, 1, 1, 0], pad_value=1.0, name="pad_temp")
    ry, rx = te.reduce_axis((0, 3), "ry"), te.reduce_axis((0, 3), "rx")
    conv = te.compute((1, 2, 8, 8, LANES), lambda n, c, y, x, i: te.sum(padded[n, c, y + ry, x + rx, i], axis=[ry, rx]))
    func = te.create_prim_func([data, conv])
    assert skip_padding_taps(func).same_as(func)


def test_unrolled_taps_are_left_alone():
    """The depthwise kernel unrolls its taps (a branch per tap would cost what it saves): no guard, and the
    kernel is the one the rule made."""
    data = te.placeholder((1, 2, 10, 10, LANES), name="data")
    weight = te.placeholder((2, 3, 3, LANES), name="weight")
    out = blocked.depthwise_conv2d(data, weight, (1, 1), (4, 4, 4, 4), (4, 4))
    func = depthwise_nchwc.apply(te.create_prim_func([data, weight, out]), LANES)
    assert func is not None and "T.unroll" in func.script()
    assert skip_padding_taps(func).same_as(func)


def test_compile_and_the_tuners_builder_run_it(monkeypatch):
    names = [p.info.name for p in x86.Backend.kernel_passes()]
    assert names == ["tvmfuse.SkipPaddingTaps", "tvmfuse.VectorTableLookups", "tvmfuse.GrantTileState"]
    seen = []
    real = padding_taps.skip_padding_taps
    monkeypatch.setattr(padding_taps, "skip_padding_taps", lambda f: seen.append(f) or real(f))
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype("float32")
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[3, 3], pads=[5] * 4,
                                         dilations=[5, 5])],
                       [("x", [1, 16, 8, 8])], [("y", None)], [numpy_helper.from_array(w, "W")])
    x = rng.standard_normal((1, 16, 8, 8)).astype("float32")
    cm = tvmfuse.compile(model, target=HOST, logs=False)
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert seen, "compile ran the pass"
    seen.clear()
    from tvmfuse.tune import measure

    func = _conv_kernel(*CASES["3x3_pad_1"])[0]
    target = tvmfuse.targets.resolve(HOST).tvm_target()
    measure.build_candidate(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target, None)
    assert seen, "the builder ran the pass"
