"""The fusion pattern table: its priority order and the graphs each entry converts (Partition and
LowerPartitions on before/expected modules: ``test_partition_lower.py``).

Habits (DESIGN): every pass has a before/expected test, a no-match test, a rejected-match test and a
well-formedness check. Graphs are small ONNX models imported and canonicalized like ``tvmfuse.compile`` does.
"""


from __future__ import annotations


import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper

import tvmfuse
from tvmfuse import patterns
from tvmfuse.passes.lower import LowerPartitions
from tvmfuse.passes.partition import composites
from tvmfuse.schedules.families import ACTIVATIONS

from helpers import HOST, ort_run
from helpers import make_model

RNG = np.random.default_rng(11)


from helpers.patterns import *  # noqa: F401,F403  (graph builders and pass drivers)


# --------------------------------------------------------------------------------------- priority order

EXPECTED_ORDER = [
    "tvmfuse.depthwise_conv2d_add_relu",
    "tvmfuse.depthwise_conv2d_add",
    "tvmfuse.depthwise_conv2d_relu",
    "tvmfuse.depthwise_conv2d_clip",
    "tvmfuse.depthwise_conv2d_hardswish",
    "tvmfuse.depthwise_conv2d_hardsigmoid",
    "tvmfuse.depthwise_conv2d_leakyrelu",
    "tvmfuse.depthwise_conv2d_gelu",
    "tvmfuse.depthwise_conv2d_silu",
    "tvmfuse.depthwise_conv2d_sigmoid",
    "tvmfuse.depthwise_conv2d",
    "tvmfuse.conv2d_add_relu",
    "tvmfuse.conv2d_add",
    "tvmfuse.conv2d_relu",
    "tvmfuse.conv2d_clip",
    "tvmfuse.conv2d_hardswish",
    "tvmfuse.conv2d_hardsigmoid",
    "tvmfuse.conv2d_leakyrelu",
    "tvmfuse.conv2d_gelu",
    "tvmfuse.conv2d_silu",
    "tvmfuse.conv2d_sigmoid",
    "tvmfuse.conv2d",
    "tvmfuse.dense_relu",
    "tvmfuse.dense_clip",
    "tvmfuse.dense_hardswish",
    "tvmfuse.dense_hardsigmoid",
    "tvmfuse.dense_leakyrelu",
    "tvmfuse.dense_gelu",
    "tvmfuse.dense_silu",
    "tvmfuse.dense_sigmoid",
    "tvmfuse.dense",
    "tvmfuse.batch_matmul",  # no epilogue activations (attention products)
]


# The activations an INT8 epilogue applies: the INT8 table's only activation entries.
INT8_ACTIVATIONS = ("relu", "clip", "hardswish")


def test_priority_order_pinned():
    """The FP32 table's order without its ``*_affine`` entries (tests/patterns/test_affine.py places those);
    the INT8 table is the same order without the activations no INT8 epilogue applies (and without its
    hardswish ``*_affine`` entries, placed there too)."""
    assert [n for n in patterns.names() if not n.endswith("_affine")] == EXPECTED_ORDER
    int8 = [n for n in EXPECTED_ORDER if n.rsplit("_", 1)[-1] not in set(ACTIVATIONS) - set(INT8_ACTIVATIONS)]
    assert [n for n in patterns.names(int8=True) if not n.endswith("_affine")] == int8
    assert "tvmfuse.conv2d_silu" not in int8 and "tvmfuse.conv2d_add_relu" in int8 and "tvmfuse.dense" in int8


@pytest.mark.parametrize("int8", [False, True])
def test_table_follows_names(int8):
    table = patterns.table(int8=int8)
    # first appearance: an entry may be split into several FusionPatterns (e.g. one per operand order)
    assert list(dict.fromkeys(p.name for p in table)) == patterns.names(int8=int8)
    assert all(p.check is not None for p in table)


def test_entry_name():
    assert patterns.entry_name("conv2d", True, "relu") == "tvmfuse.conv2d_add_relu"
    assert patterns.entry_name("depthwise_conv2d", False, None) == "tvmfuse.depthwise_conv2d"
    assert patterns.entry_name("dense", False, "clip") == "tvmfuse.dense_clip"


def _silu(order):
    return [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", list(order), ["y"])]


_HSWISH_INITS = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
                 (("three", 3.0), ("zero", 0.0), ("six", 6.0))]


_GELU_INITS = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
               (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]


