"""What ONNX Runtime's quantizer writes after a QDQ chain's quantize, computed on codes (passes/int8/qdq_after.py):
a residual add of two dequantized tensors, quantized again, inside the producing conv's kernel; a max-pool
between quantizes of the same parameters on the codes themselves.

Each model's output is the dequantized codes of the op under test, checked against a numpy reference of the
model as ONNX defines it: the convs' exact integer sums requantized as the INT8 kernels do (equal to
onnxruntime's QLinearConv, test_qdq_import.py), DequantizeLinear and Add in float32 (each product and the sum
rounded once), QuantizeLinear as ``saturate(round_half_even(x / scale) + zero_point)``. Where the add stays float
(a model the kernel cannot take) TVM's float kernel may fuse a product into the add, one rounding fewer, which
moves a sum lying next to a rounding tie by one code: those compare within a code. Against onnxruntime the
outputs agree within a code too (its QLinearAdd rounds in fixed point, and with its QDQ fusions off it runs the
convs in float).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from helpers import HOST, ort_run
from tvmfuse.passes.int8.epilogues import model_multiplier
from tvmfuse.schedules.computes import int8, int8_ref

CHANNELS = 16


RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def _init(value, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _quantize(v, scale, zero_point, codes):
    return np.clip(np.rint(v / np.float32(scale)) + zero_point, *RANGE[codes]).astype(codes)


def _dequantize(q, scale, zero_point):
    return (q.astype(np.int32) - zero_point).astype(np.float32) * np.float32(scale)


class _Graph:
    """An ONNX graph written as ONNX Runtime's quantizer writes it (every tensor between ops quantized), and its
    reference values for the input ``x`` (:data:`X`): ``value`` float32 per tensor, ``quantized`` (codes, scale,
    zero point) per dequantized tensor."""

    def __init__(self, codes: str = "uint8", seed: int = 0):
        self.rng, self.codes, self.nodes, self.inits, self.params_of = np.random.default_rng(seed), codes, [], [], {}
        self.value, self.quantized = {"x": X}, {}

    def params(self, scale: float, zero_point: int) -> tuple[str, str]:
        s, z = f"s{len(self.params_of)}", f"z{len(self.params_of)}"
        self.params_of[(s, z)] = (scale, zero_point)
        self.inits += [_init(np.float32(scale), s), _init(np.array(zero_point, self.codes), z)]
        return s, z

    def qdq(self, x: str, params: tuple[str, str], name: str, dq_params: tuple[str, str] | None = None) -> str:
        """``x`` quantized with ``params`` and dequantized again (with ``dq_params`` when given)."""
        self.nodes += [helper.make_node("QuantizeLinear", [x, *params], [name + "_q"]),
                       helper.make_node("DequantizeLinear", [name + "_q", *(dq_params or params)], [name])]
        codes = _quantize(self.value[x], *self.params_of[params], self.codes)
        scale, zero_point = self.params_of[dq_params or params]
        self.quantized[name] = (codes, scale, zero_point)
        self.value[name] = _dequantize(codes, scale, zero_point)
        return name

    def conv(self, x: str, out: tuple[str, str], name: str, k: int = 3, channels: int = CHANNELS, **qdq) -> str:
        """A quantized conv of ``x`` (dequantized codes) to ``channels``, quantized to ``out``."""
        codes, x_scale, x_zero = self.quantized[x]
        w = self.rng.integers(-64, 65, (channels, codes.shape[1], k, k)).astype(np.int8)
        ws = (0.01 * (1 + self.rng.random(channels))).astype(np.float32)
        bias = self.rng.integers(-2000, 2000, channels).astype(np.int32)
        self.inits += [_init(w, name + "_w"), _init(ws, name + "_ws"), _init(np.zeros(channels, np.int8), name + "_wz"),
                       _init(bias, name + "_b"), _init((np.float32(x_scale) * ws).astype(np.float32), name + "_bs"),
                       _init(np.zeros(channels, np.int32), name + "_bz")]
        self.nodes += [helper.make_node("DequantizeLinear", [name + "_w", name + "_ws", name + "_wz"], [name + "_wd"],
                                        axis=0),
                       helper.make_node("DequantizeLinear", [name + "_b", name + "_bs", name + "_bz"], [name + "_bd"],
                                        axis=0),
                       helper.make_node("Conv", [x, name + "_wd", name + "_bd"], [name + "_c"], pads=[k // 2] * 4)]
        # the conv's codes as the INT8 kernels and onnxruntime's QLinearConv compute them: exact sums, one
        # float32 multiplier; the reference's float value before the quantize is the codes' own value
        s_y, z_y = self.params_of[out]
        y = int8_ref.conv2d_ref(codes, w, bias, model_multiplier(x_scale, ws, s_y), padding=k // 2,
                                input_zero_point=x_zero, epilogue=int8.Epilogue(self.codes, z_y))
        self.value[name + "_c"] = _dequantize(y, s_y, z_y)
        return self.qdq(name + "_c", out, name, **qdq)

    def add(self, a: str, b: str, name: str) -> str:
        self.nodes.append(helper.make_node("Add", [a, b], [name]))
        self.value[name] = self.value[a] + self.value[b]
        return name

    def relu(self, x: str, name: str) -> str:
        self.nodes.append(helper.make_node("Relu", [x], [name]))
        self.value[name] = np.maximum(self.value[x], np.float32(0))
        return name

    def max_pool(self, x: str, name: str) -> str:
        """3x3, stride 2, padding 1."""
        self.nodes.append(helper.make_node("MaxPool", [x], [name], kernel_shape=[3, 3], strides=[2, 2],
                                           pads=[1, 1, 1, 1]))
        padded = np.pad(self.value[x], ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
        self.value[name] = windows.max(axis=(4, 5))
        return name

    def mean(self, x: str, name: str) -> str:
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], [name]))
        self.value[name] = self.value[x].mean(axis=(2, 3), keepdims=True, dtype=np.float32)
        return name

    def concat(self, parts: list, name: str) -> str:
        self.nodes.append(helper.make_node("Concat", parts, [name], axis=1))
        self.value[name] = np.concatenate([self.value[p] for p in parts], axis=1)
        return name

    def mul(self, a: str, b: str, name: str) -> str:
        self.nodes.append(helper.make_node("Mul", [a, b], [name]))
        self.value[name] = self.value[a] * self.value[b]
        return name

    def model(self, outputs: list[str]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "qdq_after", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                          list(X.shape))],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                                  self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


X = (np.random.default_rng(1).standard_normal((1, CHANNELS, 10, 10)) * 2.5).astype(np.float32)


def _residual_model(codes="uint8", relu=False, convs=1, sum_read_twice=False, dq_params=False) -> tuple:
    """x -> Q/DQ -> conv -> Q -> DQ (``dq_params``: with parameters of its own) -> Add (DQ of x's codes, or of a
    second conv's with ``convs=2``) [-> Relu] -> Q -> DQ: the model and the reference of its outputs."""
    g = _Graph(codes)
    zero = 128 if codes == "uint8" else 3
    x = g.qdq("x", g.params(0.05, zero), "xd")
    y = g.conv(x, g.params(0.04, zero - 7), "a", dq_params=g.params(0.041, zero - 6) if dq_params else None)
    other = g.conv(x, g.params(0.05, zero + 5), "b") if convs == 2 else x
    last = g.add(y, other, "sum")
    if relu:
        last = g.relu(last, "sum_relu")
    out = g.qdq(last, g.params(0.06, 100 if codes == "uint8" else -28), "s")
    outputs = [out] + (["sum"] if sum_read_twice else [])
    return g.model(outputs), [g.value[o] for o in outputs]


def _compare(model, ref):
    """tvmfuse's build of ``model``; the largest difference of its outputs from ``ref`` and from onnxruntime's, in
    codes of the first output."""
    cm = tvmfuse.compile(model, target=HOST)
    got, ort_out = cm.run({"x": X}), ort_run(model, {"x": X})
    scale = 0.06
    assert len(np.unique(ref[0])) > 30  # spread over many codes, not saturated
    to_ref = max(float(np.abs(a - b).max()) for a, b in zip(got, ref)) / scale
    to_ort = max(float(np.abs(a - b).max()) for a, b in zip(got, ort_out)) / scale
    return cm, round(to_ref, 3), round(to_ort, 3)


@pytest.mark.parametrize("codes,relu", [("uint8", False), ("uint8", True), ("int8", True)])
def test_residual_add_after_the_quantize_runs_in_the_conv_kernel(codes, relu):
    cm, to_ref, to_ort = _compare(*_residual_model(codes, relu))
    assert cm.record.qdq["residual_adds"] == 1 and cm.record.qdq["int8_kernels"] == 1
    assert cm.record.qdq["layout_transforms"] == 0 and not cm.record.qdq["kept_float"]
    assert [g for g in cm.mod.get_global_vars() if "dequantize_add" in g.name_hint], "no kernel with the add"
    assert not [g for g in cm.mod.get_global_vars() if g.name_hint.startswith("fused_") and "add" in g.name_hint]
    assert to_ref == 0 and to_ort <= 1


def test_an_add_of_two_convs_runs_in_one_of_them():
    cm, to_ref, to_ort = _compare(*_residual_model(convs=2, relu=True))
    assert cm.record.qdq["residual_adds"] == 1 and cm.record.qdq["int8_kernels"] == 2
    assert cm.record.qdq["layout_transforms"] == 0  # the other conv writes its codes NCHW16c for the add
    assert to_ref == 0 and to_ort <= 1


@pytest.mark.parametrize("case", ["sum_read_twice", "dq_params"])
def test_an_add_the_kernel_cannot_take_stays_float(case):
    cm, to_ref, to_ort = _compare(*_residual_model(**{case: True}))
    assert cm.record.qdq["residual_adds"] == 0 and cm.record.qdq["int8_kernels"] == 1
    assert to_ref <= 1 and to_ort <= 1


def _pool_model(same_params=True) -> tuple:
    """x -> Q/DQ -> conv -> Q -> DQ -> MaxPool 3x3 s2 (padded) -> Q -> DQ -> 1x1 conv (the second output: the
    pool's own dequantized codes)."""
    g = _Graph()
    x = g.qdq("x", g.params(0.05, 128), "xd")
    y_params = g.params(0.04, 100)
    p = g.qdq(g.max_pool(g.conv(x, y_params, "a"), "p"), y_params if same_params else g.params(0.045, 90), "pd")
    out = g.conv(p, g.params(0.06, 128), "c", k=1)
    return g.model([out, p]), [g.value[out], g.value[p]]


@pytest.mark.parametrize("same_params", [True, False])
def test_max_pool_between_quantizes_pools_the_codes(same_params):
    cm, to_ref, to_ort = _compare(*_pool_model(same_params))
    assert cm.record.qdq["code_pools"] == int(same_params) and cm.record.qdq["int8_kernels"] == 2
    pools = [g.name_hint for g in cm.mod.get_global_vars() if g.name_hint.startswith("max_pool2d_codes")]
    assert len(pools) == int(same_params), pools
    assert to_ref == 0 and to_ort == 0


def _squeeze_model() -> tuple:
    """A squeeze-and-excitation block as ONNX Runtime's quantizer writes it: x -> Q/DQ -> conv -> Q -> DQ (y);
    GlobalAveragePool (y) -> Q/DQ -> 1x1 conv -> Q/DQ (the gate); y * gate -> Q -> DQ -> 1x1 conv."""
    g = _Graph()
    x = g.qdq("x", g.params(0.05, 128), "xd")
    y = g.conv(x, g.params(0.04, 100), "a")
    squeezed = g.qdq(g.mean(y, "m"), g.params(0.01, 120), "md")
    gate = g.conv(squeezed, g.params(0.02, 40), "fc", k=1)
    product = g.qdq(g.mul(y, gate, "p"), g.params(0.05, 110), "pd")
    out = g.conv(product, g.params(0.06, 128), "c", k=1)
    return g.model([out, product]), [g.value[out], g.value[product]]


def test_a_squeeze_and_excitation_block_runs_on_codes():
    cm, to_ref, to_ort = _compare(*_squeeze_model())
    assert cm.record.qdq["code_squeezes"] == 2 and cm.record.qdq["int8_kernels"] == 3
    names = [g.name_hint for g in cm.mod.get_global_vars()]
    assert any(n.startswith("mean_codes") for n in names) and any(n.startswith("gate_codes") for n in names)
    # the kernels round halves up (int8_se), QuantizeLinear to even; the mean sums exactly, then scales once
    assert to_ref <= 1 and to_ort <= 1


def _concat_model(channels: int) -> tuple:
    """Two quantized convs to ``channels`` each (one in the concat's own parameters, one not) -> Concat -> Q -> DQ ->
    1x1 conv (the second output: the concat's own dequantized codes)."""
    g = _Graph()
    x = g.qdq("x", g.params(0.05, 128), "xd")
    out_params = g.params(0.045, 118)
    a = g.conv(x, out_params, "a", channels=channels)
    b = g.conv(x, g.params(0.04, 100), "b", channels=channels)
    joined = g.qdq(g.concat([a, b], "j"), out_params, "jd")
    out = g.conv(joined, g.params(0.06, 128), "c", k=1)
    return g.model([out, joined]), [g.value[out], g.value[joined]]


@pytest.mark.parametrize("channels", [16, 8], ids=["whole_blocks", "nchw"])
def test_a_concat_of_codes_runs_on_codes(channels):
    cm, to_ref, to_ort = _compare(*_concat_model(channels))
    assert cm.record.qdq["code_squeezes"] == 1 and cm.record.qdq["int8_kernels"] == 3
    names = [g.name_hint for g in cm.mod.get_global_vars()]
    assert any(n.startswith("concat_codes") for n in names), names
    if channels == 16:  # every input fills its blocks: the codes stay NCHW16c through the concat
        assert cm.record.qdq["layout_transforms"] == 1  # the concat's own codes, a model output, back to NCHW
    assert to_ref <= 1 and to_ort <= 1  # halves rounded up where QuantizeLinear rounds them to even
