"""bench/fuzz_cuda.py: random CNNs through the CUDA pipeline with every partition kernel's schedule run on the CPU
(``--simulate``), a kernel that differs reported as a failure."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import fuzz_cuda  # noqa: E402


def test_graphs_are_simulated_kernel_by_kernel(capsys):
    assert fuzz_cuda.main(["--seeds", "3", "5", "--simulate", "--nvcc-every", "0", "--precision", "fp16"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("2 graphs for cuda-sm90 (fp16)") and "0 failure(s)" in summary
    assert int(summary.split(" kernels simulated")[0].rsplit(" ", 1)[1]) >= 2


def test_a_kernel_that_differs_is_a_failure(monkeypatch, capsys):
    from tvmfuse.fuzz import cuda_cpu

    monkeypatch.setattr(cuda_cpu, "kernel_mismatches", lambda mod, spec: {"tvmfuse_conv2d_1a2b3c": ("conv2d", 0.5)})
    assert fuzz_cuda.main(["--seeds", "0", "1", "--simulate", "--nvcc-every", "0"]) == 1
    out = capsys.readouterr().out
    assert "seed 0: tvmfuse_conv2d_1a2b3c (conv2d) differs on the CPU: relative 5.00e-01" in out
    assert "1 failure(s)" in out


def test_the_seeds_of_the_channel_multiplier_build_in_fp16(capsys):
    # Seeds 12 and 79 hold depthwise convs with 2 output channels per input channel, whose fp16 kernels took the
    # paired layout and failed to build until it was limited to one output channel per input channel.
    for seed in (12, 79):
        assert fuzz_cuda.main(["--seeds", str(seed), str(seed + 1), "--simulate", "--nvcc-every", "1",
                               "--precision", "fp16"]) == 0
    assert capsys.readouterr().out.count("0 failure(s)") == 2


def test_int8_kernel_cases_are_checked_and_a_mismatch_fails(monkeypatch, capsys):
    assert fuzz_cuda.main(["--seeds", "9", "12", "--int8-cases", "--nvcc-every", "0"]) == 0
    assert "3 INT8 kernel cases, 0 failure(s)" in capsys.readouterr().out
    from tvmfuse.fuzz import check, int8

    differ = check.OutputCheck("case", 1.0, 1.0, 3.0, "3 of 9 elements differ")
    wrong = check.Result("int8 cuda-sm90", "mismatch", [differ])
    monkeypatch.setattr(int8, "check_case", lambda case, target: wrong)
    assert fuzz_cuda.main(["--seeds", "9", "10", "--int8-cases", "--nvcc-every", "0"]) == 1
    assert ": mismatch: 3 of 9 elements differ" in capsys.readouterr().out
