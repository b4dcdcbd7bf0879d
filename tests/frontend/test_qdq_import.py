"""Quantized ONNX models (QDQ, and QOperator through frontend/qlinear.py) run on tvmfuse's INT8 kernels.

FuseQDQ replaces each ``dequantize -> conv2d/matmul (+bias) [+residual] [act] -> quantize`` chain with one
INT8 kernel built from the model's own scales and zero points. Checked here: the pass before/after, no-match
and refused matches (each with its reason, the chain staying float); op counts of compiled models; numbers:

- hand-built chains against onnxruntime's INT8 output, bit for bit. Their weights are 7-bit (see
  qdq_helpers): onnxruntime's AVX2 u8 x s8 kernel saturates int16 pair sums with full-range weights, where
  ours is exact; with 7-bit weights both compute the exact integer result, so equality is the right bar.
- full-range weights holding -128 against the exact numpy integer reference (schedules/computes/int8_ref.py);
- zoo mobilenet_v2 quantized by onnxruntime's ``quantize_static`` (QDQ and QOperator), against onnxruntime.
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from tvm import relax

import tvmfuse
from helpers import HOST, ort_run
from helpers import conv_relu
from helpers.qdq import X_SCALE, ZERO_POINT, Spec, agreement, op_counts, ort_quantize, output_scale, qdq_model, x_input
from helpers.quantize_graph import call_kinds
from tvmfuse import frontend, targets, zoo
from tvmfuse.passes.canonicalize import CanonicalizeClip
from tvmfuse.passes.int8.epilogues import model_multiplier
from tvmfuse.passes.int8.qdq import FuseQDQ, QDQWarning
from tvmfuse.quant.params import QuantParams
from tvmfuse.schedules.computes import int8, int8_ref

FLOAT_FAMILIES = {"conv2d", "depthwise_conv2d", "dense", "conv2d_nchwc", "depthwise_conv2d_nchwc"}  # FP32 kernels


def _kinds(mod) -> collections.Counter:
    """Calls bound in main, counted by kind (:func:`helpers.quantize_graph.call_kinds`)."""
    return collections.Counter(call_kinds(mod))


def _fuse(model, kept_float: bool = False):
    """The imported module after CanonicalizeClip and FuseQDQ, and FuseQDQ's report. A QDQWarning is expected
    exactly when ``kept_float``."""
    report = {}
    mod = CanonicalizeClip(frontend.import_model(model).mod)
    with targets.resolve(HOST).tvm_target(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", QDQWarning)
        out = FuseQDQ(targets.resolve(HOST), report)(mod)
    assert [w.category for w in caught if w.category is QDQWarning] == ([QDQWarning] if kept_float else [])
    assert relax.analysis.check_well_formed(out)
    return mod, out, report


def _compile_and_compare(model, x):
    """Compile for the host; outputs of tvmfuse and of onnxruntime's INT8 path, and the compiled model."""
    cm = tvmfuse.compile(model, target=HOST)
    return cm.run({"x": x})[0], ort_run(model, {"x": x})[0], cm


# -- the pass --------------------------------------------------------------------------------------------------


def test_conv_chain_becomes_one_int8_kernel_reading_the_codes():
    before, after, report = _fuse(qdq_model(Spec(activation="Relu")))
    assert report == {"int8_kernels": 1, "kept_float": [], "code_pools": 0, "code_squeezes": 0, "residual_adds": 0,
                      "layout_transforms": 0}
    assert _kinds(before)["relax.nn.conv2d"] == 1
    kinds = _kinds(after)
    assert kinds["int8_conv2d"] == 1 and "relax.nn.conv2d" not in kinds and "relax.nn.relu" not in kinds
    # The kernel reads the input's uint8 codes (the quantize of x) and is bound to the output's quantize var.
    main = after["main"]
    bindings = {b.var: b.value for block in main.body.blocks for b in block.bindings}
    call = next(v for v in bindings.values() if isinstance(v, relax.Call) and v.op == tvm.ir.Op.get("relax.call_tir"))
    data = call.args[1].fields[0]
    assert bindings[data].op.name == "relax.quantize" and str(data.ty.dtype) == "uint8"
    kernel = after[call.args[0]]
    assert str(kernel.attrs["tvmfuse.ops"]) == "conv2d,add,relu,requantize"
    assert str(call.ty.dtype) == "uint8"


