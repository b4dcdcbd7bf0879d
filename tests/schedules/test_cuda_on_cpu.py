"""The CUDA rules' schedules run on the CPU (``tvmfuse.fuzz.cuda_cpu``: thread bindings made serial loops, shared,
local and fragment buffers global, LLVM) against their kernels unscheduled: every rule over the grid of
``test_cuda_rules`` in FP32 and fp16 (the tensor-core GEMMs scheduled without their final tensorize steps), the
fp16 depthwise's channel pairs and the INT8 GEMM's tiles with every candidate offline tuning offers, every INT8
kernel case of ``test_cuda_int8`` bit-exact against ``int8_ref``. What needs threads running at once (races,
the wmma instructions themselves, nvcc's code) is the GPU round's (marker ``gpu`` elsewhere)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from tvm import s_tir, tirx

from tvmfuse.fuzz.cuda_cpu import block_orders, mismatch, relative_mismatch, serial
from helpers.int8_kernels import run
from tvmfuse import frontend, targets
from tvmfuse.passes.pipeline import fused_module, run_graph_passes
from tvmfuse.schedules import cuda
from tvmfuse.schedules.cuda import depthwise_conv2d
from tvmfuse.schedules.cuda.tensor_core import untensorized
from tvmfuse.schedules.cuda import int8 as int8_rule

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_int8 import CASES as INT8_CASES  # noqa: E402
from test_cuda_int8 import SMS, Conv, _conv, _scheduled  # noqa: E402
from test_cuda_rules import CASES, DEPTHWISE, IDS, _model, conv_model  # noqa: E402

TARGET = "cuda-sm90"


def _kernel(model, precision: str):
    """The partition kernel of a one-op model for ``TARGET``, unscheduled."""
    spec = targets.resolve(TARGET)
    target = spec.tvm_target()
    spec.backend()
    mod = fused_module(run_graph_passes(frontend.import_model(model).mod, spec, target, precision=precision),
                       spec, target)
    (func,) = [f for gv, f in mod.functions_items()
               if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith("tvmfuse_")]
    return func


@pytest.fixture(name="untensorized")
def _untensorized():
    with untensorized():
        yield


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("kind,case", CASES, ids=IDS)
def test_every_cuda_rule_computes_its_kernel(kind, case, precision, untensorized):
    model, rule = _model(kind, case)
    func = _kernel(model, precision)
    sch, name = cuda.scheduled(func, str(func.attrs["tvmfuse.family"]), SMS)
    assert f"tvmfuse.cuda.{name}" == rule, name
    # A GEMV (a warp per output) and a GEMM whose K is split over warp groups sum in another order than the
    # unscheduled loop: float rounding differs there (fp16: about one unit in the last place of the output).
    bound = 0.0 if kind == "depthwise" else 1e-5 if precision == "fp32" else 1e-3
    assert relative_mismatch(func, sch.mod["main"]) <= bound


@pytest.mark.parametrize("case", [pytest.param(DEPTHWISE[2], marks=pytest.mark.slow), DEPTHWISE[5], DEPTHWISE[-1]],
                         ids=lambda c: "-".join(map(str, c)))  # the 56x56 map's 20 s of candidates: -m slow
def test_every_fp16_depthwise_candidate_computes_its_kernel(case):
    # The tiles offline tuning times (one and two channels a thread, every strip and block size): each is
    # bit-exact, as the sums keep their order.
    c, hw, k, s, d, e = case
    func = _kernel(conv_model(c, c, hw, k, s, d, group=c, epilogue=e), "fp16")
    configs = depthwise_conv2d.kernel_candidates(func, SMS)
    assert configs[0].pairs == 2 and {cfg.pairs for cfg in configs} == {1, 2}
    for config in configs:
        sch = s_tir.Schedule(func)
        assert depthwise_conv2d.schedule(sch, SMS, config)
        assert mismatch(func, sch.mod["main"]) == 0, config


def test_an_offset_wrong_by_one_is_seen():
    # The check itself: the scheduled kernel with one tap's input column moved by one differs.
    c, hw, k, s, d, e = DEPTHWISE[2]
    func = _kernel(conv_model(c, c, hw, k, s, d, group=c, epilogue=e), "fp16")
    sch = s_tir.Schedule(func)
    assert depthwise_conv2d.schedule(sch, SMS)
    text = sch.mod["main"].script()
    assert "v_j + v_dj, v_c % 2]" in text  # the tap's column in the interleaved tile (the read and its region)
    import tvm

    broken = tvm.script.from_source(text.replace("v_j + v_dj, v_c % 2]", "v_j + v_dj // 2, v_c % 2]"))
    assert mismatch(func, broken["main"] if isinstance(broken, tvm.IRModule) else broken) > 0


@pytest.mark.parametrize("make,case,tabled", INT8_CASES)
def test_every_int8_schedule_is_bit_exact_on_the_cpu(make, case, tabled, untensorized):
    # The tensor-core GEMMs (shifted s8 x s8), the GEMVs and the depthwise, tables of output codes included; the
    # blocks in order and in reverse.
    func, out, args, ref = make(case, tabled=tabled)
    scheduled = _scheduled(func)
    np.testing.assert_array_equal(run(serial(scheduled), args, out), ref)
    backward = serial(scheduled, reverse_blocks=True)
    np.testing.assert_array_equal(run(backward, block_orders(backward) + args, out), ref)


def test_every_int8_tensor_core_candidate_is_bit_exact_on_the_cpu(untensorized):
    # Every tile offline tuning would time on a GPU (K split over warp groups included), before it gets there.
    func, out, args, ref = _conv(Conv(64, 64, 28, 3, pad=1, act="relu", residual="uint8"))
    configs = int8_rule.kernel_candidates(func, SMS)
    assert len(configs) > 10 and any(c.warps_k > 1 for c in configs)
    for config in configs:
        np.testing.assert_array_equal(run(serial(_scheduled(func, config)), args, out), ref, err_msg=str(config))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_channel_multiplier_keeps_one_channel_a_thread(precision):
    # 6 input channels, 12 outputs (fuzz seed 12's depthwise): a pair of output channels reads one input channel,
    # so the interleaved tile does not apply (its layout took 3 input channels as pairs and failed to build).
    import dataclasses

    func = _kernel(conv_model(6, 12, 12, 3, group=6, epilogue="relu"), precision)
    configs = depthwise_conv2d.kernel_candidates(func, SMS)
    assert configs and {c.pairs for c in configs} == {1}
    assert not depthwise_conv2d.schedule(s_tir.Schedule(func), SMS, dataclasses.replace(configs[0], pairs=2))
    sch = s_tir.Schedule(func)
    assert depthwise_conv2d.schedule(sch, SMS)
    assert mismatch(func, sch.mod["main"]) == 0
