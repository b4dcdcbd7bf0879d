"""fp16 precision (``compile(precision="fp16")``): the graph in float16 with a float32 interface, every conv and
matmul accumulating in float32, Softmax/LayerNorm/means in float32. Numerics are checked here on the CPU (the
partition kernels unscheduled, built for LLVM, against onnxruntime FP32); CUDA builds are checked for their
rules and source; on a GPU (marker ``gpu``) the zoo runs against onnxruntime."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

import tvmfuse
from helpers import conv_relu, make_model
from helpers.unscheduled import cpu_outputs
from tvmfuse import cli, frontend, zoo
from tvmfuse.comparison import arms, correctness
from tvmfuse.errors import InputError
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes
from tvmfuse.passes.precision import FLOAT32_OPS, ToFloat16
from tvmfuse.passes.utils import bindings_of

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _attention_block():
    """x[1, 8, 16] -> MatMul(16x16) -> Softmax -> LayerNorm -> GlobalAveragePool-like ReduceMean: the float32 ops."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype("float32") * 0.3, "W")
    gamma = numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype("float32"), "G")
    beta = numpy_helper.from_array(rng.standard_normal(16).astype("float32"), "Bt")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Softmax", ["m"], ["s"], axis=-1),
             helper.make_node("LayerNormalization", ["s", "G", "Bt"], ["n"], axis=-1),
             helper.make_node("ReduceMean", ["n"], ["y"], axes=[1], keepdims=1)]
    return make_model(nodes, [("x", [1, 8, 16])], [("y", None)], [w, gamma, beta])


def _cpu_outputs(model, precision: str, inputs: dict, shapes=None) -> list[np.ndarray]:
    """The model's outputs with tvmfuse's graph passes and partition kernels (unscheduled) built for LLVM."""
    return cpu_outputs(model, precision, inputs, shapes)


def _relative(got: list, want: list) -> float:
    num = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in zip(got, want))
    return (num / sum(float(np.sum(np.asarray(w, np.float64) ** 2)) for w in want)) ** 0.5


def test_the_graph_computes_in_float16_with_a_float32_interface():
    imported = frontend.import_model(_attention_block())
    with tvm.target.Target("llvm"), tvm.transform.PassContext(opt_level=3):
        mod = ToFloat16(imported.mod)
    main = mod["main"]
    assert [str(p.ty.dtype) for p in main.params] == ["float32"] and str(main.ret_ty.dtype) == "float32"
    kept = set()
    for binding in bindings_of(main):
        value = binding.value
        constants = [a for a in getattr(value, "args", []) if isinstance(a, tvm.ir.expr.Constant)]
        assert all(str(c.ty.dtype) != "float32" for c in constants)
        op = getattr(getattr(value, "op", None), "name", "")
        if op in FLOAT32_OPS:
            kept.add(op)
            assert all(str(a.ty.dtype) == "float32" for a in value.args if isinstance(a.ty, relax.TensorType))
        elif op in ("relax.matmul", "relax.add"):
            assert str(binding.var.ty.dtype) == "float16", op
    assert kept == {"relax.nn.softmax", "relax.nn.layer_norm", "relax.mean"}


@pytest.mark.parametrize("name", ["tiny_convnet", "mobilenet_v2"])
def test_fp16_zoo_models_match_onnxruntime_fp32(name):
    from helpers import ort_run

    model, shapes = zoo.get(name), zoo.default_shapes(name)
    imported = frontend.import_model(model, shapes)
    rng = np.random.default_rng(0)
    x = {i.name: rng.standard_normal(i.shape).astype("float32") for i in imported.inputs}
    want = ort_run(model, x)
    assert _relative(_cpu_outputs(model, "fp32", x, shapes), want) < 1e-5  # the same path in FP32: exact
    error = _relative(_cpu_outputs(model, "fp16", x, shapes), want)
    assert error <= correctness.FP16_REL, error