def test_float_model_is_left_alone():
    before, after, report = _fuse(conv_relu(batch=1))
    assert report == {"int8_kernels": 0, "kept_float": [], "code_pools": 0, "code_squeezes": 0,
                      "residual_adds": 0}  # nothing fused: nothing rewritten
    tvm.ir.assert_structural_equal(before, after)


@pytest.mark.parametrize("spec, reason", [
    (Spec(weight_zero_point=3), "weight zero point is not 0"),
    (Spec(weight_dtype="uint8", weight_zero_point=128), "uint8 weight"),
    (Spec(weight_axis=1), "not per output channel"),
    (Spec(residual=True, activation="Relu", act_before_residual=True), "an add after the residual add or the activation"),
])
def test_refused_chain_stays_float_with_its_reason(spec, reason):
    _, after, report = _fuse(qdq_model(spec), kept_float=True)
    assert report["int8_kernels"] == 0 and len(report["kept_float"]) == 1
    kept = report["kept_float"][0]
    assert kept["op"] == "conv2d" and reason in kept["reason"], kept
    assert _kinds(after)["relax.nn.conv2d"] == 1


def test_refused_when_an_inner_result_is_read_twice():
    model = qdq_model(Spec(activation="Relu"))
    model.graph.output.append(onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, None))
    _, _, report = _fuse(model, kept_float=True)
    # The conv result c (bias added) is also a model output: the importer returns (y, c) as a tuple.
    assert report["int8_kernels"] == 0 and "read by 2 ops" in report["kept_float"][0]["reason"]


def test_a_target_without_int8_kernels_keeps_every_chain_float(monkeypatch):
    from tvmfuse.schedules import cuda

    monkeypatch.setattr(cuda.Backend, "int8_kernels", False)  # a backend that has none (CUDA has, since #51)
    report = {}
    mod = CanonicalizeClip(frontend.import_model(qdq_model(Spec())).mod)
    with pytest.warns(QDQWarning, match="target cuda-sm80 has no INT8 kernels"):
        FuseQDQ(targets.resolve("cuda-sm80"), report)(mod)
    assert report["int8_kernels"] == 0 and "has no INT8 kernels (backend cuda)" in report["kept_float"][0]["reason"]


def test_refused_chain_still_computes_the_model():
    # Weight zero point 3: stays a float conv between quantize/dequantize, as before FuseQDQ existed.
    model = qdq_model(Spec(weight_zero_point=3, activation="Relu"))
    x = x_input(Spec())
    with pytest.warns(QDQWarning, match="weight zero point"):
        got, _, cm = _compile_and_compare(model, x)
    assert cm.record.qdq["int8_kernels"] == 0 and _kinds(cm.mod)["conv2d"] + _kinds(cm.mod)["conv2d_nchwc"] == 1
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the float QDQ semantics
    ref = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    worst, _ = agreement(got, ref, 0.05)
    assert worst <= 1.0  # float sums in another order: at most one code off at a rounding boundary


# -- numbers against onnxruntime's INT8 kernels -----------------------------------------------------------------

CHAINS = {
    "conv_relu": Spec(activation="Relu"),
    "conv_relu6": Spec(activation="Clip", seed=1),
    "depthwise": Spec(group=8, activation="Relu", seed=2),
    "conv_residual_relu": Spec(residual=True, activation="Relu", seed=3),
    "int8_activations": Spec(act_dtype="int8", residual=True, activation="Relu", seed=4),
    "matmul_bias": Spec(op="MatMul", channels=20, seed=5),
    "gemm_relu": Spec(op="Gemm", channels=20, activation="Relu", seed=6),
}
FAMILY = {"Conv": "int8_conv2d", "MatMul": "int8_dense", "Gemm": "int8_dense"}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_chain_matches_onnxruntime_int8_exactly(name):
    spec = CHAINS[name]
    got, ref, cm = _compile_and_compare(qdq_model(spec), x_input(spec))
    family = "int8_depthwise_conv2d" if spec.group > 1 else FAMILY[spec.op]
    kinds = _kinds(cm.mod)
    # A depthwise kernel reads NCHW16c: the quantized model input is transformed once.
    assert cm.record.qdq == {"int8_kernels": 1, "kept_float": [], "code_pools": 0, "code_squeezes": 0,
                             "residual_adds": 0,
                             "layout_transforms": int(spec.group > 1)}
    assert kinds[family] == 1 and not FLOAT_FAMILIES & set(kinds), kinds
    codes = np.rint(got / spec.y_scale) + ZERO_POINT[spec.act_dtype]
    assert 0 < np.mean((codes > 0) & (codes < 255)), "every output saturated: the test would prove nothing"
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("spec", [Spec(activation="Relu", weight_low=-128), Spec(op="Gemm", channels=32)])
def test_avx512_target_compiles_the_chain_to_vnni(spec):
    # Compiled only (this CPU may lack AVX-512): the conv and dense kernels use vpdpbusd, which adds u8 x s8
    # products in int32 and therefore stays exact with weights at -128.
    cm = tvmfuse.compile(qdq_model(spec), target="x86-avx512")
    assert cm.record.qdq["int8_kernels"] == 1
    assert "vpdpbusd" in cm.kernel_source("asm")


