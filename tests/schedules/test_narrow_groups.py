"""Narrow-group convs (ResNeXt's 4 and 8 channels per group) on their true groups: the blocked compute, the
shuffle step the x86 rule tensorizes, its template, and which convs RegroupConv still merges."""

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te, topi
from tvm.topi.testing import conv2d_nchw_python

from tvmfuse import targets
from tvmfuse.passes.regroup_conv import RegroupConv
from tvmfuse.schedules.computes import blocked, packing
from tvmfuse.schedules.computes.partition import narrow_groups
from tvmfuse.schedules.x86 import conv2d_nchwc, templates
from tvmfuse.schedules.x86.intrin import group_shuffle

AVX512_TARGET = targets.resolve("x86-avx512").tvm_target()
AVX2_TARGET = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
RNG = np.random.default_rng(11)


def _kernel(channels, group, lanes, hw, stride):
    """Blocked narrow-group 3x3 conv (padding 1) + relu, as LowerPartitions makes it."""
    data = te.placeholder((1, channels // lanes, hw, hw, lanes), name="p0")
    weight = te.placeholder((channels // lanes, 1, 3, 3, group, lanes), name="p1")
    conv = blocked.conv2d(data, weight, (stride, stride), (1, 1, 1, 1), (1, 1), groups=channels // group)
    return te.create_prim_func([data, weight, topi.nn.relu(conv)]).with_attr("global_symbol", "main")


def _run(func, target, channels, group, lanes, hw, stride):
    x = RNG.standard_normal((1, channels, hw, hw)).astype("float32")
    w = RNG.standard_normal((channels, group, 3, 3)).astype("float32")
    want = np.maximum(conv2d_nchw_python(x, w, stride, 1, groups=channels // group), 0)
    packed = packing.pack_conv_weight(w, group, lanes)
    xb = x.reshape(1, channels // lanes, lanes, hw, hw).transpose(0, 1, 3, 4, 2).copy()
    out_hw = want.shape[2]
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
    args = [tvm.runtime.tensor(a) for a in (xb, packed, np.zeros((1, channels // lanes, out_hw, out_hw, lanes),
                                                                  "float32"))]
    lib(*args)
    got = args[2].numpy().transpose(0, 1, 4, 2, 3).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return lib


@pytest.mark.parametrize("channels,group,lanes,hw,stride", [
    (128, 4, 16, 12, 1),  # ResNeXt stage 1: groups of 4 in 16-lane blocks, a 6-pixel tile (12 = 2 x 6)
    (256, 8, 16, 11, 2),  # stage 2's first conv: groups of 8, stride 2; a 6-wide row, 3-pixel tiles
    (64, 4, 8, 10, 1),    # AVX2 blocks of 8, groups of 4
])
def test_narrow_group_kernel_matches_the_grouped_conv(channels, group, lanes, hw, stride):
    target = AVX512_TARGET if lanes == 16 else AVX2_TARGET
    if not targets.resolve("x86-avx512").backend().runs_on_this_cpu() and lanes == 16:
        pytest.skip("needs a CPU with AVX-512 to run 16-lane kernels")
    func = _kernel(channels, group, lanes, hw, stride)
    scheduled = conv2d_nchwc.apply(func, lanes)
    assert scheduled is not None
    # the gather is gone: one shuffle per input channel of the group, no scalar loads of the input
    assert scheduled.script().count("T.Shuffle") == group
    _run(scheduled, target, channels, group, lanes, hw, stride)


def test_narrow_tile_divides_the_row():
    # tensorize does not take the predicated tail of a width that does not divide the row
    for width in (7, 10, 12, 13, 16, 32):
        for group in (4, 8):
            cfg = conv2d_nchwc.narrow_config(width, group)
            assert width % cfg.ow_block == 0 and cfg.ow_block <= 32 // group
    assert conv2d_nchwc.narrow_config(32, 4).ow_block == 8


def test_group_shuffle_step_rejects_groups_it_cannot_run():
    assert group_shuffle.ensure(4, 16) == "tvmfuse_group_shuffle_4x16"
    for group, lanes in ((2, 16), (16, 16), (8, 8), (3, 16)):
        with pytest.raises(ValueError, match="group-shuffle step"):
            group_shuffle.ensure(group, lanes)


def test_narrow_template_default_is_the_rule_and_samples_dividing_tiles():
    func = _kernel(128, 4, 16, 12, 1).without_attr("global_symbol")
    family = "group_conv2d_nchwc"
    sch = s_tir.Schedule(templates.annotate(func, family))
    (out,) = templates.template(family, 16)(sch, sch.get_sblock(conv2d_nchwc.ANCHOR))
    tvm.ir.assert_structural_equal(out.mod["main"], conv2d_nchwc.apply(func, 16))
    # oc_vectors (1, 2, 4 of 8 blocks) x ow_block (divisors of 12) x row_block (1, 2, 3, 4, 12)
    assert templates.space_size(templates.annotate(func, family), 256) == 3 * 6 * 5


def _conv_module(channels, groups, in_channels=None) -> tvm.IRModule:
    """``main(x)``: one 3x3 grouped conv of a constant weight, normalized (its call has its type)."""
    x = relax.Var("x", relax.TensorType((1, in_channels or channels, 8, 8), "float32"))
    w = relax.const(RNG.standard_normal((channels, (in_channels or channels) // groups, 3, 3)).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.nn.conv2d(x, w, padding=(1, 1), groups=groups)))
    return bb.get()


def _convs(mod) -> list:
    return [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]


@pytest.mark.parametrize("channels,groups,in_channels,lanes,want", [
    (128, 32, None, 16, 4), (256, 32, None, 16, 8), (64, 8, None, 8, None),  # 8 per group fill an AVX2 block
    (64, 16, None, 8, 4), (64, 32, None, 16, None),  # groups of 2: no step
    (512, 32, None, 16, None), (128, 32, 256, 16, None), (128, 32, None, None, None)])
def test_narrow_groups_says_which_convs_run_on_their_groups(channels, groups, in_channels, lanes, want):
    (call,) = _convs(_conv_module(channels, groups, in_channels))
    assert narrow_groups(call, lanes) == want


@pytest.mark.parametrize("lanes,want_groups", [(16, 32), (None, 8)])
def test_regroup_conv_leaves_narrow_groups_where_the_target_runs_them(lanes, want_groups):
    convs = _convs(RegroupConv(lanes)(_conv_module(128, 32)))
    assert [int(c.attrs.groups) for c in convs] == [want_groups]


def test_a_tuned_narrow_kernel_applies_in_a_fresh_process(tmp_path):
    # The record's trace tensorizes with a step registered by the schedule; a compile in another process must
    # register it before decoding the record, or the record is skipped and the default schedule used.
    from pathlib import Path

    from helpers.tune import run_script

    tests = str(Path(__file__).resolve().parents[1])
    head = f"import sys, json\nsys.path.insert(0, {tests!r})\nsys.path.insert(0, {tests + '/passes'!r})\n" \
           "from test_grouped_conv import _grouped\nfrom tvmfuse import targets\nHOST = targets.resolve('x86-host')\n"
    tuned = run_script(head + """
from tvmfuse.tune.tuner import tune
report = tune(_grouped(128, 128, 32), HOST, trials=4, logs=sys.argv[1], trials_per_iter=4, progress=False)
print(json.dumps([t.trials for t in report.tasks]))
""", tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    (records,) = tmp_path.glob("*/database_tuning_record.json")  # the folder is named after the host's CPU
    assert "tvmfuse_group_shuffle_4x" in records.read_text()
    applied = run_script(head + """
import warnings
import numpy as np, tvmfuse
warnings.simplefilter("error")  # a skipped record warns
cm = tvmfuse.compile(_grouped(128, 128, 32), target=HOST, logs=sys.argv[1])
print(json.dumps(sorted(str(f.attrs["tvmfuse.scheduled_by"]) for _, f in cm.lowered.functions_items()
                        if f.attrs is not None and "tvmfuse.partition" in f.attrs)))
""", tmp_path)
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert applied.stdout.strip().splitlines()[-1] == '["tuning_log"]'


def test_records_name_the_steps_they_tensorize_with():
    from tvmfuse.tune.records import tensorized_with

    trace = [[["SampleCategorical", [], [[1, 2], [0.5, 0.5]], ["v0"]],
              ["Tensorize", ["l13"], ["tvmfuse_group_shuffle_4x16", 1], []]], []]
    assert tensorized_with([trace, [1e-5], {}, []]) == {"tvmfuse_group_shuffle_4x16"}
    for damaged in ([], [[]], [["Tensorize"]], "x", [[[["Tensorize", [], [7], []]]]]):
        assert tensorized_with(damaged) == set()
    # a name no step has (a damaged record's) is left for the decoder to skip, not an error at load
    assert group_shuffle.register_named({"tvmfuse_group_shuffle_3x16", "other", "tvmfuse_group_shuffle_8x16"}) \
        == ["tvmfuse_group_shuffle_8x16"]
