"""Softmax and LayerNorm as row families of the registry (``families.ROW_FAMILIES``): legalized by their
computes with a mark on the output stage, known by that mark after TVM's fusion drops the function's
attributes, scheduled by their x86 rules, and tuned through their MetaSchedule templates (the row step)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import s_tir, te
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules import families
from tvmfuse.schedules.backend import kernel_of
from tvmfuse.schedules.computes.softmax import softmax
from tvmfuse.schedules.computes.layer_norm import layer_norm
from tvmfuse.schedules.x86 import layer_norm as ln_rule
from tvmfuse.schedules.x86 import rows, templates
from tvmfuse.schedules.x86 import softmax as softmax_rule
from tvmfuse.tune.tuner import extract_tasks

from helpers import HOST, make_model, ort_run

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32
WIDTH = 8 * LANES  # steps of 1, 2 and 4 vectors all divide the row


def _model(width=WIDTH, rows_=24):
    """x * 0.5 -> Softmax -> * 0.5 -> LayerNormalization: TVM fuses the scale after the softmax into its kernel."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["a"]), helper.make_node("Softmax", ["a"], ["y"], axis=-1),
             helper.make_node("Mul", ["y", "s"], ["y2"]),
             helper.make_node("LayerNormalization", ["y2", "g", "b"], ["z"], axis=-1, epsilon=1e-5)]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             numpy_helper.from_array(np.linspace(0.5, 1.5, width).astype(np.float32), "g"),
             numpy_helper.from_array(np.linspace(-1, 1, width).astype(np.float32), "b")]
    return make_model(nodes, [("x", [rows_, width])], [("z", None)], initializers=inits)


def _kernels(width=WIDTH, step=None):
    x = te.placeholder((24, width), name="x")
    g, b = te.placeholder((width,), name="g"), te.placeholder((width,), name="b")
    return {"softmax": (te.create_prim_func([x, softmax(x, annotations=templates.marks("softmax"))]),
                        softmax_rule, [(24, width)] * 2),
            "layer_norm": (te.create_prim_func([x, g, b, layer_norm(x, g, b, 1e-5, templates.marks("layer_norm"))]),
                           ln_rule, [(24, width), (width,), (width,), (24, width)])}


def test_the_registry_lists_the_row_families_with_their_rules():
    assert set(families.ROW_FAMILIES) == {"softmax", "layer_norm"}
    assert set(families.ROW_KERNELS) == {"softmax", "layer_norm", "layer_norm_channels"}
    for row in families.ROW_FAMILIES.values():
        assert callable(families.resolve(row.legalize)) and row.op.startswith("relax.")
        for kernel in row.kernels:
            assert families.KERNELS[kernel.name] is kernel and kernel.rules["x86"] == kernel.name
            assert kernel.name in templates.RULES


def test_fused_row_kernels_are_known_by_their_mark_and_get_their_rules():
    model = _model()
    x = {"x": (np.random.default_rng(0).standard_normal((24, WIDTH)) * 8).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)
    found = {}
    for gv, func in cm.lowered.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and kernel_of(func) in families.ROW_KERNELS:
            found[kernel_of(func)] = func
    assert set(found) == {"softmax", "layer_norm"}
    assert "tvmfuse.family" not in found["softmax"].attrs  # fusion dropped it: the mark tells
    for func in found.values():
        text = func.script()
        assert "T.vectorized(" in text and "schedule_rule" not in text  # the rule ran; the template mark is gone


def test_a_kernel_without_the_mark_is_tvms():
    x = te.placeholder((24, WIDTH), name="x")
    assert kernel_of(te.create_prim_func([x, te.compute(x.shape, lambda i, j: x[i, j] * 2)])) is None


def test_tuning_tasks_carry_the_row_families_and_their_spaces():
    tasks = {t.family: t for t in extract_tasks(_model(), SPEC)}
    assert {"softmax", "layer_norm"} <= set(tasks)
    for name in ("softmax", "layer_norm"):
        assert SPEC.backend().space_size(tasks[name].mod) == 3  # 1, 2 or 4 vectors per step


@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_template_default_is_the_rule_and_its_trace_serializes(name):
    func, rule, _ = _kernels()[name]
    sch = s_tir.Schedule(func)
    (out,) = templates.template(name, LANES)(sch, sch.get_sblock(rule.ANCHOR))
    assert [i.kind.name for i in out.trace.insts].count("SampleCategorical") == 1
    assert "FloorDiv" not in str(out.trace.as_python())
    expected = s_tir.Schedule(func)
    sch_block = expected.get_sblock(rule.ANCHOR)
    expected.unannotate(sch_block, "schedule_rule")
    assert rule.schedule(expected, LANES)
    tvm.ir.assert_structural_equal(out.mod["main"], expected.mod["main"])


def _run(func, shapes):
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    rng = np.random.default_rng(3)
    args = [(rng.standard_normal(s) * 4).astype("float32") for s in shapes]
    out = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*out)
    return args, out[-1].numpy()