def test_depthwise_chain_sums_taps_in_fours_on_avx512():
    # Compiled only: a QDQ depthwise conv gets the VNNI depthwise kernel too (its vpermb transposes 4 pixels;
    # nothing else in this model shuffles bytes); on a VNNI host the exact-match test above runs it.
    asm = tvmfuse.compile(qdq_model(CHAINS["depthwise"]), target="x86-avx512").kernel_source("asm")
    assert "vpermb" in asm and "vpdpbusd" in asm


# -- weights at -128 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["Conv", "MatMul"])
def test_weights_at_minus_128_are_exact(op):
    # Full-range weights, half of them -128, against inputs mostly at code 255: the AVX2 step's extreme pairs.
    spec = Spec(op=op, channels=16, weight_low=-128, y_scale=4.0)
    model = qdq_model(spec)
    x = np.abs(x_input(spec)) * 8
    cm = tvmfuse.compile(model, target=HOST)
    assert cm.record.qdq["int8_kernels"] == 1
    got = cm.run({"x": x})[0]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    w, ws, b = inits["w"], inits["ws"], inits["b"]
    zp = ZERO_POINT["uint8"]
    codes = QuantParams(X_SCALE, zp, "uint8").quantize(x)
    assert (w == -128).mean() > 0.4 and (codes == 255).mean() > 0.5
    m = model_multiplier(X_SCALE, ws, spec.y_scale)
    ep = int8.Epilogue("uint8", zp)
    if op == "Conv":
        want = int8_ref.conv2d_ref(codes, w, b, m, padding=1, input_zero_point=zp, epilogue=ep)
    else:
        want = int8_ref.dense_ref(codes, w.T, b, m, input_zero_point=zp, epilogue=ep)
    assert 0.2 < np.mean((want > 0) & (want < 255)), "outputs saturated: pick another y_scale"
    np.testing.assert_array_equal(np.rint(got / spec.y_scale) + zp, want.astype(np.float32))


# -- zoo mobilenet_v2 quantized by onnxruntime ---------------------------------------------------------------------


def _zoo_inputs(model) -> dict:
    value = model.graph.input[0]
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    return {value.name: np.random.default_rng(7).standard_normal(shape).astype(np.float32)}


def test_zoo_mobilenet_v2_qdq_runs_on_int8_kernels(tmp_path):
    model = ort_quantize(zoo.get("mobilenet_v2"), tmp_path, "qdq")
    assert op_counts(model)["Conv"] == 52 and op_counts(model)["QLinearConv"] == 0
    feeds = _zoo_inputs(model)
    cm = tvmfuse.compile(model, target=HOST)
    kinds = _kinds(cm.mod)
    # Codes stay NCHW16c between the kernels; the 10 residual Adds (DQ, DQ -> Add -> Q) are computed by the
    # projections' kernels, so no codes go back to NCHW; the classifier's global mean runs on codes.
    assert cm.record.qdq == {"int8_kernels": 53, "kept_float": [], "code_pools": 0, "code_squeezes": 1,
                             "residual_adds": 10,
                             "layout_transforms": 0}
    assert (kinds["int8_conv2d"], kinds["int8_depthwise_conv2d"], kinds["int8_dense"]) == (35, 17, 1)
    assert not FLOAT_FAMILIES & set(kinds), kinds
    worst, share = agreement(cm.run(feeds)[0], ort_run(model, feeds)[0], output_scale(model))
    print(f"\nmobilenet_v2 QDQ vs onnxruntime INT8: max abs diff {worst:.0f} output codes, "
          f"{share:.1%} of outputs equal")
    # The conv/dense kernels match onnxruntime bit for bit (test_chain_matches_onnxruntime_int8_exactly);
    # onnxruntime runs the 10 residual Adds (DQ, DQ -> Add -> Q) and the pooling as QLinearAdd /
    # QLinearGlobalAveragePool with their own fixed-point rounding, where tvmfuse computes the QDQ float
    # semantics. Those put some values one code apart, later layers carry the difference along, and the
    # classifier's average over 1280 features leaves the logits within a couple of codes (measured with these
    # seeds: 2 codes, 64% equal; other inputs gave 1 code, 75%). The bound allows that and still fails on any
    # real error (a wrong scale, zero point or layout is off by tens of codes nearly everywhere).
    assert worst <= 3 and share >= 0.5


