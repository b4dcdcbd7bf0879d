"""Batched MatMul as a partition family (issue #18): attention's ``Q x K^T`` (the transpose read inside the
kernel) and ``scores x V``, broadcast batches, a constant operand of rank 3, a width no vector divides; each
against onnxruntime or numpy, the x86 rule's kernel against TVM's, 2-D products left to the dense family."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import s_tir, te, topi

import tvmfuse
from tvmfuse.schedules.computes import batch_matmul as compute
from tvmfuse.schedules.x86 import batch_matmul as rule

from helpers import HOST, make_model, ort_run

RNG = np.random.default_rng(5)


def _const(name, shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.3, name)


def attention(tokens=12, width=32, heads=4):
    """x[1, T, C] -> Q, K, V projections -> heads -> softmax(Q K^T * scale) V -> [1, T, C]."""
    d = width // heads
    nodes, inits = [], [_const(f"w{n}", (width, width)) for n in "qkv"]
    inits += [numpy_helper.from_array(np.array([1, tokens, heads, d], np.int64), "split"),
              numpy_helper.from_array(np.array([1, tokens, width], np.int64), "merge"),
              numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale")]
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", "split"], [f"{n}h"])]
    nodes += [helper.make_node("Transpose", ["qh"], ["q"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["vh"], ["v"], perm=[0, 2, 1, 3]),
              helper.make_node("Mul", ["q", "scale"], ["qs"]),
              helper.make_node("MatMul", ["qs", "kt"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merge"], ["y"])]
    return make_model(nodes, [("x", [1, tokens, width])], [("y", None)], inits, opset=17)


def _families(cm) -> list[tuple[str, str]]:
    """(family, ops) of every partition kernel."""
    funcs = [cm.lowered[gv] for gv in cm.lowered.functions]
    return sorted((str(f.attrs["tvmfuse.family"]), str(f.attrs["tvmfuse.ops"])) for f in funcs
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs and "tvmfuse.family" in f.attrs)


def test_attention_products_are_batch_matmul_kernels():
    model = attention()
    cm = tvmfuse.compile(model, target=HOST)
    batched = [ops for family, ops in _families(cm) if family == "batch_matmul"]
    assert batched == ["permute_dims,matmul"] * 2  # K^T and V each read through its transpose
    x = {"x": RNG.standard_normal((1, 12, 32)).astype(np.float32)}
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("a_shape,b_shape,b_const", [
    ((2, 1, 6, 8), (3, 8, 5), True),  # batches broadcast both ways, a rank-3 constant
    ((6, 8), (2, 8, 20), False),  # a 2-D activation against a batch
    ((1, 3, 5, 16), (1, 3, 16, 37), False),  # 37 wide: no vector divides it (padded, then cropped)
])
def test_broadcast_batches_constant_operands_and_odd_widths(a_shape, b_shape, b_const):
    inputs = [("a", list(a_shape))] + ([] if b_const else [("b", list(b_shape))])
    inits = [_const("b", b_shape)] if b_const else []
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs, [("y", None)], inits)
    cm = tvmfuse.compile(model, target=HOST)
    assert [family for family, _ in _families(cm)] == ["batch_matmul"]
    x = {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in inputs}
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)


def test_two_dimensional_products_stay_with_dense_or_tvm():
    """2-D x 2-D constant is a dense; 2-D x 2-D activations is neither family's (TVM's path), still right."""
    dense = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])], [("a", [4, 8])], [("y", None)],
                       [_const("w", (8, 16))])
    assert [family for family, _ in _families(tvmfuse.compile(dense, target=HOST))] == ["dense"]
    both = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [4, 8]), ("b", [8, 16])], [("y", None)])
    cm = tvmfuse.compile(both, target=HOST)
    assert _families(cm) == []
    x = {"a": RNG.standard_normal((4, 8)).astype(np.float32), "b": RNG.standard_normal((8, 16)).astype(np.float32)}
    np.testing.assert_allclose(cm.run(x)[0], x["a"] @ x["b"], rtol=1e-5, atol=1e-5)


class _Call:
    def __init__(self, shape):
        self.ty = type("Ty", (), {"shape": shape})()


@pytest.mark.parametrize("transposed,n", [(True, 40), (False, 15), (True, 37)])
def test_rule_kernel_matches_tvms_and_is_vectorized(transposed, n):
    """The rule's kernel (K^T packed per head, register tiles of whole vectors) against the same compute
    unscheduled; its product loop is vectorized and its heads run in parallel."""
    q = te.placeholder((1, 4, 24, 16), name="q")
    k = te.placeholder((1, 4, n, 16) if transposed else (1, 4, 16, n), name="k")
    b = topi.transpose(k, [0, 1, 3, 2]) if transposed else k
    func = te.create_prim_func([q, k, compute.batch_matmul(_Call((1, 4, 24, n)), q, b, 16)])
    sch = s_tir.Schedule(func)
    assert rule.schedule(sch, 16)
    text = sch.mod.script()
    assert "T.vectorized" in text and "T.parallel" in text
    assert (compute.PACK in text) == (transposed or n == 37) and (compute.CROP in text) == (n == 37)
    target = tvmfuse.targets.resolve(HOST).tvm_target()
    args = [RNG.standard_normal([int(d) for d in t.shape]).astype(np.float32) for t in (q, k)]
    outs = []
    for mod in (sch.mod, tvm.IRModule({"main": func})):
        buffers = [tvm.runtime.tensor(a) for a in args] + [tvm.runtime.tensor(np.zeros((1, 4, 24, n), np.float32))]
        tvm.compile(mod, target=target)["main"](*buffers)
        outs.append(buffers[-1].numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    want = np.matmul(args[0], np.swapaxes(args[1], -1, -2) if transposed else args[1])
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_gives_the_products_dlights_matmul_and_nvcc_builds_them():
    cm = tvmfuse.compile(attention(), target="cuda-sm90")
    scheduled = cm.manifest()["scheduled_by"]
    assert [v for k, v in scheduled.items() if "batch_matmul" in k] == ["tvmfuse.cuda.batch_matmul"] * 2
    assert cm.manifest()["cuda_code"] == "binary"
