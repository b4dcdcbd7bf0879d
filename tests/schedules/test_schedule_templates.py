"""The x86 rules as MetaSchedule templates: annotation, knobs, and a tiny tuning run (a few trials)."""

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, topi
from tvm.topi.testing import conv2d_nchw_python

from tvmfuse import targets
from tvmfuse.schedules.computes.packing import pack_weight
from tvmfuse.schedules.computes.anchors import _conv2d_packed
from tvmfuse.schedules.x86 import templates
from tvmfuse.tune.measure import make_builder

HOST = targets.resolve("x86-host")


def _conv_kernel(c=16, hw=14, oc=32, k=3, oc_block=16):
    data = te.placeholder((1, c, hw, hw), name="p0")
    weight = te.placeholder((oc // oc_block, c, k, k, oc_block), name="p1")
    bias = te.placeholder((1, oc, 1, 1), name="p2")
    conv = _conv2d_packed(data, weight, [1, 1], [k // 2] * 4, [1, 1], "float32")
    out = topi.nn.relu(topi.add(conv, bias))
    return te.create_prim_func([data, weight, bias, out]).without_attr("global_symbol")


def test_annotate_marks_the_anchor_only_for_known_families():
    func = templates.annotate(_conv_kernel(), "conv2d")
    sch = s_tir.Schedule(func)
    assert sch.get(sch.get_sblock("conv2d_nchw")).annotations["schedule_rule"] == "tvmfuse.x86.conv2d"
    assert templates.annotate(_conv_kernel(), "group_conv2d") is None
    assert templates.annotate(_conv_kernel(), "dense") is None  # no T_matmul_NN block in a conv kernel


def test_the_mark_is_what_a_schedule_writes():
    """``annotate`` rebuilds the kernel with the mark instead of building a Schedule: the same kernel, so the same
    workload hash in tuning logs; a block of that name below another block is not the root's child."""
    from tvmfuse.schedules.common import annotate_child
    from tvmfuse.tune.records import kernel_hash

    sch = s_tir.Schedule(_conv_kernel())
    sch.annotate(sch.get_sblock("conv2d_nchw"), "schedule_rule", "tvmfuse.x86.conv2d")
    ours = templates.annotate(_conv_kernel(), "conv2d")
    tvm.ir.assert_structural_equal(ours, sch.mod["main"])
    assert kernel_hash(ours) == kernel_hash(sch.mod["main"])
    assert annotate_child(_conv_kernel(), "no_such_block", "k", "v") is None


def test_register_is_explicit_and_names_cpu_rules():
    names = templates.register(HOST.vector_bits())
    families = ("conv2d", "depthwise_conv2d", "dense", "batch_matmul", "conv2d_nchwc", "conv2d_winograd", "depthwise_conv2d_nchwc",
                "group_conv2d_nchwc", "softmax", "layer_norm", "layer_norm_channels")
    assert sorted(names) == sorted(f"s_tir.meta_schedule.cpu.tvmfuse.x86.{f}" for f in families)
    assert all(tvm.get_global_func(n, allow_missing=True) is not None for n in names)


def test_template_default_decisions_equal_the_hand_schedule():
    # The first decision of every knob is the analytical default: same kernel as the default path.
    from tvmfuse.schedules.x86 import conv2d

    func = _conv_kernel()
    sch = s_tir.Schedule(templates.annotate(func, "conv2d"))
    (out,) = templates.template("conv2d", 8)(sch, sch.get_sblock("conv2d_nchw"))
    insts = [i.kind.name for i in out.trace.insts]
    assert insts.count("SampleCategorical") == 2  # ow_block, ic_unroll
    tvm.ir.assert_structural_equal(out.mod["main"], conv2d.apply(func, 8))


@pytest.mark.parametrize("m,k,n,panel", [(1, 64, 96, 32), (40, 24, 64, 32)])
def test_dense_template_keeps_the_packed_panel_and_its_trace_serializes(m, k, n, panel):
    # The columns are the weight's packed panel; rows and K unrolling are the knobs. A column knob once
    # reached the trace as FloorDiv(n_block, n_block), which MetaSchedule cannot write to its log: every
    # dense tuning task failed.
    from tvmfuse.schedules.computes.anchors import dense as dense_compute
    from tvmfuse.schedules.x86 import dense

    data = te.placeholder((m, k), name="p0")
    weight = te.placeholder((n // panel, k, panel), name="p1")
    func = te.create_prim_func([data, weight, dense_compute(None, data, weight)]).without_attr("global_symbol")
    sch = s_tir.Schedule(templates.annotate(func, "dense"))
    (out,) = templates.template("dense", 16)(sch, sch.get_sblock(dense.ANCHOR))
    assert [i.kind.name for i in out.trace.insts].count("SampleCategorical") == 2  # rows, K unrolling
    assert "FloorDiv" not in str(out.trace.as_python())
    tvm.ir.assert_structural_equal(out.mod["main"], dense.apply(func, 16))


@pytest.mark.parametrize("transposed", [True, False])
def test_batch_matmul_template_default_is_the_rule_and_its_trace_serializes(transposed):
    # Rows and K unrolling are the knobs; the first decisions give the rule's kernel (K^T packed or not).
    from tvm import topi

    from tvmfuse.schedules.computes import batch_matmul as compute
    from tvmfuse.schedules.x86 import batch_matmul as rule

    call = type("Call", (), {"ty": type("Ty", (), {"shape": (1, 8, 40, 40)})()})()
    q, k = te.placeholder((1, 8, 40, 15), name="p0"), te.placeholder((1, 8, 40, 15), name="p1")
    b = topi.transpose(k, [0, 1, 3, 2]) if transposed else te.placeholder((1, 8, 15, 40), name="p1")
    func = te.create_prim_func([q, k if transposed else b, compute.batch_matmul(call, q, b, 16)])
    sch = s_tir.Schedule(templates.annotate(func, "batch_matmul"))
    (out,) = templates.template("batch_matmul", 16)(sch, sch.get_sblock(compute.ANCHOR))
    assert [i.kind.name for i in out.trace.insts].count("SampleCategorical") == 2
    assert "FloorDiv" not in str(out.trace.as_python())
    expected = s_tir.Schedule(func)
    assert rule.schedule(expected, 16)
    tvm.ir.assert_structural_equal(out.mod["main"], expected.mod["main"])
    assert templates.space_size(tvm.IRModule({"main": templates.annotate(func, "batch_matmul")}), 512) > 1


@pytest.mark.slow
def test_tiny_tuning_run_is_correct(tmp_path):
    from tvm.s_tir import meta_schedule as ms

    templates.register(HOST.vector_bits())
    func = templates.annotate(_conv_kernel(), "conv2d")
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    target = HOST.tvm_target()
    db = ms.tune_tir(mod, target, work_dir=str(tmp_path), max_trials_global=4, num_trials_per_iter=2,
                     space=templates.space_generator(),
                     builder=make_builder(300))
    records = db.get_all_tuning_records()
    assert records and all(r.run_secs for r in records)
    sch = ms.tir_integration.compile_tir(db, mod, target)
    assert "SampleCategorical" in [i.kind.name for i in sch.trace.insts]
    # Tuned kernels are checked against a reference before anyone trusts them.
    lib = tvm.compile(sch.mod, target=target)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 14, 14)).astype("float32")
    w = rng.standard_normal((32, 16, 3, 3)).astype("float32")
    b = rng.standard_normal((1, 32, 1, 1)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((1, 32, 14, 14), "float32"))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(pack_weight(w, 16)), tvm.runtime.tensor(b), out)
    expected = np.maximum(conv2d_nchw_python(x, w, 1, 1) + b, 0)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


def _blocked_kernels():
    from tvmfuse.schedules.computes import blocked

    data = te.placeholder((1, 2, 14, 14, 8), name="p0")
    conv = blocked.conv2d(data, te.placeholder((4, 2, 3, 3, 8, 8), name="p1"), [1, 1], [1] * 4, [1, 1])
    dw = blocked.depthwise_conv2d(data, te.placeholder((2, 3, 3, 8), name="p2"), [2, 2], [1] * 4, [1, 1])
    return {"conv2d_nchwc": te.create_prim_func([data, conv.op.input_tensors[1], topi.nn.relu(conv)]),
            "depthwise_conv2d_nchwc": te.create_prim_func([data, dw.op.input_tensors[1], topi.nn.relu(dw)])}


@pytest.mark.parametrize("family,knobs,space", [("conv2d_nchwc", 4, 3 * 8 * 4 * 3), ("depthwise_conv2d_nchwc", 1, 2)])
def test_blocked_template_defaults_equal_the_hand_schedules(family, knobs, space):
    # conv: oc_vectors (1, 2, 4 of 4 blocks) x ow_block (1-8 within 8 accumulators; a tail is predicated) x
    # ic_unroll (1, 2, 4, 8) x row_block (1, 2, 14: the parallel axis); depthwise (7-wide output): ow_block 1 or 7.
    func = _blocked_kernels()[family].without_attr("global_symbol")
    module = templates.RULES[family]
    sch = s_tir.Schedule(templates.annotate(func, family))
    (out,) = templates.template(family, 8)(sch, sch.get_sblock(module.ANCHOR))
    assert [i.kind.name for i in out.trace.insts].count("SampleCategorical") == knobs
    tvm.ir.assert_structural_equal(out.mod["main"], module.apply(func, 8))
    assert templates.space_size(templates.annotate(func, family), 256) == space
