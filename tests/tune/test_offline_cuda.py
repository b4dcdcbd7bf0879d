"""Offline CUDA tuning: candidates built here (one library per kernel, real cubins), their times imported back as
tuning records that compile applies. The timing itself runs on a GPU (bench/device/time_candidates.py); here the
results file is written by the test."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx import helper, numpy_helper

import tvmfuse
from helpers import conv_relu, make_model
from tvmfuse import cli, targets
from tvmfuse.errors import InputError
from tvmfuse.schedules.cuda import conv2d
from tvmfuse.tune import offline
from tvmfuse.tune.records import decoded_record

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
ROOT = Path(__file__).resolve().parents[2]
MODEL = conv_relu(batch=1)  # one conv: 3 -> 8 channels on 16x16, a GEMM of 256 x 8 x 27


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    directory = tmp_path_factory.mktemp("candidates")
    (path,) = offline.export_candidates(MODEL, "cuda-sm90", directory)
    return directory, path, json.loads(path.read_text())


def _results(info: dict, file: str, times: dict, wrong=()) -> dict:
    rows = [{"function": c["function"], "ok": c["function"] not in wrong, "us": times.get(c["function"], 50.0)}
            for c in info["candidates"]]
    return {"format": offline.TIMES, "format_version": 1, "device": "test",
            "kernels": {info["kernel"]: {"key": info["key"], "file": file, "candidates": rows}}}


def test_each_kernel_with_knobs_gets_a_library_of_its_candidates(exported):
    directory, path, info = exported
    assert info["format"] == offline.CANDIDATES and info["kernel"].startswith("tvmfuse_conv2d")
    configs = [c["config"] for c in info["candidates"]]
    assert configs[0] == conv2d.Config(**configs[0]).__dict__ and len(configs) == len(conv2d.candidates(256, 8, 27))
    assert conv2d.Config(**configs[0]) == conv2d.default_config(256, 8, 27, 132)  # the default first
    data = (directory / info["library"]).read_bytes()
    at = data.find(struct.pack("<Q", 4) + b"cuda") + 20
    (length,) = struct.unpack("<Q", data[at:at + 8])
    assert data[at + 8:at + 8 + length] in (b"cubin", b"fatbin")  # nvcc built them
    assert info["args"][0] == {"shape": [1, 3, 16, 16], "dtype": "float32"}


def test_candidate_zero_replays_to_the_default_schedule(exported):
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    _, _, info = exported
    workload = ms.database.Workload.from_json(info["workload"])
    record = decoded_record(info["candidates"][0]["record"], workload)  # through JSON, IndexMaps and all
    sch = s_tir.Schedule(workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    default = targets.resolve("cuda-sm90").backend().schedule(workload.mod["main"])
    assert tvm_ffi.structural_equal(sch.mod["main"].body, default.body)


def test_imported_winners_are_applied_by_compile(exported, tmp_path):
    directory, path, info = exported
    pick = info["candidates"][3]
    times = {"candidate0": 40.0, "candidate1": 5.0, pick["function"]: 10.0}
    results = directory / "results.json"
    results.write_text(json.dumps(_results(info, path.name, times, wrong={"candidate1"})))
    outcome = offline.import_results(results, directory, tmp_path / "logs")
    learnt = len(info["candidates"]) - 1  # every correct candidate's time teaches the cost model
    assert outcome == {info["kernel"]: {"candidate": pick["function"], "us": 10.0, "default_us": 40.0,
                                        "model_samples": learnt}}
    cm = tvmfuse.compile(MODEL, target="cuda-sm90", logs=tmp_path / "logs")
    (kernel,) = [k for k in cm.manifest()["scheduled_by"] if k.startswith("tvmfuse_conv2d")]
    assert cm.manifest()["scheduled_by"][kernel] == "tuning_log" and cm.tuning_logs["applied"] == [kernel]
    source = cm.executable.mod.imports[0].imports[0].inspect_source()
    threads = conv2d.Config(**pick["config"]).threads
    assert re.search(rf"__launch_bounds__\({threads}\) {kernel}_kernel\(", source)  # the imported tile


def test_a_kernel_without_a_correct_candidate_is_skipped(exported, tmp_path):
    directory, path, info = exported
    results = tmp_path / "results.json"
    every = {c["function"] for c in info["candidates"]}
    results.write_text(json.dumps(_results(info, path.name, {}, wrong=every)))
    outcome = offline.import_results(results, directory, tmp_path / "logs")
    assert outcome == {info["kernel"]: {"skipped": "no candidate matched candidate0's output"}}
    assert not (tmp_path / "logs").exists()


def test_bad_results_are_one_line_errors(exported, tmp_path, capsys):
    directory, _, _ = exported
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=r"^results .*bad.json: not JSON"):
        offline.import_results(bad, directory, tmp_path / "logs")
    assert cli.main(["tune", "--import-results", str(tmp_path / "missing.json")]) == 2
    assert cli.main(["tune", "--target", "cuda-sm90"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "missing.json: cannot read" in err[0] and "give a MODEL" in err[1]


def test_the_cli_exports_candidates(tmp_path, capsys):
    import onnx

    model = tmp_path / "conv.onnx"
    onnx.save(MODEL, model)
    assert cli.main(["tune", str(model), "--target", "cuda-sm90", "--export-candidates", str(tmp_path / "c")]) == 0
    assert "wrote the candidates of 1 kernel(s)" in capsys.readouterr().out
    assert len(list((tmp_path / "c").glob("*.so"))) == 1


def _fake_candidates(directory):
    """A library of three llvm candidates of y = 2x (the second wrong) and its candidate file: what the device
    script reads, runnable on this CPU."""
    from tvm import te

    x = te.placeholder((64,), "float32", name="x")
    funcs = {}
    for name, extra in (("candidate0", 0.0), ("candidate1", 1.0), ("candidate2", 0.0)):
        y = te.compute((64,), lambda i: x[i] * 2.0 + extra, name="y")
        funcs[name] = te.create_prim_func([x, y]).with_attr("global_symbol", name)
    tvm.compile(tvm.IRModule(funcs), target="llvm").export_library(str(directory / "000_k.so"))
    info = {"format": offline.CANDIDATES, "kernel": "k", "key": "123", "library": "000_k.so",
            "args": [{"shape": [64], "dtype": "float32"}] * 2,
            "candidates": [{"function": f"candidate{i}"} for i in range(3)]}
    (directory / "000_k.json").write_text(json.dumps(info))


def test_the_device_script_checks_and_times_every_candidate(tmp_path):
    import importlib.util

    _fake_candidates(tmp_path)
    spec = importlib.util.spec_from_file_location("time_candidates", ROOT / "bench" / "device" / "time_candidates.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(tmp_path), str(tmp_path / "times.json"), "--device", "cpu", "--repeat", "2"]) == 0
    times = json.loads((tmp_path / "times.json").read_text())
    assert times["format"] == offline.TIMES
    rows = times["kernels"]["k"]["candidates"]
    assert [r["ok"] for r in rows] == [True, False, True] and rows[1]["max_abs_diff"] == pytest.approx(1.0)
    assert all(r["us"] > 0 for r in rows) and times["kernels"]["k"]["file"] == "000_k.json"


def test_depthwise_kernels_export_their_tiles(tmp_path):
    import numpy as np
    from onnx import helper, numpy_helper

    from helpers import make_model
    from tvmfuse.schedules.cuda import depthwise_conv2d

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 1, 3, 3)).astype("float32"), "W")
    model = make_model([helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], group=8),
                        helper.make_node("Relu", ["c"], ["y"])], [("x", [1, 8, 16, 16])], [("y", None)], [w])
    (path,) = offline.export_candidates(model, "cuda-sm90", tmp_path)
    info = json.loads(path.read_text())
    assert info["kernel"].startswith("tvmfuse_depthwise_conv2d")
    configs = [depthwise_conv2d.Config(**c["config"]) for c in info["candidates"]]
    assert configs == depthwise_conv2d.candidates(8, 16, 16, sms=132) and len(configs) > 2
    assert configs[0] == depthwise_conv2d.default_config(8, 16, 16, sms=132)
    assert all(c.threads <= 1024 for c in configs)


def test_fp16_candidates_are_the_tensor_core_tiles(tmp_path):
    from tvmfuse.schedules.cuda import tensor_core

    weight = numpy_helper.from_array(np.ones((64, 32, 1, 1), "float32"), "W")
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[1, 1])],
                       [("x", [1, 32, 16, 16])], [("y", None)], [weight])
    (path,) = offline.export_candidates(model, "cuda-sm90", tmp_path, precision="fp16")
    info = json.loads(path.read_text())
    configs = [tensor_core.Config(**c["config"]) for c in info["candidates"]]
    assert configs == tensor_core.candidates(256, 64, 32)  # a GEMM of 256 pixels x 64 channels x 32
    assert info["args"][0]["dtype"] == "float16"


def _slow_by_config(config: dict, round_: int) -> float:
    """Made-up device times: small tiles and short K steps are slow (the same in every round, plus a hair)."""
    return 100.0 / (config["threads_i"] * config["threads_j"]) + 64.0 / config["step_k"] + 0.01 * round_


def test_the_cost_model_learns_from_imports_and_ranks_the_next_export(exported, tmp_path):
    from tvmfuse.tune import cost_model

    directory, path, info = exported
    logs = tmp_path / "logs"
    n = len(info["candidates"])
    times = lambda r: {c["function"]: _slow_by_config(c["config"], r) for c in info["candidates"]}  # noqa: E731
    (directory / "r0.json").write_text(json.dumps(_results(info, path.name, times(0))))
    first = offline.import_results(directory / "r0.json", directory, logs)
    assert first[info["kernel"]]["model_samples"] == n
    assert (logs / "cuda-sm90" / cost_model.FILE).is_file()
    again = offline.import_results(directory / "r0.json", directory, logs)  # the same file: nothing new
    assert again[info["kernel"]]["model_samples"] == n
    # Below MIN_SAMPLES every candidate is built.
    (few,) = offline.export_candidates(MODEL, "cuda-sm90", tmp_path / "few", max_candidates=3, logs=logs)
    few = json.loads(few.read_text())
    assert len(few["candidates"]) == n and few["ranked_by_cost_model"] is None
    for r in range(1, -(-cost_model.MIN_SAMPLES // n) + 1):
        (directory / f"r{r}.json").write_text(json.dumps(_results(info, path.name, times(r))))
        offline.import_results(directory / f"r{r}.json", directory, logs)
    (ranked,) = offline.export_candidates(MODEL, "cuda-sm90", tmp_path / "ranked", max_candidates=4, logs=logs)
    ranked = json.loads(ranked.read_text())
    assert ranked["ranked_by_cost_model"]["kept"] == 4 and ranked["ranked_by_cost_model"]["samples"] >= 64
    configs = [c["config"] for c in ranked["candidates"]]
    assert configs[0] == info["candidates"][0]["config"]  # the default stays candidate0
    fastest = sorted(info["candidates"], key=lambda c: _slow_by_config(c["config"], 0))[:3]
    assert any(c["config"] in configs[1:] for c in fastest), configs  # the model learnt what is fast
    with pytest.raises(InputError, match="--max-candidates 0: give at least 1"):
        offline.export_candidates(MODEL, "cuda-sm90", tmp_path / "none", max_candidates=0, logs=logs)


def test_int8_candidates_are_the_s8_tensor_core_tiles_and_apply_to_quantize(tmp_path, capsys):
    # Candidates are built from a table; the imported winner is filed under the kernel's shared form
    # (tvmfuse.tune.shared_form), so it applies to that library and to one quantized with another table, whose
    # kernel is another workload (other zero points and bounds in it).
    from tvmfuse.schedules.cuda import tensor_core

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 32, 1, 1)).astype("float32"), "W")
    model = make_model([helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[1, 1])],
                       [("x", [1, 32, 16, 16])], [("y", None)], [weight])
    table = tmp_path / "table.json"
    batches = [{"x": np.random.default_rng(1).standard_normal((1, 32, 16, 16)).astype("float32")}]
    tvmfuse.quantize(model, calib=batches, method="minmax", target="cuda-sm90", table=table)
    (path,) = offline.export_candidates(model, "cuda-sm90", tmp_path / "c", precision="int8", table=table)
    info = json.loads(path.read_text())
    configs = [tensor_core.Config(**c["config"]) for c in info["candidates"]]
    assert configs == tensor_core.candidates(256, 64, 32, operand="int8") and info["precision"] == "int8"
    assert info["kernel"].startswith("tvmfuse_int8_conv2d") and info["args"][0]["dtype"] == "uint8"
    pick = info["candidates"][2]["function"]
    results = tmp_path / "c" / "results.json"
    results.write_text(json.dumps(_results(info, path.name, {pick: 3.0})))
    assert offline.import_results(results, tmp_path / "c", tmp_path / "logs")[info["kernel"]]["candidate"] == pick
    cm = tvmfuse.quantize(model, table=table, target="cuda-sm90", logs=tmp_path / "logs")
    assert cm.manifest()["scheduled_by"][info["kernel"]] == "tuning_log"
    other = tmp_path / "other.json"
    tvmfuse.quantize(model, calib=[{"x": 5 * batches[0]["x"] + 1}], method="minmax", target="cuda-sm90", table=other)
    cm2 = tvmfuse.quantize(model, table=other, target="cuda-sm90", logs=tmp_path / "logs")
    (kernel,) = [n for n in cm2.manifest()["scheduled_by"] if n.startswith("tvmfuse_int8_conv2d")]
    assert kernel != info["kernel"] and cm2.manifest()["scheduled_by"][kernel] == "tuning_log"
    sources = [c.executable.mod.imports[0].imports[0].inspect_source() for c in (cm, cm2)]
    assert sources[0] != sources[1]  # each library its own table's constants, both the record's tiles
    mma = [src.count("wmma::mma_sync") for src in sources]
    assert mma[0] > 0 and mma[1] == mma[0]
    with pytest.raises(InputError, match="--precision int8 --table TABLE"):
        offline.export_candidates(model, "cuda-sm90", tmp_path / "d", precision="int8")
    assert cli.main(["tune", "zoo:tiny_convnet", "--target", "cuda-sm90", "--table", str(table)]) == 2
    assert "go with --export-candidates" in capsys.readouterr().err


def test_shipped_cuda_records_apply_to_every_resnet50_fp16_conv():
    """tuning_logs/cuda-sm90/ (ResNet-50's fp16 convs, timed on an H200): a compute change would orphan them."""
    cm = tvmfuse.compile("zoo:resnet50", target="cuda-sm90", precision="fp16")
    assert cm.tuning_logs["path"] == str(ROOT / "tuning_logs" / "cuda-sm90")
    assert cm.tuning_logs["skipped_lines"] == 0
    convs = [n for n in tvmfuse.export.kernel_names(cm.lowered) if n.startswith("tvmfuse_conv2d")]
    assert len(convs) == 24 and set(convs) <= set(cm.tuning_logs["applied"])


def test_shipped_int8_records_apply_whatever_the_calibration_table():
    """The INT8 records of 2026-11-30 were timed on kernels quantized with prepare.sh's table (random:4); filed under
    their shared form, they schedule a library quantized with another table: every INT8 kernel of MobileNetV2 but
    its dense (a GEMV: no candidates)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random calibration's warning
        cm = tvmfuse.quantize("zoo:mobilenet_v2", calib="random:2", method="minmax", target="cuda-sm90")
    int8 = [n for n in tvmfuse.export.kernel_names(cm.lowered) if n.startswith("tvmfuse_int8_")]
    missed = [n for n in int8 if n not in cm.tuning_logs["applied"]]
    assert len(int8) == 45 and [n.rsplit("_", 1)[0] for n in missed] == ["tvmfuse_int8_dense"], missed


def test_a_fresh_process_decodes_tensor_core_records():
    """A record tensorized with ``wmma_*`` decodes only once TVM's CUDA intrinsics are registered; a process
    that has not scheduled anything for CUDA yet (compile reads the logs before the rules run) registers them
    from the record's names."""
    import subprocess
    import sys

    code = ("from tvmfuse import targets; import tvm.s_tir as s\n"
            "names = {'wmma_load_16x16x16_f16_a_shared_dyn', 'no_such_intrin'}\n"
            "assert s.TensorIntrin.get('wmma_load_16x16x16_f16_a_shared_dyn', allow_missing=True) is None\n"
            "print(targets.resolve('cuda-sm90').backend().register_record_intrinsics(names))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['wmma_load_16x16x16_f16_a_shared_dyn']"
