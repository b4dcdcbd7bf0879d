"""FuseQDQ's tables (``tvmfuse/passes/int8/qdq_tables.py``): the elementwise run ONNX Runtime's quantizer leaves
after a conv (a hardswish spelt out, its own quantize / dequantize pairs between the ops) becomes a table of
output codes in the conv's INT8 kernel, and computes what the float run computed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from helpers import HOST, ORT_U8S8_EXACT, make_model, ort_run
from helpers.qdq import agreement, op_counts, ort_quantize, output_scale
from tvmfuse.passes.int8 import qdq

SHAPE = [1, 8, 12, 12]


def _hardswish(x: str, out: str) -> list:
    """``x * clip(x + 3, 0, 6) / 6`` as PaddlePaddle's exporter writes it."""
    return [helper.make_node("Add", [x, "three"], [f"{out}_a"]),
            helper.make_node("Clip", [f"{out}_a", "zero", "six"], [f"{out}_c"]),
            helper.make_node("Mul", [x, f"{out}_c"], [f"{out}_m"]),
            helper.make_node("Div", [f"{out}_m", "six"], [out])]


def _model(seed: int = 0, tap: bool = False):
    """Conv 3x3 8->16, hardswish, depthwise 5x5, hardswish, global average pool (the pool reads NCHW floats).
    ``tap``: the first hardswish's product is a model output too (the run is then read outside itself)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype("float32") * 0.3, "w1"),
             numpy_helper.from_array(rng.standard_normal(16).astype("float32") * 0.5, "b1"),
             numpy_helper.from_array(rng.standard_normal((16, 1, 5, 5)).astype("float32") * 0.3, "w2"),
             numpy_helper.from_array(rng.standard_normal(16).astype("float32") * 0.5, "b2")]
    inits += [numpy_helper.from_array(np.float32(v), n) for n, v in (("three", 3), ("zero", 0), ("six", 6))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1])] + _hardswish("c1", "h1")
    nodes += [helper.make_node("Conv", ["h1", "w2", "b2"], ["c2"], pads=[2, 2, 2, 2], group=16)]
    nodes += _hardswish("c2", "h2") + [helper.make_node("GlobalAveragePool", ["h2"], ["y"])]
    outputs = [("y", None)] + ([("h1_m", None)] if tap else [])
    return make_model(nodes, [("x", SHAPE)], outputs, inits, opset=13)


def _x(seed: int = 1) -> dict:
    return {"x": (np.random.default_rng(seed).standard_normal(SHAPE) * 2).astype(np.float32)}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):  # 8-bit weights where onnxruntime, the reference, multiplies them exactly
    model = ort_quantize(_model(), tmp_path_factory.mktemp("qdq"), reduce_range=not ORT_U8S8_EXACT)
    assert op_counts(model)["Mul"] == 2 and op_counts(model)["Div"] == 2  # the hardswish stays spelt out
    return model


def _ops(cm) -> set:
    return {op for name, func in cm.mod.functions_items() for op in str((func.attrs or {}).get(
        "tvmfuse.ops", "")).split(",") if op}


def test_the_run_after_each_conv_is_a_table_in_its_kernel(quantized):
    cm = tvmfuse.compile(quantized, target=HOST)
    assert cm.record.qdq["int8_kernels"] == 2 and cm.record.qdq["kept_float"] == []
    names = [gv.name_hint for gv, _ in cm.mod.functions_items() if gv.name_hint.startswith("tvmfuse_int8_qdq")]
    assert len(names) == 2 and all("_table" in n for n in names), names
    kernels = [gv.name_hint for gv, _ in cm.lowered.functions_items()]
    # no kernel of the float run is left (without tables: two fused dequantize_add_quantize_..._multiply ones)
    assert not [n for n in kernels if "multiply" in n or "divide" in n], kernels
    assert {"add", "multiply", "divide"} <= _ops(cm)  # recorded on the INT8 kernels


def test_the_table_computes_what_the_float_run_computed(quantized, monkeypatch):
    x = _x()
    tabled = tvmfuse.compile(quantized, target=HOST).run(x)[0]
    monkeypatch.setattr(qdq, "output_table", lambda *args: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = tvmfuse.compile(quantized, target=HOST, cache=False).run(x)[0]
    scale = output_scale(quantized)
    worst, share = agreement(tabled, plain, scale)
    # each requantization of the run is the float path's, op by op in float32; the float kernel may fuse a
    # multiply and an add into one rounding, which moves a value next to a tie by one code, and the pool
    # averages such steps: a fraction of a code at the output
    assert worst <= 1.0 and share >= 0.9, (worst, share)
    worst, share = agreement(tabled, ort_run(quantized, x)[0], scale)
    assert worst <= 2.0, worst  # onnxruntime fuses its own QLinear ops with fixed-point rounding


def test_a_run_read_outside_itself_ends_where_it_is_read(tmp_path):
    model = ort_quantize(_model(tap=True), tmp_path, reduce_range=not ORT_U8S8_EXACT)
    cm = tvmfuse.compile(model, target=HOST)
    ops = {gv.name_hint.split("_table")[0]: str(func.attrs["tvmfuse.ops"]).split(",")
           for gv, func in cm.mod.functions_items() if gv.name_hint.startswith("tvmfuse_int8_qdq")}
    # the product is a model output: the conv's table stops at its codes, the division after it stays float
    assert ops["tvmfuse_int8_qdq_conv2d_add"][-2:] == ["add", "multiply"], ops
    assert ops["tvmfuse_int8_qdq_depthwise_conv2d_add"][-3:] == ["add", "multiply", "divide"], ops
    assert [gv.name_hint for gv, _ in cm.lowered.functions_items() if "divide" in gv.name_hint]
    x = _x()
    for got, want in zip(cm.run(x), ort_run(model, x)):
        assert agreement(got, want, output_scale(model))[0] <= 2.0


@pytest.mark.any_cpu
def test_cuda_kernels_take_the_tables_too(quantized):
    """Built here with nvcc (the GPU round checks numerics): CUDA's INT8 rule schedules both table kernels."""
    cm = tvmfuse.compile(quantized, target="cuda-sm90")
    assert cm.record.qdq["int8_kernels"] == 2
    scheduled = {gv.name_hint: str(f.attrs["tvmfuse.scheduled_by"]) for gv, f in cm.lowered.functions_items()
                 if gv.name_hint.startswith("tvmfuse_int8_qdq")}
    assert len(scheduled) == 2 and all("_table" in n for n in scheduled), scheduled
    assert set(scheduled.values()) == {"tvmfuse.cuda.int8"}
    assert "table" in cm.kernel_source()
