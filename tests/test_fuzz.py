"""Differential fuzzing (tvmfuse.fuzz, bench/fuzz.py): the generator is deterministic, covers every op kind it
promises and makes valid models; the oracle catches what it must; a CI slice of graphs (chosen to cover every
op kind) matches onnxruntime in both layouts; INT8 kernel cases are bit-exact; the campaign saves a failing
seed and exits 1.

Not among conftest's HOST_CPU_MODULES: the INT8 kernel cases check the VNNI and the AVX2 steps on every CPU, and
the graphs' AVX2 layouts are the blocked-layout tests', so .ci/run's AVX2 pass does not run this module again."""

from __future__ import annotations

import collections
import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tvmfuse import api, targets
from tvmfuse.fuzz import campaign, check, graphs, int8, winograd

from helpers import HOST, make_model

ROOT = Path(__file__).resolve().parents[1]
COVERAGE_SEEDS = range(200)


def _covering_seeds(seeds, kinds) -> list[int]:
    """A few seeds whose graphs together hold every kind (greedy: most new kinds first)."""
    found = {s: set(graphs.features(graphs.random_cnn(s))) for s in seeds}
    chosen, missing = [], set(kinds)
    while missing:
        best = max(found, key=lambda s: (len(found[s] & missing), -s))
        assert found[best] & missing, f"no seed holds {sorted(missing)}"
        chosen.append(best)
        missing -= found[best]
    return sorted(chosen)


# ----------------------------------------------------------------------------------------------- generator


def test_same_seed_same_bytes():
    for seed in (0, 7, 123):
        assert graphs.random_cnn(seed).SerializeToString() == graphs.random_cnn(seed).SerializeToString()
    assert len({graphs.random_cnn(s).SerializeToString() for s in range(20)}) == 20


def test_every_kind_appears_over_200_seeds():
    total, nodes = collections.Counter(), []
    for seed in COVERAGE_SEEDS:
        model = graphs.random_cnn(seed)
        total.update(graphs.features(model))
        nodes.append(sum(n.op_type != "Identity" for n in model.graph.node))
    missing = [k for k in graphs.KINDS if total[k] == 0]
    assert not missing, f"never generated over {len(COVERAGE_SEEDS)} seeds: {missing}"
    assert set(total) <= set(graphs.KINDS)
    assert min(nodes) >= 2 and max(nodes) <= 20 and 5 <= np.median(nodes) <= 12  # small graphs: fast compiles


def _conv(name, x, c=4, out=None):
    w = numpy_helper.from_array(np.ones((c, c, 3, 3), np.float32), f"{name}_w")
    return helper.make_node("Conv", [x, w.name], [out or name], pads=[1] * 4), w


def test_features_tell_foldable_adds_from_the_others():
    """conv + x folds; conv -> relu -> + x and a conv output that is also a graph output do not."""
    c1, w1 = _conv("c1", "x")
    c2, w2 = _conv("c2", "a1")
    c3, w3 = _conv("c3", "r2")
    nodes = [c1, helper.make_node("Add", ["c1", "x"], ["a1"]),
             c2, helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("Add", ["r2", "a1"], ["a2"]),
             c3, helper.make_node("Add", ["a2", "c3"], ["y"])]
    model = make_model(nodes, [("x", [1, 4, 8, 8])], [("y", [1, 4, 8, 8]), ("c3", [1, 4, 8, 8])], [w1, w2, w3])
    found = graphs.features(model)
    assert (found["add_foldable"], found["add_unfoldable"], found["multi_output"], found["conv_k3"]) == (1, 2, 1, 3)


@pytest.mark.parametrize("seed", range(30))
def test_models_are_valid_and_run_in_onnxruntime(seed):
    model = graphs.random_cnn(seed)
    onnx.checker.check_model(model, full_check=True)
    outputs = check.ort_outputs(model, check.random_inputs(model))
    declared = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output]
    assert [list(o.shape) for o in outputs] == declared
    assert all(np.isfinite(o).all() and 0 < np.abs(o).max() < 100 for o in outputs)  # activations stay O(1)


# ----------------------------------------------------------------------------------------------- oracle


def test_compare_tolerance():
    want = np.array([0.0, 1.0, -2.0, 3.0], np.float32)
    assert check.compare("y", want + 2e-4, want).ok  # 1e-4 * max(1, 3) + 1e-4 * |want|
    assert not check.compare("y", want + np.array([0, 0, 0, 1e-3], np.float32), want).ok
    assert check.compare("y", want[:3], want).message.startswith("shape")
    assert check.compare("y", np.array([np.nan, 1, -2, 3], np.float32), want).message == "non-finite values"
    small = np.full(3, 1e-3, np.float32)  # a tiny output is judged on the scale of 1 (activations are O(1))
    assert check.compare("y", small + 5e-5, small).ok


