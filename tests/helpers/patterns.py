"""Shared helpers for the pattern and partition-legality tests: tiny ONNX graphs and pass drivers."""


from __future__ import annotations

import collections

import numpy as np
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from tvmfuse import frontend
from tvmfuse.passes.partition import Partition, composites
from tvmfuse.passes.pipeline import canonicalize_passes

from helpers import make_model

RNG = np.random.default_rng(11)


# ---------------------------------------------------------------------------------------------- helpers

def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, dtype="float32"), name)


def _w(name, shape):
    return _init(name, RNG.standard_normal(shape))


def _canonical(model) -> tvm.IRModule:
    mod = frontend.import_model(model).mod
    return tvm.transform.Sequential(canonicalize_passes())(mod)


def _partition(mod: tvm.IRModule):
    rejections: dict = {}
    return Partition(rejections)(mod), rejections


def _assert_well_formed(mod: tvm.IRModule) -> None:
    assert relax.analysis.check_well_formed(mod), mod.script(show_meta=False)


def _bindings(func: relax.Function):
    for block in func.body.blocks:
        yield from block.bindings


def _op_names(func: relax.Function) -> list[str]:
    """Relax op names bound in ``func`` (``call:<Composite>`` for a partition call), in order."""
    out = []
    for b in _bindings(func):
        v = b.value
        if isinstance(v, relax.Call):
            out.append(v.op.name if isinstance(v.op, tvm.ir.Op) else f"call:{v.op.name_hint}")
    return out


def composite_calls(mod: tvm.IRModule) -> collections.Counter:
    """How many times each partition (by ``Composite`` name) is called from ``main``.

    ``composites(mod)`` holds one function per distinct body (FuseOpsByPattern shares identical ones), so
    uses are counted at the call sites; every callee must be one of ``composites(mod)``.
    """
    comps = composites(mod)
    counts = collections.Counter()
    for b in _bindings(mod["main"]):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar):
            assert v.op.name_hint in comps
            counts[str(comps[v.op.name_hint].attrs["Composite"])] += 1
    return counts


def outside_ops(mod: tvm.IRModule) -> list[str]:
    """Relax ops of ``main`` that stayed outside partitions."""
    return [n for n in _op_names(mod["main"]) if not n.startswith("call:")]


def _composite_named(mod: tvm.IRModule, name: str) -> relax.Function:
    found = [f for f in composites(mod).values() if str(f.attrs["Composite"]) == name]
    assert len(found) == 1, [str(f.attrs["Composite"]) for f in composites(mod).values()]
    return found[0]


def _conv(inputs, out, k=3, pad=1, stride=1, group=1, name=None):
    return helper.make_node("Conv", inputs, [out], kernel_shape=[k, k], pads=[pad] * 4, strides=[stride] * 2,
                            group=group, **({"name": name} if name else {}))


def _relu6(inp, out):
    return helper.make_node("Clip", [inp, "c0", "c6"], [out])


_CLIP_INITS = [_init("c0", np.array(0.0)), _init("c6", np.array(6.0))]


def _bn(inp, out, c, prefix="bn"):
    names = [f"{prefix}_{n}" for n in ("g", "b", "m", "v")]
    inits = [_w(names[0], c), _w(names[1], c), _w(names[2], c), _init(names[3], RNG.random(c) + 0.5)]
    return helper.make_node("BatchNormalization", [inp, *names], [out]), inits


# ---------------------------------------------------------------------------------- graph conversions

def _g_conv(act_nodes, act_inits=(), cin=3, cout=8, hw=8, group=1, bias=True, k=3):
    inputs = ["x", "W"] + (["B"] if bias else [])
    inits = [_w("W", (cout, cin // group, k, k))] + ([_w("B", cout)] if bias else [])
    nodes = [_conv(inputs, "c", k=k, pad=k // 2, group=group)] + act_nodes
    return make_model(nodes, [("x", [1, cin, hw, hw])], [("y", None)], inits + list(act_inits))


def _g_conv_bn_relu6(cin=3, cout=8, group=1):
    bn, bn_inits = _bn("c", "n", cout)
    nodes = [_conv(["x", "W"], "c", group=group), bn, _relu6("n", "y")]
    return make_model(nodes, [("x", [1, cin, 8, 8])], [("y", None)],
                      [_w("W", (cout, cin // group, 3, 3))] + bn_inits + _CLIP_INITS)


def _g_residual(order, act, c=5, group=1):
    nodes = [_conv(["x", "W", "B"], "c", group=group), helper.make_node("Add", list(order), ["a" if act else "y"])]
    if act:
        nodes.append(helper.make_node(act, ["a"], ["y"]))
    return make_model(nodes, [("x", [1, c, 7, 7]), ("r", [1, c, 7, 7])], [("y", None)],
                      [_w("W", (c, c // group, 3, 3)), _w("B", c)])


def _g_gemm_relu(n=7):
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["y"])]
    return make_model(nodes, [("x", [2, 10])], [("y", None)], [_w("W", (n, 10)), _w("B", n)])


def _g_matmul(act_nodes=(), act_inits=(), out="y"):
    nodes = [helper.make_node("MatMul", ["x", "W"], [out])] + list(act_nodes)
    return make_model(nodes, [("x", [3, 10])], [("y", None)], [_w("W", (10, 6))] + list(act_inits))


def _act(op, **attrs):
    return [helper.make_node(op, ["c"], ["y"], **attrs)]


def _g_relu_maxpool():
    """Relu -> MaxPool: no pattern matches it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2])]
    return make_model(nodes, [("x", [1, 3, 8, 8])], [("y", None)])


# (id, model factory, expected partition calls, ops expected to stay outside partitions)


__all__ = [
    "RNG",
    "_CLIP_INITS",
    "_act",
    "_assert_well_formed",
    "_bindings",
    "_bn",
    "_canonical",
    "_composite_named",
    "_conv",
    "_g_conv",
    "_g_conv_bn_relu6",
    "_g_gemm_relu",
    "_g_matmul",
    "_g_relu_maxpool",
    "_g_residual",
    "_init",
    "_op_names",
    "_partition",
    "_relu6",
    "_w",
    "composite_calls",
    "outside_ops",
]
