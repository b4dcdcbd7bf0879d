"""bench/map_sizes.py: the model it builds, the kernel it times, the cliffs it flags, and its table."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import map_sizes  # noqa: E402
from helpers import HOST  # noqa: E402


def test_the_model_is_a_conv_after_a_1x1_conv_with_the_asked_output_size():
    import onnxruntime as ort

    model = map_sizes.conv_model(8, 16, 3, 2, 1, 11)
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.ones((1, 8, 11, 11), np.float32)})
    assert y.shape == (1, 16, map_sizes.out_size(11, 3, 2), map_sizes.out_size(11, 3, 2)) == (1, 16, 6, 6)
    assert map_sizes.gflop(8, 16, 3, 2, 1, 11) == pytest.approx(2 * 8 * 16 * 9 * 36 / 1e9)
    assert map_sizes.gflop(16, 16, 3, 1, 16, 8) == pytest.approx(2 * 1 * 16 * 9 * 64 / 1e9)  # depthwise


def test_a_size_under_60_percent_of_the_median_is_a_cliff():
    cliffs = map_sizes.flag_cliffs({28: 200.0, 27: 190.0, 29: 210.0, 73: 110.0, 75: 205.0})
    assert cliffs == {28: False, 27: False, 29: False, 73: True, 75: False}


def test_the_table_times_the_second_conv_at_every_size(capsys):
    assert map_sizes.main(["--conv", "16,32,3,1,1", "--sizes", "9/10", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "| conv | 9 | 10 |"
    row = lines[3].split("|")
    assert row[1].strip() == "16,32,3,1,1" and all(float(c.strip().rstrip("!")) > 0 for c in row[2:4])


def test_the_kernel_timed_is_the_asked_conv_not_the_1x1_before_it():
    import tvmfuse

    cm = tvmfuse.compile(map_sizes.conv_model(16, 32, 3, 2, 1, 12), target=HOST, logs=False)
    name = map_sizes.target_kernel(cm, 16, 32, 3, 2)
    prof = map_sizes.bench_profile()
    assert prof._anchor_row(name, 1.0, 1, cm)["op"].startswith("16->32 3x3 s2")
    with pytest.raises(LookupError):
        map_sizes.target_kernel(cm, 16, 32, 5, 1)
    dw = tvmfuse.compile(map_sizes.conv_model(16, 16, 3, 1, 16, 12), target=HOST, logs=False)
    assert "depthwise" in map_sizes.target_kernel(dw, 16, 16, 3, 1, 16)


def test_a_bad_conv_spec_is_a_usage_error():
    with pytest.raises(SystemExit) as e:
        map_sizes.main(["--conv", "16,32,3"])
    assert e.value.code == 2


def test_the_profile_waits_for_a_gpu_around_every_call():
    # bench/profile.py on a CUDA target: launches are asynchronous, so each call's time is taken between two
    # waits for the device (checked here with a stand-in runner: the order of waits and calls).
    prof = map_sizes.bench_profile()
    events = []

    class Dev:
        def sync(self):
            events.append("sync")

    class VM:
        hook = None

        def set_instrument(self, hook):
            VM.hook = hook

    class Runner:
        device_name, _dev, _vm = "cuda", Dev(), VM()

        def run_whole_pool(self, x):
            for kernel in ("k1", "k2"):
                VM.hook(None, kernel, True, None)
                events.append(kernel)
                VM.hook(None, kernel, False, None)

    class Compiled:
        inputs = []

        def _get_runner(self):
            return Runner()

    times = prof.kernel_times(Compiled(), runs=3, warmup=0)
    assert {k: len(v) for k, v in times.items()} == {"k1": 3, "k2": 3}
    assert events[:6] == ["sync", "k1", "sync", "sync", "k2", "sync"]
    assert VM.hook(None, "k1", True, None) == 0 and len(events) == 18  # the hook removed after


def test_the_profile_rows_a_quantized_kernel_by_its_reduction():
    """bench/profile.py --int8: a quantized kernel has no FP32 partition record; its row counts the multiply-adds
    of its reduction block (3x3, 16 -> 32 channels on 12x12: 663,552, the packed layout's split loops
    multiplied back)."""
    import tvmfuse

    with pytest.warns(UserWarning):
        cm = tvmfuse.quantize(map_sizes.conv_model(16, 32, 3, 1, 1, 12), calib="random:1", method="minmax",
                              target="x86-avx512", logs=False)
    prof = map_sizes.bench_profile()
    names = [gv.name_hint for gv in cm.mod.functions if gv.name_hint.startswith("tvmfuse_int8_conv2d")]
    rows = [prof._int8_row(n, 1e-6, 1, cm) for n in names]  # a microsecond a call
    big = next(r for r in rows if r["op"] == "conv2d_int8: 0.7 M multiply-adds")
    assert big["GFLOP/s"] == "1327" and big["layout"].endswith("uint8")  # 2 * 663,552 per microsecond
    assert prof._int8_row("tvmfuse_conv2d_x", 1.0, 1, cm) is None  # an FP32 kernel's row is _anchor_row's