def test_check_model_reports_mismatches_and_errors(monkeypatch):
    model = graphs.random_cnn(2)

    def off_by_a_bit(m, inputs):
        outs = check.ort_outputs(m, inputs)
        outs[0].flat[0] += 1e-2
        return outs

    (result,) = check.check_model(model, ["nchw"], HOST, reference=off_by_a_bit)
    assert result.status == "mismatch" and not result.ok and result.outputs[0].worst > 1
    assert result.line().startswith("nchw: mismatch y0 max abs 0.01")

    def broken(m, inputs):
        raise ValueError("no\nsecond line")

    assert [r.line() for r in check.check_model(model, reference=broken)] == [
        "blocked: reference error: ValueError: no", "nchw: reference error: ValueError: no"]

    def refuses(*args, **kwargs):
        raise RuntimeError("unsupported thing\n  traceback...")

    monkeypatch.setattr(api, "compile", refuses)
    (result,) = check.check_model(model, ["blocked"], HOST)
    assert (result.status, result.stage, result.error) == ("error", "compile", "RuntimeError: unsupported thing")


CI_SEEDS = _covering_seeds(COVERAGE_SEEDS, graphs.KINDS)  # 5 seeds today


@pytest.mark.parametrize("seed", CI_SEEDS)
def test_ci_slice_matches_onnxruntime_in_both_layouts(seed):
    """The few seeds of the first 200 that hold every op kind between them, compiled in both layouts."""
    assert len(CI_SEEDS) <= 10
    failures = [r.line() for r in check.check_model(graphs.random_cnn(seed)) if not r.ok]
    assert not failures, "\n".join(failures)


def test_seed_287_a_concat_of_8_channel_blocks_read_by_a_16_channel_depthwise():
    """Found by the campaign (seeds 0-300): a channel concat of a blocked 8-channel conv output and a plain
    8-channel tensor is blocked by 8, and the 16-channel depthwise conv reading it (with it as its residual)
    needs blocks of 16 on AVX-512; it was a compile error ("needs its input blocked like its output")."""
    failures = [r.line() for r in check.check_model(graphs.random_cnn(287)) if not r.ok]
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------------------------- INT8


# depthwise with an int8 residual added after requantized codes, dense hardswish at the ends of the ranges,
# depthwise 7x7 dilated strided to float32, conv2d 7x7 with asymmetric pads and a residual, conv2d strided
# hardswish at the ends, conv2d dilated strided relu6, conv2d 5x5 strided and dense relu at the ends with a
# residual added after requantized codes (uint8, int8)
KERNEL_SEEDS = [1, 3, 9, 23, 35, 38, 34, 53, 11]  # 11: a 3x3 conv on AMX tiles where the CPU has them


def test_kernel_cases_cover_the_families_and_epilogues():
    cases = [int8.random_case(s) for s in KERNEL_SEEDS]
    assert {c.family for c in cases} == set(int8.FAMILIES)
    assert {c.out_dtype for c in cases} == {"uint8", "int8", "float32"} and any(c.residual for c in cases)
    assert {c.activation for c in cases} == {None, "relu", "relu6", "hardswish"}
    assert {c.requantized[0] for c in cases if c.requantized} == {"uint8", "int8"}


@pytest.mark.parametrize("seed", KERNEL_SEEDS)
def test_int8_kernel_cases_bit_exact(seed):
    case = int8.random_case(seed)
    for target in campaign.int8_targets(HOST):
        result = int8.check_case(case, target)
        assert result.ok, result.line()


@pytest.mark.parametrize("seed", KERNEL_SEEDS)
def test_int8_kernel_cases_on_the_cuda_rules_run_bit_exact_on_the_cpu(seed):
    # The CUDA rule's kernel (s8 x s8 tensor-core GEMM without its tensorize steps, GEMV, depthwise), its threads
    # run serially, its blocks in order and in reverse (tvmfuse.fuzz.cuda_cpu).
    result = int8.check_case(int8.random_case(seed), "cuda-sm90")
    assert result.ok, result.line()


def test_a_one_channel_depthwise_case_runs_on_the_cpu():
    # Seed 572: one channel, its block index used directly in T.axis.remap, which takes only variables (the first
    # reversed run substituted a table lookup there and failed to parse).
    result = int8.check_case(int8.random_case(572), "cuda-sm90")
    assert result.ok, result.line()