def test_constants_past_float16_range_saturate():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype("float32"), "W")
    mask = numpy_helper.from_array(np.array([0, -1e9, 0, 1e9], "float32"), "M")
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "M"], ["y"])],
                       [("x", [1, 4])], [("y", None)], [w, mask])
    x = {"x": rng.standard_normal((1, 4)).astype("float32")}
    (got,) = _cpu_outputs(model, "fp16", x)
    assert np.all(np.isfinite(got)) and got[0, 1] == -np.finfo(np.float16).max and got[0, 3] == np.finfo(np.float16).max


def test_the_float32_ops_keep_their_precision():
    from helpers import ort_run

    model = _attention_block()
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 16)).astype("float32") * 4}
    assert _relative(_cpu_outputs(model, "fp16", x), ort_run(model, x)) <= correctness.FP16_REL


def test_fp16_partition_kernels_read_float16_and_accumulate_in_float32():
    target = tvm.target.Target("llvm")
    mod = run_graph_passes(frontend.import_model("zoo:tiny_convnet").mod, None, target, PassRecord(),
                           blocked=False, precision="fp16")
    kernels = {gv.name_hint: f for gv, f in mod.functions_items() if gv.name_hint.startswith("tvmfuse_")}
    assert len(kernels) == 7
    for name, func in kernels.items():
        text = func.script()
        signature = text.split("def main(", 1)[1].split(")", 1)[0] + ")"
        buffers = re.findall(r'T\.Buffer\(\([^)]*\), "(\w+)"\)', text.split("def main(", 1)[1].split("):\n", 1)[0])
        assert buffers and set(buffers) == {"float16"}, (name, signature)
        assert "T.float32(0.0)" in text, name  # the accumulator starts in float32
        assert 'T.Cast("float32", p' in text and "widen_fp32" not in text, name  # operands widened in place


@needs_nvcc
def test_an_fp16_cuda_build_puts_every_partition_on_a_tvmfuse_rule(tmp_path):
    cm = tvmfuse.compile("zoo:mobilenet_v2", target="cuda-sm90", precision="fp16", logs=False)
    manifest = cm.manifest()
    assert manifest["precision"] == "fp16" and manifest["cuda_code"] == "binary"
    partitions = {k: v for k, v in manifest["scheduled_by"].items() if k.startswith("tvmfuse_")}
    assert partitions and all(v.startswith("tvmfuse.cuda.") for v in partitions.values()), partitions
    source = cm.executable.mod.imports[0].imports[0].inspect_source()
    # operands in float16 (shared-memory tiles too), accumulators in float32: the depthwise kernels' registers,
    # the tensor cores' fragments (conv2d and dense, tests/schedules/test_cuda_tensor_core.py)
    assert "half* __restrict__ p0_ptr" in source and "__shared__ alignas(64) half" in source
    assert re.search(r"float DepthwiseConv2d\w*_local_ptr\[", source)
    assert "nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>" in source
    assert [i.dtype for i in cm.inputs] == ["float32"] and [o.dtype for o in cm.outputs] == ["float32"]


def test_cpu_targets_refuse_fp16_in_one_line():
    with pytest.raises(InputError, match=r"^precision fp16 is not built for target x86-host \(backend x86: fp32\)$"):
        tvmfuse.compile(conv_relu(batch=1), target="x86-host", precision="fp16")
    with pytest.raises(InputError, match=r"^precision 'bf16' is not one of fp32, fp16$"):
        tvmfuse.compile(conv_relu(batch=1), target="cuda-sm90", precision="bf16")