def _gelu(half_first: bool):
    """GELU (erf form): ``(x * (erf(x / sqrt2) + 1)) * 0.5``, or ``(x * 0.5) * (1 + erf(x / sqrt2))``."""
    nodes = [helper.make_node("Div", ["c", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"])]
    if half_first:
        return nodes + [helper.make_node("Add", ["one", "e"], ["f"]), helper.make_node("Mul", ["c", "half"], ["h"]),
                        helper.make_node("Mul", ["h", "f"], ["y"])]
    return nodes + [helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["c", "f"], ["g"]),
                    helper.make_node("Mul", ["g", "half"], ["y"])]


def _hardswish_paddle():
    """``(x * clip(x + 3, 0, 6)) / 6``, as Paddle exports hardswish (PP-OCR detectors)."""
    return [helper.make_node("Add", ["c", "three"], ["p"]), helper.make_node("Clip", ["p", "zero", "six"], ["q"]),
            helper.make_node("Mul", ["c", "q"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])]


def _hardswish_hsig(order=("c", "h")):
    """``x * HardSigmoid(x)``, as PP-OCRv6 tiny rec spells hardswish."""
    return [helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", list(order), ["y"])]


CONVERSIONS = [
    ("conv_bias_relu", lambda: _g_conv(_act("Relu")), {"tvmfuse.conv2d_relu": 1}, []),
    ("conv_nobias_relu", lambda: _g_conv(_act("Relu"), bias=False), {"tvmfuse.conv2d_relu": 1}, []),
    ("conv_bias", lambda: _g_conv(_act("Identity")), {"tvmfuse.conv2d": 1}, []),
    ("conv_bn_relu6", lambda: _g_conv_bn_relu6(), {"tvmfuse.conv2d_clip": 1}, []),
    ("conv_hardswish", lambda: _g_conv(_act("HardSwish")), {"tvmfuse.conv2d_hardswish": 1}, []),
    ("conv_leakyrelu", lambda: _g_conv(_act("LeakyRelu", alpha=0.2)), {"tvmfuse.conv2d_leakyrelu": 1}, []),
    ("conv_sigmoid", lambda: _g_conv(_act("Sigmoid")), {"tvmfuse.conv2d_sigmoid": 1}, []),
    ("conv_silu", lambda: _g_conv(_silu(("c", "s"))), {"tvmfuse.conv2d_silu": 1}, []),
    ("conv_silu_gate_first", lambda: _g_conv(_silu(("s", "c"))), {"tvmfuse.conv2d_silu": 1}, []),
    ("conv_gelu", lambda: _g_conv(_gelu(False), _GELU_INITS), {"tvmfuse.conv2d_gelu": 1}, []),
    ("conv_gelu_half_first", lambda: _g_conv(_gelu(True), _GELU_INITS), {"tvmfuse.conv2d_gelu": 1}, []),
    # HardSigmoid's alpha * x + beta folds into the conv (FoldScaleShift): a clip is left
    ("conv_hardsigmoid", lambda: _g_conv(_act("HardSigmoid", alpha=0.2, beta=0.5)), {"tvmfuse.conv2d_clip": 1}, []),
    ("conv_hardswish_hsig", lambda: _g_conv(_hardswish_hsig()), {"tvmfuse.conv2d_hardswish": 1}, []),
    ("conv_hardswish_hsig_gate_first", lambda: _g_conv(_hardswish_hsig(("h", "c"))), {"tvmfuse.conv2d_hardswish": 1},
     []),
    ("dw_hardsigmoid", lambda: _g_conv(_act("HardSigmoid"), cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_clip": 1}, []),
    ("matmul_const_hardsigmoid", lambda: _g_matmul([helper.make_node("HardSigmoid", ["m"], ["y"])], out="m"),
     {"tvmfuse.dense_hardsigmoid": 1}, []),
    ("conv_hardswish_paddle", lambda: _g_conv(_hardswish_paddle(), _HSWISH_INITS), {"tvmfuse.conv2d_hardswish": 1},
     []),
    ("dw_hardswish_paddle", lambda: _g_conv(_hardswish_paddle(), _HSWISH_INITS, cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_hardswish": 1}, []),
    ("dw_relu6", lambda: _g_conv([_relu6("c", "y")], _CLIP_INITS, cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_clip": 1}, []),
    ("dw_bn_relu6", lambda: _g_conv_bn_relu6(cin=8, cout=8, group=8), {"tvmfuse.depthwise_conv2d_clip": 1}, []),
    ("dw_mult2_relu", lambda: _g_conv(_act("Relu"), cin=4, cout=8, group=4), {"tvmfuse.depthwise_conv2d_relu": 1}, []),
    ("dw_hardswish", lambda: _g_conv(_act("HardSwish"), cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_hardswish": 1}, []),
    ("dw_leakyrelu", lambda: _g_conv(_act("LeakyRelu"), cin=8, cout=8, group=8),
     {"tvmfuse.depthwise_conv2d_leakyrelu": 1}, []),
    ("dw_sigmoid", lambda: _g_conv(_act("Sigmoid"), cin=8, cout=8, group=8), {"tvmfuse.depthwise_conv2d_sigmoid": 1}, []),
    ("dw_alone", lambda: _g_conv(_act("Identity"), cin=8, cout=8, group=8), {"tvmfuse.depthwise_conv2d": 1}, []),
    ("grouped_2_of_8_relu", lambda: _g_conv(_act("Relu"), cin=8, cout=8, group=2), {"tvmfuse.conv2d_relu": 1}, []),
    ("residual_conv_first_relu", lambda: _g_residual(("c", "r"), "Relu"), {"tvmfuse.conv2d_add_relu": 1}, []),
    ("residual_conv_second_relu", lambda: _g_residual(("r", "c"), "Relu"), {"tvmfuse.conv2d_add_relu": 1}, []),
    ("residual_no_act", lambda: _g_residual(("c", "r"), None), {"tvmfuse.conv2d_add": 1}, []),
    ("residual_then_sigmoid", lambda: _g_residual(("c", "r"), "Sigmoid"), {"tvmfuse.conv2d_add": 1},
     ["relax.sigmoid"]),
    ("dw_residual_relu", lambda: _g_residual(("r", "c"), "Relu", group=5), {"tvmfuse.depthwise_conv2d_add_relu": 1}, []),
    ("gemm_transB_bias_relu", lambda: _g_gemm_relu(), {"tvmfuse.dense_relu": 1}, []),
    ("matmul_const", lambda: _g_matmul(), {"tvmfuse.dense": 1}, []),
    ("matmul_const_sigmoid", lambda: _g_matmul([helper.make_node("Sigmoid", ["m"], ["y"])], out="m"),
     {"tvmfuse.dense_sigmoid": 1}, []),
    ("matmul_bias_relu6", lambda: _g_matmul([helper.make_node("Add", ["m", "b"], ["a"]), _relu6("a", "y")],
                                            [_w("b", 6)] + _CLIP_INITS, out="m"), {"tvmfuse.dense_clip": 1}, []),
    ("matmul_nonconst_weight", lambda: make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                                  [("x", [3, 10]), ("w", [10, 6])], [("y", None)]),
     {}, ["relax.matmul"]),
    ("relu_maxpool_no_match", _g_relu_maxpool, {}, ["relax.nn.relu", "relax.nn.max_pool2d"]),
]


MAKE = {c[0]: c[1] for c in CONVERSIONS}


@pytest.mark.parametrize("name", ["conv_hardsigmoid", "conv_hardswish_hsig", "conv_hardswish_hsig_gate_first",
                                  "dw_hardsigmoid", "matmul_const_hardsigmoid"])
def test_hardsigmoid_epilogues_match_onnxruntime(name):
    model = MAKE[name]()
    shape = [int(d.dim_value) for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = {"x": (np.random.default_rng(5).standard_normal(shape) * 4).astype("float32")}
    cm = tvmfuse.compile(model, target=HOST)
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)
    names = [gv.name_hint for gv in cm.lowered.functions]
    outside = [n for n in names if not n.startswith("tvmfuse_")]
    assert not [n for n in outside if "clip" in n or "multiply" in n], names  # no HardSigmoid op outside the kernel
    assert any(n.startswith("tvmfuse_") and any(a in n for a in ("hardswish", "hardsigmoid", "clip")) for n in names), \
        names


@pytest.mark.parametrize("make,expected,outside", [c[1:] for c in CONVERSIONS], ids=[c[0] for c in CONVERSIONS])
def test_conversion(make, expected, outside):
    mod = _canonical(make())
    part, _ = _partition(mod)
    _assert_well_formed(part)
    assert dict(composite_calls(part)) == expected
    assert sorted(str(f.attrs["Composite"]) for f in composites(part).values()) == sorted(expected)
    assert outside_ops(part) == outside
    lowered = LowerPartitions()(part)
    _assert_well_formed(lowered)
    assert composites(lowered) == {}


def test_no_match_is_structurally_unchanged_and_runs():
    model = MAKE["relu_maxpool_no_match"]()
    mod = _canonical(model)
    part, rejections = _partition(mod)
    tvm.ir.assert_structural_equal(part, mod)
    assert rejections == {}
    tvm.ir.assert_structural_equal(LowerPartitions()(part), mod)
    cm = tvmfuse.compile(model, target=HOST)
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(cm.run({"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_matmul_nonconst_weight_not_partitioned_and_runs():
    model = MAKE["matmul_nonconst_weight"]()
    mod = _canonical(model)
    part, _ = _partition(mod)
    tvm.ir.assert_structural_equal(part, mod)
    cm = tvmfuse.compile(model, target=HOST)
    assert cm.record.kernels == {}
    feeds = {"x": RNG.standard_normal((3, 10)).astype("float32"), "w": RNG.standard_normal((10, 6)).astype("float32")}
    np.testing.assert_allclose(cm.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_matmul_3d_weight_is_batched_and_a_vector_operand_rejected_with_reason():
    """A batched constant weight is not a dense (3-D data x 2-D weight is: FlattenMatmul makes it 2-D) but a
    batched matmul; a 1-D operand is neither family's, and the rejection says why."""
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["y"])], [("x", [2, 3, 10])], [("y", None)],
                       [_w("W", (2, 10, 6))])
    part, _ = _partition(_canonical(model))
    assert composite_calls(part) == {"tvmfuse.batch_matmul": 1}
    vector = make_model([helper.make_node("MatMul", ["x", "W"], ["y"])], [("x", [10])], [("y", None)],
                        [_w("W", (2, 10, 6))])
    part, rejections = _partition(_canonical(vector))
    assert composite_calls(part) == {}
    assert any("rank >= 2" in r for r in rejections.values()), rejections