def test_int8_kernel_cases_get_the_kernel_passes_a_compile_runs():
    # Seed 11 (40 -> 30 channels, 3x3) goes on AMX tiles for a Sapphire Rapids: built without the backend's
    # kernel passes, its tiles had no shapes loaded, and the campaign died of SIGILL at the first tilezero.
    func, _, serially = int8._kernel(int8.random_case(11), targets.resolve({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assert not serially and "llvm.x86.ldtilecfg" in func.script() and "llvm.x86.tdpbusd" in func.script()


def test_int8_kernel_1x1_depthwise_bit_exact():
    """Found by fuzzing: a depthwise 1x1 kernel on a 1x1 map (after a global pool) computed channel 0 only."""
    case = int8.KernelCase("depthwise_conv2d", 1, 5, 5, (1, 1), 1, out_dtype="float32", input_zero_point=100)
    assert int8.check_case(case).ok


def test_int8_kernel_check_can_fail(monkeypatch):
    from tvmfuse.schedules import families

    case = int8.random_case(1)
    module, name = families.FAMILIES[case.family].int8.reference.rsplit(".", 1)
    ref = families.resolve(f"{module}.{name}")

    def one_element_off(*args, **kwargs):
        out = ref(*args, **kwargs).copy()
        out.flat[0] = 7 if out.flat[0] != 7 else 8
        return out

    monkeypatch.setattr(f"{families.PACKAGE}.{module}.{name}", one_element_off)
    result = int8.check_case(case)
    assert result.status == "mismatch" and "elements differ" in result.line()


# Seed 9: a depthwise conv after a global pool (INT8 computed one channel of five before the fix); 148: the
# largest error of seeds 0-199 (0.101, see fuzz.check.INT8_BOUND); then the seeds of the FP32 CI slice.
QUANTIZED_SEEDS = sorted({9, 148} | set(CI_SEEDS))


@pytest.mark.parametrize("seed", QUANTIZED_SEEDS)
def test_quantized_graph_within_bound(seed):
    result = check.check_quantized(graphs.random_cnn(seed))
    assert result.ok, result.line()
    assert result.info["int8_partitions"] > 0 or seed not in (9, 148)
    if result.info["int8_partitions"]:
        assert max(o.max_rel for o in result.outputs) > 0


def test_quantized_check_can_fail():
    def off_by_twice_the_bound(m, inputs):
        return [o + 2 * check.INT8_BOUND * (o.max() - o.min()) for o in check.ort_outputs(m, inputs)]

    result = check.check_quantized(graphs.random_cnn(148), reference=off_by_twice_the_bound)
    assert result.status == "mismatch" and result.line().startswith("int8: mismatch y0")


# ----------------------------------------------------------------------------------------------- campaign


def _bench_fuzz():
    spec = importlib.util.spec_from_file_location("bench_fuzz", ROOT / "bench" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_campaign_saves_a_failing_seed_and_exits_1(tmp_path, monkeypatch, capsys):
    fuzz = _bench_fuzz()
    assert fuzz.main(["--seeds", "3", "4", "--layouts", "nchw", "--out", str(tmp_path / "ok")]) == 0
    out = capsys.readouterr().out
    assert "1 cnn graphs, 1 compiles (nchw), 0 mismatches, 0 errors" in out and not (tmp_path / "ok").exists()

    original = check.ort_outputs
    monkeypatch.setattr(check, "ort_outputs", lambda m, inputs: [o + 1 for o in original(m, inputs)])
    assert fuzz.main(["--seeds", "3", "4", "--layouts", "nchw", "--out", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("seed 3: nchw: mismatch") and "1 mismatches, 0 errors, 1 failing seeds" in lines[-1]
    assert (tmp_path / "seed_3.onnx").read_bytes() == graphs.random_cnn(3).SerializeToString()
    saved = json.loads((tmp_path / "seed_3.json").read_text())
    assert saved["seed"] == 3 and [f["status"] for f in saved["failures"]] == ["mismatch"]


# ----------------------------------------------------------------------------------------------- Winograd graphs


def test_winograd_graphs_are_deterministic_valid_and_made_of_convs_winograd_takes():
    from tvmfuse.schedules.computes import winograd as kernels

    taken = 0
    for seed in range(30):
        model = winograd.random_winograd(seed)
        assert model.SerializeToString() == winograd.random_winograd(seed).SerializeToString()
        onnx.checker.check_model(model, full_check=True)
        dims = {i.name: list(i.dims) for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Conv" and dims[node.input[1]][2:] == [3, 3]:
                out_channels, in_channels = dims[node.input[1]][:2]
                taken += kernels.pays(in_channels, out_channels, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1)
    assert taken >= 50  # 56: nearly two a graph (random_cnn's first 30 seeds hold none)


@pytest.mark.parametrize("seed, tile", [(5, "F(2x2,3x3)"), (7, "F(4x4,3x3)")])  # a one-column map; batch 2
def test_a_winograd_graph_runs_on_winograd_kernels_and_matches_onnxruntime(seed, tile):
    model = winograd.random_winograd(seed)
    cm = api.compile(model, target=HOST, logs=False)
    layouts = [str(f.attrs["tvmfuse.layout"]) for _, f in cm.lowered.functions_items()
               if getattr(f, "attrs", None) is not None and "winograd" in str(f.attrs.get("tvmfuse.family", ""))]
    assert layouts and all(tile in layout for layout in layouts)
    (result,) = check.check_model(model, ["blocked"])
    assert result.ok, result.line()


def test_a_winograd_campaign(tmp_path, capsys):
    assert _bench_fuzz().main(["--seeds", "8", "9", "--graphs", "winograd", "--layouts", "blocked",
                               "--out", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "1 winograd graphs, 1 compiles (blocked), 0 mismatches, 0 errors" in out
    assert "target x86-host (" in out  # the CPU whose code it ran (TVMFUSE_HOST_CPU can pick another)
