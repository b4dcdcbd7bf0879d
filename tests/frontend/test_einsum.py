"""An Einsum that is a matrix product becomes Reshape/MatMul/Reshape (frontend/einsum.py): the same numbers as
onnxruntime, on the dense kernels; other equations keep TVM's einsum."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from tvmfuse.frontend import einsum

from helpers import HOST, ort_run

RNG = np.random.default_rng(3)


def _model(equation: str, a_shape, b_shape, b_constant: bool = True):
    b = RNG.standard_normal(b_shape).astype(np.float32)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))]
    if not b_constant:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape)))
    graph = helper.make_graph([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], "einsum", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(b, "b")] if b_constant else [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), b


@pytest.mark.parametrize("equation,a_shape,b_shape,product", [
    ("abcd,cde->abe", (1, 32, 8, 16), (8, 16, 128), True),   # TF's attention output projection
    ("abc,cd->abd", (2, 5, 12), (12, 7), True),
    ("abc,c->ab", (2, 5, 12), (12,), True),                  # no free axis in the second operand
    ("cd,cde->e", (4, 6), (4, 6, 3), True),                  # none in the first
    ("abc,dc->abd", (2, 5, 12), (7, 12), False),             # the summed axis last in both: kept
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5), False),           # a batch axis: kept
])
def test_product_einsums_become_matmuls(equation, a_shape, b_shape, product):
    model, _ = _model(equation, a_shape, b_shape)
    ops = [n.op_type for n in einsum.rewrite_einsums(_model(equation, a_shape, b_shape)[0])[0].graph.node]
    assert ("Einsum" not in ops) == product, ops
    x = {"a": RNG.standard_normal(a_shape).astype(np.float32)}
    cm = tvmfuse.compile(model, target=HOST)
    assert any("einsum" in gv.name_hint for gv, _ in cm.lowered.functions_items()) != product
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)


def test_a_second_operand_computed_at_run_time():
    model, b = _model("abc,cd->abd", (2, 5, 12), (12, 7), b_constant=False)
    x = {"a": RNG.standard_normal((2, 5, 12)).astype(np.float32), "b": b}
    np.testing.assert_allclose(tvmfuse.compile(model, target=HOST).run(x)[0], ort_run(model, x)[0],
                               rtol=1e-5, atol=1e-5)
