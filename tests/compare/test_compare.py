"""``tvmfuse compare`` end to end on a small zoo model: x86-host against onnxruntime, a CUDA arm build-only."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from helpers import HOST

from tvmfuse import cli, targets
from tvmfuse.comparison import Report, correctness
from tvmfuse.comparison.remote import measure_only, merge
from tvmfuse.comparison.run import compare
from tvmfuse.errors import InputError

NVCC = shutil.which("nvcc") is not None
ARMS = [HOST, "cuda-sm90", "cuda-sm90:int8"] if NVCC else [HOST]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    compare("zoo:tiny_convnet", ARMS, peers=["onnxruntime"], budget=3.0, output=out)
    return out


def test_writes_all_three_files_from_one_json(report_dir):
    for name in ("report.json", "report.md", "index.html"):
        assert (report_dir / name).stat().st_size > 0
    data = json.loads((report_dir / "report.json").read_text())
    assert data["schema"] == "tvmfuse.compare/1"
    assert data["model"]["source"] == "zoo:tiny_convnet" and len(data["model"]["sha256"]) == 64
    env = data["environment"]
    assert env["cpu"] and env["versions"]["tvm"] and env["load_before"] is not None and env["load_after"] is not None
    assert env["roofline"]["bandwidth_gbs"] > 0 and env["roofline"]["peak_gflops"] > 0
    assert not list(report_dir.glob(".*.tmp"))  # every write went through a rename


def test_rows_are_measured_checked_and_paired(report_dir):
    report = Report.load(report_dir)
    host, ort, aa = report.row(HOST), report.row("onnxruntime"), report.row(f"{HOST} (A/A)")
    for row in (host, ort, aa):
        assert row["status"] == "measured"
        assert row["threads"]["read_back"] == row["threads"]["requested"]
        assert row["latency"]["samples"] >= 3 and row["latency"]["p50"] > 0
    assert host["correctness"]["within_tolerance"] and host["correctness"]["top1_agreement"] == 1.0
    assert ort["correctness"]["max_abs_err"] == 0.0  # the reference itself
    assert host["build"]["kernels"] >= 1 and host["build"]["library_bytes"] > 0
    assert (report_dir / host["build"]["library"]).exists()
    ratio = report.ratio("onnxruntime", HOST)
    assert ratio["ci"][0] <= ratio["ratio"] <= ratio["ci"][1] and ratio["rounds"] >= 3
    assert {r["contender"] for r in report.data["ratios"]} == {"onnxruntime", f"{HOST} (A/A)"}
    assert report.data["fastest"][host["device"]] in (HOST, "onnxruntime")


def test_profile_accounts_for_the_end_to_end_time(report_dir):
    host = Report.load(report_dir).row(HOST)
    prof = host["profile"]
    kernels = prof["kernels"]
    assert sum(k["us"] for k in kernels) + prof["unattributed_us"] == pytest.approx(prof["end_to_end_us"])
    ours = [k for k in kernels if k["schedule"] == "tvmfuse rule"]
    assert ours and all(k["flops"] > 0 and k["bytes"] > 0 and k["gflops"] > 0 for k in ours)
    assert all(k["partition"].startswith("tvmfuse.") and k["fused_ops"][0] == "conv2d" for k in ours
               if k["kind"].startswith("conv2d"))
    ort = Report.load(report_dir).row("onnxruntime")["profile"]
    assert "Conv" in {k["kind"] for k in ort["kernels"]}  # onnxruntime's own profiler, by operator type


@pytest.mark.skipif(not NVCC, reason="nvcc not installed: no CUDA arm to build")
def test_cuda_arm_is_a_build_only_row_with_its_reason(report_dir):
    row = Report.load(report_dir).row("cuda-sm90")
    if targets.resolve("cuda-sm90").backend().why_not_runnable():
        assert row["status"] == "build-only" and row["reason"] == "no CUDA device on this machine"
        assert row["latency"] is None and row["device"] == "cuda: sm_90"
    assert row["build"]["kernels"] >= 1 and (report_dir / row["build"]["library"]).exists()


@pytest.mark.skipif(not NVCC, reason="nvcc not installed: no CUDA arm to build")
def test_cuda_int8_arm_quantizes_every_partition_onto_the_cuda_rules(report_dir):
    row = Report.load(report_dir).row("cuda-sm90:int8")
    assert row["precision"] == "int8" and row["status"] in ("build-only", "measured"), row["reason"]
    build = row["build"]
    assert build["quantization"]["int8_partitions"] >= 1 and build["quantization"]["fp32_partitions"] == 0
    int8_kernels = [k for k in build["kernel_info"].values() if k["partition"].startswith("tvmfuse.")
                    and k["kind"].startswith("int8")]
    assert int8_kernels and all(k["tvmfuse"] for k in int8_kernels)


def test_render_rewrites_from_json_alone(report_dir, tmp_path):
    copy = tmp_path / "r"
    copy.mkdir()
    shutil.copy(report_dir / "report.json", copy)
    assert cli.main(["compare", "--render", str(copy)]) == 0
    assert (copy / "report.md").read_text() == (report_dir / "report.md").read_text()
    assert (copy / "index.html").read_text() == (report_dir / "index.html").read_text()


def test_measure_only_then_merge_never_pairs_rows_across_runs(report_dir, tmp_path):
    result = measure_only(report_dir, tmp_path / "there.json", budget=1.0, profile=False)
    there = Report.load(result)
    assert there.row(HOST)["status"] == "measured" and there.row(HOST)["correctness"]["within_tolerance"]
    merged = merge([report_dir / "report.json", result], tmp_path / "merged")
    names = [r["name"] for r in merged.rows]
    assert HOST in names and any(n.startswith(f"{HOST} [") for n in names)
    second = next(n for n in names if n.startswith(f"{HOST} ["))
    with pytest.raises(InputError, match="different devices or in different runs"):
        merged.ratio(second, HOST)
    assert (tmp_path / "merged" / "index.html").exists()


def test_correctness_flags_a_wrong_row():
    ref = [[np.array([[0.0, 1.0, 2.0]])]]
    wrong = [[np.array([[2.0, 1.0, 0.0]])]]
    bad = correctness.check(wrong, ref, "fp32")
    assert not bad["within_tolerance"] and bad["top1_agreement"] == 0.0
    assert correctness.check(ref, ref, "fp32", y=np.array([2]))["accuracy"] == 1.0
    near = [[np.array([[0.0, 1.05, 2.1]])]]
    assert correctness.check(near, ref, "int8")["within_tolerance"]


@pytest.mark.parametrize("args,message", [
    (["zoo:tiny_convnet", "--targets", "x86-nope", "-o", "{tmp}"], "unknown target 'x86-nope'"),
    (["zoo:tiny_convnet", "--targets", "x86-host:bf16", "-o", "{tmp}"], "precision 'bf16'"),
    (["zoo:tiny_convnet", "--targets", "x86-host:fp16", "-o", "{tmp}"], "target x86-host does not build fp16"),
    (["zoo:tiny_convnet", "--targets", "x86-host,x86-host", "-o", "{tmp}"], "given twice"),
    (["zoo:tiny_convnet", "--targets", "x86-host@/no/such/dir", "-o", "{tmp}"], "does not exist"),
    (["zoo:tiny_convnet", "--targets", "x86-host", "--peers", "tensorrt", "-o", "{tmp}"], "unknown peer"),
    (["zoo:tiny_convnet", "--targets", "x86-host", "--baseline", "openvino", "-o", "{tmp}"], "neither an arm"),
    (["zoo:tiny_convnet", "--targets", "x86-host"], "-o DIR is required"),
    (["zoo:tiny_convnet", "--targets", "x86-host", "--labels", "y.npy", "-o", "{tmp}"], "--labels needs --inputs"),
    (["zoo:no_such_model", "--targets", "x86-host", "-o", "{tmp}"], "no_such_model"),
    (["--render", "{tmp}/missing"], "no such report"),
    (["--merge", "{tmp}/a.json", "-o", "{tmp}"], "at least two"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path, capsys):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert cli.main(["compare", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_bad_labels_and_inputs_are_named(tmp_path, capsys):
    np.savez(tmp_path / "x.npz", input=np.zeros((1, 3, 32, 32), np.float32))
    np.save(tmp_path / "y.npy", np.array([0.5, 1.5]))
    assert cli.main(["compare", "zoo:tiny_convnet", "--targets", "x86-host", "--inputs", str(tmp_path / "x.npz"),
                     "--labels", str(tmp_path / "y.npy"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "y.npy" in err or "input" in err
    assert not (tmp_path / "out" / "report.json").exists()


def test_a_schema_mismatch_is_refused(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"schema": "something/9"}))
    with pytest.raises(InputError, match="schema 'something/9'"):
        Report.load(tmp_path)


def test_without_the_report_extra_json_and_markdown_are_kept(report_dir, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.warns(UserWarning, match=r"index.html not written: it needs matplotlib .*tvmfuse\[report\]"):
        assert Report.load(report_dir).write(tmp_path) == tmp_path  # finishes with what it could write
    assert (tmp_path / "report.json").exists() and (tmp_path / "report.md").exists()
    assert not (tmp_path / "index.html").exists()


def test_a_compare_that_cannot_render_the_page_says_so_before_measuring(tmp_path, monkeypatch):
    from tvmfuse.comparison import run
    from tvmfuse.errors import ModelLoadError

    monkeypatch.setattr(run, "html_missing", lambda: "it needs matplotlib (pip install 'tvmfuse[report]')")
    with pytest.warns(UserWarning, match="index.html will not be written: it needs matplotlib"):
        with pytest.raises(ModelLoadError):  # the warning came first, before the model was even read
            run.compare(tmp_path / "missing.onnx", "x86-host", output=tmp_path / "out")