def test_the_cli_and_compare_arms_take_fp16(tmp_path, capsys):
    assert cli.main(["compile", "zoo:tiny_convnet", "--target", "x86-host", "--precision", "fp16",
                     "-o", str(tmp_path / "m.so")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "precision fp16 is not built for target x86-host" in err[0]
    assert not (tmp_path / "m.so").exists()
    assert arms.parse_arm("cuda-sm90:fp16").precision == "fp16"
    with pytest.raises(InputError, match="target x86-host does not build fp16"):
        arms.parse_arm("x86-host:fp16")


@pytest.mark.gpu
@pytest.mark.parametrize("name", zoo.names())
def test_fp16_zoo_on_the_gpu_matches_onnxruntime(name):
    from helpers import ort_run

    model, shapes = zoo.get(name), zoo.default_shapes(name)
    cm = tvmfuse.compile(model, target="cuda-sm90", shapes=shapes, precision="fp16")
    rng = np.random.default_rng(0)
    x = {i.name: rng.standard_normal(i.shape).astype("float32") for i in cm.inputs}
    error = _relative(cm.run(x), ort_run(model, x))
    assert error <= correctness.FP16_REL, error


def test_a_clip_open_on_one_side_builds_in_fp16():
    # Conv -> Clip(-1, 2): the lower bound joins the conv's epilogue and a clip bounded above only (below by
    # float32's largest value) stays outside; TVM refused that bound as a float16 literal (fuzz seed 2).
    from helpers import ort_run
    from tvmfuse.fuzz import graphs

    from tvmfuse.fuzz.check import random_inputs

    model = graphs.random_cnn(2)
    x = random_inputs(model)
    assert [n.op_type for n in model.graph.node][:2] == ["Conv", "Clip"]
    error = _relative(_cpu_outputs(model, "fp16", x), ort_run(model, x))
    assert error <= correctness.FP16_REL, error


def test_a_dynamically_quantized_conv_computes_in_float16(tmp_path):
    # quantize_dynamic's Conv: codes cast to float (uint8 -> float32 in the graph) meet float16 weights; the
    # 8-bit codes join the float16 graph exactly (a float32 conv input there was a type error before).
    import onnx

    quantization = pytest.importorskip("onnxruntime.quantization")
    from helpers import ort_run

    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(conv_relu(batch=1), src)
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    model = onnx.load(dst)
    assert "ConvInteger" in {n.op_type for n in model.graph.node}
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = {model.graph.input[0].name: np.random.default_rng(0).standard_normal(shape).astype("float32")}
    error = _relative(_cpu_outputs(model, "fp16", x), ort_run(model, x))
    assert error <= correctness.FP16_REL, error


def test_a_one_hot_mask_joins_the_float16_graph():
    # Magika's token embedding: Equal(tokens, range) -> Cast(float) -> MatMul(table). The mask's 0/1 are exact in
    # float16; kept float32 it met the float16 table in a type error.
    from onnx import TensorProto

    from helpers import ort_run

    table = np.random.default_rng(1).standard_normal((9, 4)).astype("float32")
    nodes = [helper.make_node("Unsqueeze", ["t", "axis"], ["t2"]),
             helper.make_node("Equal", ["t2", "ids"], ["hot"]),
             helper.make_node("Cast", ["hot"], ["hotf"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["hotf", "table"], ["y"])]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axis"),
             numpy_helper.from_array(np.arange(9, dtype=np.int32), "ids"),
             numpy_helper.from_array(table, "table")]
    graph = helper.make_graph(nodes, "onehot", [helper.make_tensor_value_info("t", TensorProto.INT32, [1, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = {"t": np.array([[0, 3, 8, 2, 2, 5]], np.int32)}
    error = _relative(_cpu_outputs(model, "fp16", x), ort_run(model, x))
    assert error <= correctness.FP16_REL, error


def test_importer_kernels_and_float_casts_join_the_float16_graph():
    # Silero VAD: a reflect Pad (which TVM's importer writes as its own float32 kernel) and a Cast(to=float) of a
    # float tensor; the first read float16 in a float32 kernel, the second kept float32 beside float16 constants.
    from onnx import TensorProto

    from helpers import ort_run

    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
             helper.make_node("Cast", ["p"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Pow", ["c", "two"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0, 0, 3, 0, 0, 3], np.int64), "pads"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    model = make_model(nodes, [("x", [1, 2, 16])], [("y", None)], inits)
    x = {"x": np.random.default_rng(2).standard_normal((1, 2, 16)).astype("float32")}
    error = _relative(_cpu_outputs(model, "fp16", x), ort_run(model, x))
    assert error <= correctness.FP16_REL, error