def test_zoo_mobilenet_v2_qoperator_matches_onnxruntime_exactly(tmp_path):
    # The backbone up to the last conv, so that the output is quantized (its Gemm head would be QGemm, an
    # onnxruntime contrib op). QOperator: every conv a QLinearConv, run by onnxruntime's INT8 kernels; the
    # residual Adds are DQ -> Add -> Q in the model, which onnxruntime would fuse into QLinearAdd (fixed-point,
    # not the float semantics written in the model) unless its QDQ fusions are off: they are, so both
    # runtimes compute the same thing.
    full = onnx.shape_inference.infer_shapes(zoo.get("mobilenet_v2"))
    backbone = onnx.utils.Extractor(full).extract_model([full.graph.input[0].name], ["features.18.2"])
    model = ort_quantize(backbone, tmp_path, "qop", op_types_to_quantize=["Conv", "Clip", "Relu"])
    assert op_counts(model)["QLinearConv"] == 52 and op_counts(model)["Conv"] == 0
    feeds = _zoo_inputs(model)
    cm = tvmfuse.compile(model, target=HOST)
    kinds = _kinds(cm.mod)
    # Adds are left out of the quantization here, so 9 of the 10 residual Adds read or feed float sums (the
    # next block's Add reads the sum itself): only one is DQ, DQ -> Add -> Q, computed by its projection's kernel.
    assert cm.record.qdq == {"int8_kernels": 52, "kept_float": [], "code_pools": 0, "code_squeezes": 0,
                             "residual_adds": 1,
                             "layout_transforms": 4}
    assert (kinds["int8_conv2d"], kinds["int8_depthwise_conv2d"]) == (35, 17) and not FLOAT_FAMILIES & set(kinds)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got, ref = cm.run(feeds)[0], sess.run(None, feeds)[0]
    worst, share = agreement(got, ref, output_scale(model))
    print(f"\nmobilenet_v2 backbone QOperator vs onnxruntime INT8: max abs diff {worst:.0f} output codes, "
          f"{share:.1%} of outputs equal")
    # Same integer arithmetic in every conv (7-bit weights: no saturation; the multiplier in onnxruntime's
    # float32 order, int8_kernels.model_multiplier) and the same float Adds: equal.
    assert worst == 0 and share == 1.0


@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_nchw16c_codes_between_qdq_kernels_change_no_integer(activations, tmp_path):
    """MobileNetV2's inverted residual on 24 channels, quantized by onnxruntime: the default build passes NCHW16c
    codes from kernel to kernel (int8 codes shifted to uint8 on the blocked tensor), the ``layout="nchw"``
    build passes NCHW; every output is equal."""
    from onnxruntime.quantization import QuantType

    from helpers.quantize import inverted_residual

    kind = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}[activations]
    model = ort_quantize(inverted_residual(), tmp_path, "qdq", activation_type=kind)
    blocked, nchw = tvmfuse.compile(model, target=HOST), tvmfuse.compile(model, target=HOST, layout="nchw")
    assert blocked.record.qdq["int8_kernels"] == nchw.record.qdq["int8_kernels"] == 4
    assert nchw.record.qdq["layout_transforms"] == 0 and blocked.record.qdq["layout_transforms"] <= 2
    x = np.random.default_rng(3).standard_normal((1, 8, 10, 10)).astype(np.float32)
    np.testing.assert_array_equal(blocked.run({"x": x})[0], nchw.run({"x": x})[0])
