"""The command line: commands, --shape, exit codes and one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tvmfuse import cli
from tvmfuse.errors import ShapeError

from helpers import conv_relu


def run_cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tvmfuse", *map(str, argv)], capture_output=True, text=True,
                          timeout=300)


def test_parse_shape():
    assert cli.parse_shape("input:1,3,224,224") == ("input", (1, 3, 224, 224))
    assert cli.parse_shape("ns:x:1,2") == ("ns:x", (1, 2))
    for bad in ("input", "input:", ":1,2", "input:a,b"):
        with pytest.raises(ShapeError, match="NAME:D1"):
            cli.parse_shape(bad)


def test_compile_then_run_with_inputs(tmp_path, capsys):
    model = tmp_path / "dyn.onnx"
    model.write_bytes(conv_relu(batch="N").SerializeToString())
    lib = tmp_path / "dyn.so"
    assert cli.main(["compile", str(model), "--target", "x86-host", "--shape", "x:2,3,16,16", "-o", str(lib)]) == 0
    captured = capsys.readouterr()
    assert "[3/3] build" in captured.err
    manifest = json.loads(lib.with_suffix(".json").read_text())
    assert manifest["inputs"][0]["shape"] == [2, 3, 16, 16]
    # who scheduled each kernel: the manifest's map, and one summary line
    assert manifest["scheduled_by"] and set(manifest["scheduled_by"]) == set(manifest["kernels"])
    assert f"kernels scheduled by: {len(manifest['kernels'])} tvmfuse.x86" in captured.out
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype("float32")
    np.savez(tmp_path / "in.npz", x=x)
    assert cli.main(["run", str(lib), "--inputs", str(tmp_path / "in.npz"), "--save", str(tmp_path / "out.npz"),
                     "--benchmark", "--repeat", "3", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "y: shape (2, 8, 16, 16) float32" in out and "latency: median" in out
    with np.load(tmp_path / "out.npz") as saved:
        assert saved["y"].shape == (2, 8, 16, 16) and (saved["y"] >= 0).all()


def test_info_zoo(capsys):
    assert cli.main(["info", "zoo:resnet50"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 25,557,032" in out and "input:  input (1, 3, 224, 224) float32" in out
    assert "Conv" in out and "BatchNormalization       53" in out
    # ResNet-50 is 4.1 GMACs: 8.2 GFLOP at 2 FLOPs per multiply-add.
    assert "8.178 GFLOP" in out


def test_zoo_lists_models(capsys):
    assert cli.main(["zoo"]) == 0
    assert "zoo:mobilenet_v2" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["info", "missing.onnx"], "model file not found: missing.onnx"),
    (["compile", "zoo:tiny_convnet", "--target", "x86-avx1024", "-o", "x.so"], "unknown target 'x86-avx1024'"),
    (["info", "zoo:tiny_convnet", "--shape", "oops"], "--shape 'oops'"),
    (["run", "missing.so"], "compiled model not found: missing.so"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, "-m", "tvmfuse", *argv], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_bad_usage_exits_2(tmp_path):
    for argv in ([], ["compile", "zoo:tiny_convnet"], ["frobnicate"]):
        assert run_cli(*argv).returncode == 2


def test_run_with_wrong_npz_names(tmp_path, tiny_exported):
    np.savez(tmp_path / "in.npz", image=np.zeros((1, 3, 32, 32), "float32"))
    proc = run_cli("run", tiny_exported, "--inputs", tmp_path / "in.npz")
    assert proc.returncode == 2 and "missing input(s) ['input']" in proc.stderr
    (tmp_path / "bad.npz").write_text("nope")
    proc = run_cli("run", tiny_exported, "--inputs", tmp_path / "bad.npz")
    assert proc.returncode == 2 and f"--inputs {tmp_path / 'bad.npz'}: not an .npz file" in proc.stderr
    assert "pickle" not in proc.stderr


def test_default_target_is_this_machine_and_the_library_runs(tmp_path):
    lib = tmp_path / "m.so"
    done = run_cli("compile", "zoo:tiny_convnet", "-o", lib, "-q")
    assert done.returncode == 0, done.stderr
    assert "(target x86-host)" in done.stdout and "warning" not in done.stderr
    assert json.loads(lib.with_suffix(".json").read_text())["target"]["name"] == "x86-host"
    ran = run_cli("run", lib)
    assert ran.returncode == 0, ran.stderr
    for command in ("compile", "quantize", "tune", "partition"):
        assert "default x86-host: this machine" in run_cli(command, "--help").stdout.replace("\n", " ")


def test_a_library_this_machine_cannot_run_is_said_at_compile_time(tmp_path):
    import os

    from tvmfuse import targets

    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        pytest.skip("this CPU cannot stand in for an AVX2 one")
    env = dict(os.environ, **{targets.HOST_CPU_ENV: "znver3"})
    done = subprocess.run([sys.executable, "-m", "tvmfuse", "compile", "zoo:tiny_convnet", "--target", "x86-avx512",
                           "-o", str(tmp_path / "m.so"), "-q"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and warning[0].startswith("tvmfuse compile: warning: target x86-avx512 uses CPU "
                                                       "features this machine lacks (avx512")
    assert "will not run here" in warning[0] and "UserWarning" not in done.stderr
    # said of the library written: a compile that fails after it ends in its one error line
    (tmp_path / "logs" / "x86-avx512" / "database_tuning_record.json").mkdir(parents=True)
    failed = subprocess.run([sys.executable, "-m", "tvmfuse", "compile", "zoo:tiny_convnet", "--target", "x86-avx512",
                             "--logs", str(tmp_path / "logs"), "-o", str(tmp_path / "n.so"), "-q"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert failed.returncode == 2 and failed.stderr.splitlines() == [
        f"tvmfuse compile: error: tuning logs: {tmp_path}/logs/x86-avx512/database_tuning_record.json is not a file"]


def test_timing_summary_percentiles_and_spread():
    from tvmfuse.runtime import timing_summary

    s = timing_summary([float(t) for t in range(1, 12)])  # 1 .. 11 ms
    assert (s["median_ms"], s["p10_ms"], s["p90_ms"], s["min_ms"], s["max_ms"]) == (6.0, 2.0, 10.0, 1.0, 11.0)
    assert s["spread"] == pytest.approx(8 / 6)
    assert timing_summary([5.0])["spread"] == 0.0


@pytest.mark.parametrize("times, warned", [([10.0, 10.1, 10.2, 9.9, 10.0], False),
                                           ([6.7, 15.1, 31.1, 12.0, 18.0, 15.5, 14.9], True)])
def test_benchmark_says_the_spread_and_warns_when_it_is_wide(tiny_exported, capsys, monkeypatch, times, warned):
    from tvmfuse import runtime

    monkeypatch.setattr(runtime.LoadedModel, "benchmark",
                        lambda self, inputs, repeat, warmup: runtime.timing_summary(times) | {"repeat": repeat,
                                                                                               "warmup": warmup})
    assert cli.main(["run", str(tiny_exported), "--benchmark", "--repeat", "7"]) == 0
    captured = capsys.readouterr()
    assert "latency: median" in captured.out and "p10" in captured.out and "p90" in captured.out
    lines = [line for line in captured.err.splitlines() if "warning" in line]
    if warned:
        assert len(lines) == 1 and lines[0].startswith("tvmfuse run: warning: the runs spread over")
        assert "tvmfuse compare" in lines[0]
    else:
        assert not lines


def _recognizer_input(tmp_path):
    """x[N, 3, 48, W] -> Relu: a text recognizer's input, batch and width dynamic."""
    from helpers import make_model
    from onnx import helper

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["N", 3, 48, "W"])], [("y", None)])
    path = tmp_path / "rec.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_dynamic_dims_hint_uses_the_models_own_dims_in_each_interfaces_words(tmp_path):
    import tvmfuse

    path = _recognizer_input(tmp_path)
    proc = run_cli("compile", path, "-o", tmp_path / "r.so", "-q")
    assert proc.returncode == 2
    assert "fix them with --shape x:1,3,48,W (W: the size you will run at)" in proc.stderr, proc.stderr
    with pytest.raises(ShapeError, match=r"fix them with shapes=\{'x': \(1, 3, 48, W\)\} \(W: the size you will"):
        tvmfuse.compile(path)
    proc = run_cli("compile", path, "-o", tmp_path / "r.so", "-q", "--shape", "image:1,3,48,320")
    assert proc.returncode == 2 and "error: --shape names unknown input(s) ['image']" in proc.stderr
    with pytest.raises(ShapeError, match=r"^shapes= names unknown input\(s\) \['image'\]"):
        tvmfuse.compile(path, shapes={"image": (1, 3, 48, 320)})


def test_main_gives_python_its_own_words_back(tmp_path, capsys):
    import warnings

    import tvmfuse
    from tvmfuse import errors

    before = warnings.showwarning
    path = _recognizer_input(tmp_path)
    assert cli.main(["compile", str(path), "-o", str(tmp_path / "r.so"), "-q"]) == 2
    assert "--shape x:1,3,48,W" in capsys.readouterr().err
    assert errors.INTERFACE.get() == "python" and warnings.showwarning is before
    with pytest.raises(ShapeError, match=r"shapes=\{'x'"):
        tvmfuse.compile(path)
