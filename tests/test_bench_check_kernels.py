"""bench/cuda_check_kernels.py --int8: every kernel of a quantized model enumerated, given codes over their
whole range, and an INT8 kernel's codes required identical. The GPU run is replaced here by the CPU build of the
unscheduled kernel (the check itself runs on a lent GPU, in the prepared round)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import cuda_check_kernels  # noqa: E402


@pytest.fixture
def on_the_cpu(monkeypatch):
    """The CUDA kernel run as its CPU reference; ``offset[0]`` codes added to the first INT8 output."""
    import tvm

    runs = {"cuda": 0}
    offset = [0]
    kernels = cuda_check_kernels._int8_kernels

    def int8_kernels(model, spec, shapes):
        for name, _, cpu_func in kernels(model, spec, shapes):
            yield name, cpu_func.with_attr("tvmfuse.scheduled_by", "cpu stand-in"), cpu_func

    run = cuda_check_kernels._run

    def fake_run(func, target, dev, arrays):
        if target.kind.name == "cuda":
            runs["cuda"] += 1
            out = run(func, tvm.target.Target("llvm"), tvm.cpu(0), arrays)
            if out.dtype.kind in "iu" and runs["cuda"] == 1:
                out = out.copy()
                out.flat[0] = out.flat[0] ^ offset[0]
            return out
        return run(func, target, dev, arrays)

    monkeypatch.setattr(cuda_check_kernels, "_int8_kernels", int8_kernels)
    monkeypatch.setattr(cuda_check_kernels, "_run", fake_run)
    return runs, offset


def test_every_kernel_of_the_quantized_model_is_checked(on_the_cpu, capsys):
    runs, _ = on_the_cpu
    assert cuda_check_kernels.main(["zoo:tiny_convnet", "--int8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "0 kernel(s) off"
    int8 = [line for line in lines if "tvmfuse_int8_" in line]
    assert runs["cuda"] == len(lines) - 1 >= 7 and len(int8) >= 6
    assert all(line.startswith("ok ") for line in lines[:-1])
    assert any("0 of " in line and "codes differ" in line for line in int8)


def test_one_code_off_is_a_bad_kernel(on_the_cpu, capsys):
    _, offset = on_the_cpu
    offset[0] = 1
    assert cuda_check_kernels.main(["zoo:tiny_convnet", "--int8"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "1 kernel(s) off"
    assert [line.split()[0] for line in lines[:-1]].count("BAD") == 1
    assert "1 of " in next(line for line in lines if line.startswith("BAD"))


@pytest.mark.parametrize("dtype,low,high", [("uint8", 0, 255), ("int8", -128, 127)])
def test_random_codes_cover_their_range(dtype, low, high):
    param = SimpleNamespace(ty=SimpleNamespace(shape=[4096], dtype=dtype))
    codes = cuda_check_kernels._random(np.random.default_rng(0), param, True)
    assert codes.dtype == dtype and (codes.min(), codes.max()) == (low, high)


def test_an_int8_kernel_gets_small_positive_multipliers():
    param = SimpleNamespace(ty=SimpleNamespace(shape=[512], dtype="float32"))
    scales = cuda_check_kernels._random(np.random.default_rng(0), param, True)
    assert 0 < scales.min() and scales.max() < 0.05