@pytest.mark.parametrize("vectors", [2, 4])
@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_every_step_the_template_samples_is_correct(name, vectors):
    func, rule, shapes = _kernels()[name]
    sch = s_tir.Schedule(func)
    assert rule.schedule(sch, LANES, rows.Config(vectors * LANES))
    norm = sch.get_loops(sch.get_sblock(rule.ANCHOR))
    assert sch.get(norm[-1]).kind == ForKind.VECTORIZED and int(sch.get(norm[-1]).extent) == vectors * LANES
    args, got = _run(sch.mod["main"], shapes)
    x = args[0].astype("float64")
    if name == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    else:
        want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * args[1] + args[2]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_steps_are_whole_vectors_dividing_the_row():
    assert rows.steps(96, 16) == [16, 32]
    assert rows.steps(18720, 16) == [16, 32]
    assert rows.steps(128, 16) == [16, 32, 64]
    assert rows.steps(470, 16) == [10]  # no 16-lane vector divides 470: its largest divisor up to 16 (20 does not)
    assert rows.steps(97, 16) == [] and rows.steps(16, 16) == []  # prime; one vector: the row stays scalar


def test_a_tuning_run_covers_the_row_space_and_compile_applies_it(tmp_path):
    from tvmfuse.passes.kernel_names import kind
    from tvmfuse.tune.tuner import tune

    model = _model(width=1024, rows_=64)
    report = tune(model, HOST, trials=8, logs=tmp_path, progress=False)
    rows_tuned = {t.name: t for t in report.tasks if kind(t.name) in ("layer_norm", "fused_softmax_multiply")}
    assert len(rows_tuned) == 2
    for task in rows_tuned.values():
        assert task.status in ("tuned", "default kept") and task.trials == 3, task  # the whole space: 3 steps
    cm = tvmfuse.compile(model, target=HOST, logs=tmp_path)
    assert set(rows_tuned) <= set(cm.tuning_logs["applied"])
    x = {"x": (np.random.default_rng(4).standard_normal((64, 1024)) * 8).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-4, atol=1e-4)


def _channel_kernel(shape):
    from tvmfuse.schedules.computes.layer_norm import layer_norm_channels

    x = te.placeholder(shape, name="x")
    g, b = te.placeholder((shape[1],), name="g"), te.placeholder((shape[1],), name="b")
    return te.create_prim_func([x, g, b, layer_norm_channels(x, g, b, 1e-6, templates.marks("layer_norm_channels"))])


@pytest.mark.parametrize("shape,kind,space", [((1, 32, 16, 16), "rows", 3), ((1, 16, 4, 128), "part", 3),
                                              ((1, 64, 4, 4), "rows", 1)])
def test_channel_norm_template_samples_runs_of_the_defaults_kind(shape, kind, space):
    """Whole rows (16 x 16: 1, 2 or 4 rows of 16 lanes) or parts of a row (128 wide: 1, 2, 4 vectors); the
    first decision is the rule's default, and every sample is correct."""
    from tvmfuse.schedules.x86 import layer_norm_channels as rule

    if LANES != 16:
        pytest.skip(f"the runs below are for 16-lane vectors; {HOST} has {LANES}")
    func = _channel_kernel(shape)
    sch = s_tir.Schedule(func)
    (out,) = templates.template("layer_norm_channels", LANES)(sch, sch.get_sblock(rule.ANCHOR))
    assert [i.kind.name for i in out.trace.insts].count("SampleCategorical") == (space > 1)
    assert rule.default_config(*shape[2:], LANES).rows == (kind == "rows")
    expected = s_tir.Schedule(func)
    expected.unannotate(expected.get_sblock(rule.ANCHOR), "schedule_rule")
    assert rule.schedule(expected, LANES)
    tvm.ir.assert_structural_equal(out.mod["main"], expected.mod["main"])
    assert templates.space_size(tvm.IRModule({"main": func}), SPEC.vector_bits()) == space
    for factor in rule.runs(*shape[2:], LANES)[kind]:
        sch = s_tir.Schedule(func)
        assert rule.schedule(sch, LANES, rule.Config(kind == "rows", factor))
        args, got = _run(sch.mod["main"], [shape, shape[1:2], shape[1:2], shape])
        x = args[0].astype("float64")
        want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-6)
        want = want * args[1][:, None, None] + args[2][:, None, None]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_channel_runs_are_power_of_two_vectors():
    from tvmfuse.schedules.x86 import layer_norm_channels as rule

    assert rule.runs(32, 32, 16) == {"part": [16, 32], "rows": [1, 2]}
    assert rule.runs(56, 56, 16) == {"part": [8], "rows": []}  # a 56-lane vector is built lane by lane
    assert rule.runs(7, 7, 16) == {"part": [], "rows": []} and rule.default_config(7, 7, 16) is None
    assert rule.default_config(8, 8, 16) == rule.Config(True, 8)  # the whole 8 x 8 map: one task of 4 vectors
