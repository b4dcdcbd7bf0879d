"""ONNX's own backend node tests (``onnx.backend.test.case.node``) as tvmfuse cases.

The onnx wheel ships the generators of its node tests; importing them records every case (model, inputs,
expected outputs) through ``onnx.backend.test.case.node.expect``. This module collects the cases of the op
types a CNN compiler must handle, freezes the inputs that real exports carry as constants into
initializers (one data-driven table, :data:`FROZEN_INPUTS`), compiles each case with
``tvmfuse.compile(..., target="x86-host")`` and compares with the tolerance of ``onnx.backend.test.runner``.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
from onnx import numpy_helper

OP_TYPES = ("Conv", "BatchNormalization", "Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu",
            "PRelu", "Add", "Sub", "Mul", "Div", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool",
            "Concat", "Flatten", "Reshape", "Transpose", "Pad", "Softmax", "QuantizeLinear", "DequantizeLinear",
            "QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "DynamicQuantizeLinear",
            # What real exports (OCR, detection, segmentation, ConvNeXt-style nets, CRNNs) add:
            "Identity", "Erf", "Split", "Resize", "LayerNormalization", "ReduceMean", "Pow", "Sqrt",
            "ConvTranspose", "LSTM", "GRU", "RNN")

# op type -> positions in the node's input list (ONNX schema order) frozen into initializers: the weights,
# scales, shapes and pads a real CNN export carries as constants. Every other input stays a graph input.
FROZEN_INPUTS = {
    "Conv": (1, 2),                       # W, B
    "BatchNormalization": (1, 2, 3, 4),   # scale, B, input_mean, input_var
    "Clip": (1, 2),                       # min, max
    "PRelu": (1,),                        # slope
    "Gemm": (1, 2),                       # B, C
    "Reshape": (1,),                      # shape
    "Pad": (1, 2, 3),                     # pads, constant_value, axes
    "QuantizeLinear": (1, 2),             # y_scale, y_zero_point
    "DequantizeLinear": (1, 2),           # x_scale, x_zero_point
    "QLinearConv": (1, 2, 3, 4, 5, 6, 7, 8),  # every input but x: scales, zero points, w, B
    "ConvInteger": (1, 2, 3),             # w, x_zero_point, w_zero_point
    "QLinearMatMul": (1, 2, 3, 4, 5, 6, 7),  # every input but a: scales, zero points, b
    "MatMulInteger": (1, 2, 3),           # B, a_zero_point, b_zero_point
    "Split": (1,),                        # split sizes
    "Resize": (1, 2, 3),                  # roi, scales, sizes
    "LayerNormalization": (1, 2),         # scale, B
    "ReduceMean": (1,),                   # axes
    "Pow": (1,),                          # exponent (LayerNorm spelt out squares with a constant 2)
    "ConvTranspose": (1, 2),              # W, B
    "LSTM": (1, 2, 3, 4, 5, 6, 7),        # W, R, B, sequence_lens, initial_h, initial_c, P
    "GRU": (1, 2, 3, 4, 5),               # W, R, B, sequence_lens, initial_h
    "RNN": (1, 2, 3, 4, 5),               # W, R, B, sequence_lens, initial_h
}

TARGET = "x86-host"


def _to_array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


# onnx's generator module of an op type, where it is not the op type in lower case
_MODULE_OF = {"BatchNormalization": "batch_normalization"}


def _generated() -> list:
    """The cases onnx's generators of :data:`OP_TYPES` record. Importing only those modules, not every op's
    (``collect_testcases``), saves 3-4 s of every test run's collection (LpPool's reference alone takes 3 s);
    each generator seeds numpy itself, so a case's data does not depend on what was imported before it. A
    module onnx has renamed falls back to the whole collection."""
    import importlib

    from onnx.backend.test.case import node

    try:
        for op in OP_TYPES:
            importlib.import_module(f"{node.__name__}.{_MODULE_OF.get(op, op.lower())}")
    except ImportError:
        return node.collect_testcases()
    return node._NodeTestCases


@functools.lru_cache(maxsize=None)
def cases() -> dict:
    """``{case name: (op type, TestCase)}`` for every collected case of :data:`OP_TYPES`, sorted by name.

    ``*_expanded*`` cases (the op's function body, e.g. Softmax as ReduceMax/Exp/ReduceSum) belong to the
    op type of the case they expand.
    """
    with warnings.catch_warnings():  # the generators of unrelated ops (Cast, Reduce*) warn on import
        warnings.simplefilter("ignore")
        collected = _generated()
    op_of = {c.name: c.model.graph.node[0].op_type for c in collected
             if "_expanded" not in c.name and len(c.model.graph.node) == 1}
    out = {}
    for case in collected:
        op = op_of.get(case.name.split("_expanded")[0])
        if op in OP_TYPES:
            out[case.name] = (op, case)
    return dict(sorted(out.items()))


def _base_node(name: str) -> onnx.NodeProto:
    """The single node of the (non-expanded) case ``name`` belongs to."""
    return cases()[name.split("_expanded")[0]][1].model.graph.node[0]


def prepare(name: str):
    """Return ``(model, feeds, expected)`` for case ``name`` with :data:`FROZEN_INPUTS` frozen."""
    op, case = cases()[name]
    (inputs, outputs), = case.data_sets
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    node = _base_node(name)
    frozen_names = {node.input[i] for i in FROZEN_INPUTS.get(op, ()) if i < len(node.input) and node.input[i]}
    present = [n for n in node.input if n]
    graph_inputs = list(model.graph.input)
    assert [v.name for v in graph_inputs] == present[:len(graph_inputs)], name
    feeds, keep = {}, []
    for value_info, value in zip(graph_inputs, inputs):
        if value_info.name in frozen_names:
            if isinstance(value, onnx.TensorProto):
                tensor = onnx.TensorProto()
                tensor.CopyFrom(value)
                tensor.name = value_info.name
            else:
                tensor = numpy_helper.from_array(np.asarray(value), value_info.name)
            model.graph.initializer.append(tensor)
        else:
            keep.append(value_info)
            feeds[value_info.name] = _to_array(value)
    del model.graph.input[:]
    model.graph.input.extend(keep)
    return model, feeds, [_to_array(o) for o in outputs]


def check_outputs(got, expected, rtol: float, atol: float) -> None:
    """Compare like ``onnx.backend.test.runner.Runner.assert_similar_outputs``; integers compare exactly."""
    assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
    for i, (out, ref) in enumerate(zip(got, expected)):
        assert out.shape == ref.shape, f"output {i}: shape {out.shape}, expected {ref.shape}"
        assert out.dtype == ref.dtype, f"output {i}: dtype {out.dtype}, expected {ref.dtype}"
        if ref.dtype.kind in "fc":
            np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(out, ref, err_msg=f"output {i}")


def run_case(name: str) -> None:
    """Compile and run case ``name``, raising on any error or mismatch."""
    import tvmfuse

    _, case = cases()[name]
    model, feeds, expected = prepare(name)
    got = tvmfuse.compile(model, target=TARGET).run(feeds)
    check_outputs(got, expected, case.rtol, case.atol)


def summary(failing) -> dict[str, tuple[int, int]]:
    """``{op type: (passed, total)}`` over all collected cases, the names in ``failing`` counted as failed (the
    suite's strict xfail marks make each case's own test prove its outcome; nothing is run here)."""
    table = {op: [0, 0] for op in OP_TYPES}
    for name, (op, _) in cases().items():
        table[op][0] += name not in failing
        table[op][1] += 1
    return {op: (p, t) for op, (p, t) in table.items()}
