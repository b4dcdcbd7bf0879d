"""Profiles on the compare page: every kernel's share within 0..100% of the measured latency, the shares adding
up to at most 100% ("unattributed" never negative), whatever the profiler's own overhead; INT8 kernels list the
ops they fuse."""

from __future__ import annotations

import numpy as np
import pytest

from tvmfuse.comparison import contenders
from tvmfuse.passes import kernel_names

from helpers import conv_relu


def _rows(*us):
    return [{"name": f"k{i}", "kind": "conv", "us": u, "flops": 2e6, "bytes": 0} for i, u in enumerate(us)]


def check_shares(profile: dict) -> None:
    """The page's invariants: fails on a share over 100% or below 0, or kernels past the latency."""
    shares = [k["share"] for k in profile["kernels"]]
    assert all(0.0 <= s <= 1.0 for s in shares), shares
    assert sum(shares) <= 1.0 + 1e-9
    assert 0.0 <= profile["unattributed_us"] <= profile["end_to_end_us"] + 1e-9
    assert sum(k["us"] for k in profile["kernels"]) <= profile["end_to_end_us"] * (1 + 1e-9)


def test_a_profiler_slower_than_the_timed_runs_keeps_shares_within_the_latency():
    # onnxruntime's Conv once read 137% of the latency: its profiled session ran slower than the timed one
    p = contenders._profile(_rows(137.0, 13.0), end_to_end_us=100.0, runs=5, source="x", profiled_us=160.0)
    check_shares(p)
    assert [k["share"] for k in p["kernels"]] == pytest.approx([137 / 160, 13 / 160])
    assert p["unattributed_us"] == pytest.approx(100 * 10 / 160)
    assert p["kernels"][0]["profiled_us"] == 137.0 and p["kernels"][0]["us"] == pytest.approx(100 * 137 / 160)
    assert p["kernels"][0]["gflops"] == pytest.approx(2e6 / (p["kernels"][0]["us"] * 1e3))
    # kernels that add up to more than the profiled run's own wall time (threads overlapping): shares of their sum
    p = contenders._profile(_rows(90.0, 60.0), end_to_end_us=100.0, runs=5, source="x", profiled_us=120.0)
    check_shares(p)
    assert p["unattributed_us"] == pytest.approx(0.0, abs=1e-9)


def test_the_check_fails_on_a_share_past_100_percent():
    bad = {"kernels": [{"share": 1.37, "us": 137.0}], "end_to_end_us": 100.0, "unattributed_us": -37.0}
    with pytest.raises(AssertionError):
        check_shares(bad)


def test_onnxruntimes_profile_adds_up_to_at_most_its_latency():
    pytest.importorskip("onnxruntime")
    model = conv_relu(batch=1)
    ort = contenders.OnnxRuntimeContender("onnxruntime", model.SerializeToString(), threads=2)
    profile = ort.profile({"x": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")}, 20)
    check_shares(profile)
    assert {k["kind"] for k in profile["kernels"]} >= {"Conv"}


def test_int8_kernels_list_the_ops_they_fuse():
    import tvmfuse
    from tvmfuse.comparison.arms import kernel_info

    cm = tvmfuse.quantize("zoo:tiny_convnet", calib=[{"input": np.random.default_rng(0).standard_normal(
        (1, 3, 32, 32)).astype("float32")}], method="minmax")
    info = kernel_info(cm)
    int8 = {name: k for name, k in info.items() if k["kind"].startswith("int8_")}
    assert int8
    for name, k in int8.items():
        ops = k["fused_ops"]  # e.g. conv2d, add, relu, requantize: not the kernel's own name again
        assert ops != [kernel_names.kind(name)] and ops[-1] in ("requantize", "dequantize"), (name, k)
        assert k["partition"].startswith("tvmfuse.")
