"""Squeeze-and-excitation on uint8 codes (schedules/computes/int8_se.py, x86 rule schedules/x86/codes.py): the mean and
the channel gate kernels bit-exact against their numpy twins, NCHW16c (with a padded last block) on the x86
rule and NCHW on the generic schedule, and the rule's vectors whole."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir

from tvmfuse import targets
from tvmfuse.schedules.computes import int8_se
from tvmfuse.schedules.x86 import codes as rule

from helpers import HOST
from helpers.layout import to_blocked, to_plain

SPEC = targets.resolve(HOST)
ZERO, SCALE, OUT_ZERO = 37, 0.8125, 12


def _run(func, args, out_shape):
    lib = tvm.compile(tvm.IRModule({"main": SPEC.backend().schedule(func).with_attr("global_symbol", "main")}),
                      target=SPEC.tvm_target())
    out = tvm.runtime.tensor(np.zeros(out_shape, "uint8"))
    lib["main"](*[tvm.runtime.tensor(a) for a in args], out)
    return out.numpy()


def _codes(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)


@pytest.mark.parametrize("channels,h,w", [(24, 5, 80), (16, 12, 8), (88, 3, 7)])
@pytest.mark.parametrize("blocked", [True, False], ids=["nchw16c", "nchw"])
def test_gate_matches_numpy(channels, h, w, blocked):
    x = _codes((1, channels, h, w))
    gate = np.random.default_rng(1).uniform(0, 1.2, (1, channels, 1, 1)).astype(np.float32)
    data = to_blocked(x, 16, 200) if blocked else x
    func = int8_se.gate_kernel(data.shape, channels, ZERO, SCALE, OUT_ZERO)
    got = _run(func, [data, gate], data.shape)
    want = int8_se.gate_codes_ref(x, gate, ZERO, SCALE, OUT_ZERO)
    np.testing.assert_array_equal(to_plain(got, channels) if blocked else got, want)


@pytest.mark.parametrize("channels,h,w", [(24, 5, 80), (16, 12, 8), (88, 3, 7)])
@pytest.mark.parametrize("blocked", [True, False], ids=["nchw16c", "nchw"])
def test_mean_matches_numpy(channels, h, w, blocked):
    x = _codes((1, channels, h, w), seed=2)
    data = to_blocked(x, 16, 0) if blocked else x
    out_shape = list(data.shape[:2]) + [1, 1] + list(data.shape[4:])
    func = int8_se.mean_kernel(data.shape, ZERO, SCALE, OUT_ZERO)
    got = _run(func, [data], out_shape)
    want = int8_se.mean_codes_ref(x, ZERO, SCALE, OUT_ZERO)
    np.testing.assert_array_equal(to_plain(got, channels) if blocked else got, want)


def test_codes_round_half_up_and_clip():
    x = np.array([0, 37, 255, 100, 41], np.uint8).reshape(1, 5, 1, 1)
    gate = np.array([1.0, 0.5, 1.0, 0.25, 0.125], np.float32).reshape(1, 5, 1, 1)
    # (q - 37) * g * 2 + 10: -74 -> 0; 10; 446 -> 255; 31.5 + 10 -> 42 (half up); 1 + 10 = 11
    np.testing.assert_array_equal(int8_se.gate_codes_ref(x, gate, 37, 2.0, 10).reshape(-1), [0, 10, 255, 42, 11])


@pytest.mark.parametrize("kernel", ["gate", "mean"])
def test_the_rule_takes_whole_vectors_of_sixteen_channels(kernel):
    """16 channels of a pixel per vector, loaded whole: TVM once built each vector a byte at a time when a
    fused loop or ``nearbyint`` was in the way."""
    shape = (1, 6, 5, 80, 16)
    func = (int8_se.gate_kernel(shape, 88, ZERO, SCALE, OUT_ZERO) if kernel == "gate"
            else int8_se.mean_kernel(shape, ZERO, SCALE, OUT_ZERO))
    sch = s_tir.Schedule(func)
    assert rule.schedule(sch, 16)
    assert "T.vectorized(16)" in sch.mod["main"].script() and "T.parallel" in sch.mod["main"].script()
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    ir = lib.mod.imports[0].inspect_source("ll") if lib.mod.imports else lib.mod.inspect_source("ll")
    assert "load <16 x i8>" in ir and "insertelement <16 x i8>" not in ir
    assert not rule.schedule(s_tir.Schedule(int8_se.gate_kernel((1, 24, 5, 80), 24, 0, 1.0, 0)), 16)  # NCHW: generic
