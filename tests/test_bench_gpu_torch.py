"""bench/gpu.py's PyTorch contenders (eager and torch.compile), run here against a stand-in ``torch`` that
records what the bench asked of it (no GPU, no torch on this machine): the compiled model is what is timed,
in the row's precision and channels_last, and a contender that raises is reported in its row."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import gpu  # noqa: E402


class _Tensor:
    def __init__(self, log):
        self.log = log

    def to(self, **kw):
        self.log.append(("to", kw.get("memory_format")))
        return self

    def half(self):
        self.log.append("half")
        return self


class _Net(_Tensor):
    calls = 0

    def eval(self):
        return self

    def cuda(self):
        return self

    def __call__(self, x):
        _Net.calls += 1
        return x


def _fake_torch(log, fail=False):
    torch = types.ModuleType("torch")
    torch.channels_last = "channels_last"
    torch.backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(benchmark=False, allow_tf32=True),
                                           cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)))
    torch.randn = lambda *shape, device: _Tensor(log)

    class Event:
        def __init__(self, enable_timing):
            pass

        def record(self):
            pass

        def elapsed_time(self, end):
            return 20.0

    class _Mode:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def compile_(net, mode):
        if fail:
            raise RuntimeError("inductor: no triton\nmore lines")
        log.append(("compile", mode))
        return net

    torch.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None)
    torch.inference_mode = _Mode
    torch.compile = compile_
    vision = types.ModuleType("torchvision")
    vision.models = types.SimpleNamespace(resnet50=lambda: _Net(log))
    return torch, vision


@pytest.mark.parametrize("compiled", [False, True])
def test_the_contender_is_timed_in_its_precision_and_layout(monkeypatch, compiled):
    log = []
    torch, vision = _fake_torch(log)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    got = gpu.torch_ms("resnet50", (1, 3, 224, 224), repeat=3, precision="fp16", compiled=compiled)
    assert got["ms"] == 2.0 and got["compile_s"] >= 0  # 20 ms per 10 runs
    assert log.count("half") == 2 and log.count(("to", "channels_last")) == 2
    assert (("compile", "reduce-overhead") in log) == compiled
    assert gpu.torch_ms("efficientnet_lite0", (1, 3, 224, 224), 3) is None  # not in torchvision


@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_eager_runs_in_float32_unless_asked_for_tf32(monkeypatch, tf32):
    # PyTorch's default puts cuDNN's float32 convs on TF32 tensor cores (10-bit mantissas): not what tvmfuse's
    # FP32 computes, so the FP32 comparison turns it off and TF32 is a column of its own.
    torch, vision = _fake_torch([])
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    assert gpu.torch_ms("resnet50", (1, 3, 224, 224), repeat=3, tf32=tf32)["ms"] == 2.0
    assert torch.backends.cudnn.allow_tf32 is tf32 and torch.backends.cuda.matmul.allow_tf32 is tf32


def test_a_contender_that_raises_is_reported_in_one_line(monkeypatch):
    torch, vision = _fake_torch([], fail=True)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torchvision", vision)
    got = gpu.torch_ms("resnet50", (1, 3, 224, 224), repeat=3, compiled=True)
    assert got == {"error": "RuntimeError: inductor: no triton"}
