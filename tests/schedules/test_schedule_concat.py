"""The x86 channel-concat rule (schedules/x86/concat.py): a concatenation of costly parts computes each part in
its own slice of the channel loop, straight into the output, instead of storing every part first
(schedules/x86/generic.py's way); anything else is left to the generic schedule."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper
from tvm import te, topi
from tvm.tirx import ForKind

import tvmfuse
from tvmfuse import targets
from tvmfuse.schedules.x86 import concat, generic

from helpers.schedules import run_in_place
from helpers import HOST, make_model, ort_run

SPEC = targets.resolve(HOST)
LANES = SPEC.vector_bits() // 32


def _arrays(func, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)) for p in func.params]


def _heavy(x, scale):
    """A simulated QDQ chain (generic.HEAVY_PART nodes and more): a part generic would store."""
    for step in range(4):
        codes = topi.cast(topi.clip(topi.round(topi.divide(x, scale + 0.01 * step)) + 3.0, 0.0, 255.0), "uint8")
        x = topi.multiply(topi.subtract(topi.cast(codes, "float32"), 3.0), scale + 0.01 * step)
    return x


def _upsampled(p, factor):
    """Nearest upsampling by ``factor`` along H and W (an FPN branch; NCHW or NCHWc), a gather of the smaller map."""
    shape = [int(d) for d in p.shape]
    shape[2:4] = [shape[2] * factor, shape[3] * factor]
    return te.compute(shape, lambda b, ch, y, x, *lane: p[(b, ch, y // factor, x // factor) + tuple(lane)],
                      name="upsample")


def _leaf_blocks(sch):
    found, stack = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while stack:
        block = stack.pop()
        children = sch.get_child_blocks(block)
        stack.extend(children) if children else found.append(block)
    return found


def _loops(sch, kind):
    """How many loops of ``kind`` the scheduled function has."""
    return sch.mod["main"].script().count({ForKind.VECTORIZED: "T.vectorized(", ForKind.PARALLEL: "T.parallel("}[kind])


@pytest.mark.parametrize("blocked", [False, True], ids=["NCHW", "NCHW8c"])
def test_costly_parts_are_computed_in_their_own_channel_slices(blocked):
    """An FPN neck's concat (upsampled branches, costly chains): one stage, one part per slice of the channel
    loop (rows in parallel, the innermost loop vectorized); the same values as TVM's unscheduled kernel."""
    if blocked:
        shapes = [(1, 2, 8 // f, 8 // f, 8) for f in (8, 4, 2, 1)]
        parts = [te.placeholder(s, name=f"p{i}") for i, s in enumerate(shapes)]
    else:
        parts = [te.placeholder((1, 6, 32 // f, 32 // f), name=f"p{i}") for i, f in enumerate((8, 4, 2, 1))]
    branches = [_heavy(_upsampled(p, f) if f > 1 else p, 0.05 * (i + 1))
                for i, (p, f) in enumerate(zip(parts, (8, 4, 2, 1)))]
    func = te.create_prim_func(parts + [topi.concatenate(branches, axis=1)])
    sch = concat.scheduled(func, LANES)
    assert sch is not None
    assert len(_leaf_blocks(sch)) == 4  # one per part, nothing stored in between
    assert _loops(sch, ForKind.VECTORIZED) == 4
    arrays = _arrays(func, seed=1)
    np.testing.assert_allclose(run_in_place(sch.mod["main"], arrays), run_in_place(func, [a.copy() for a in arrays]),
                               rtol=1e-6, atol=1e-6)


def test_parts_in_parallel_rows_when_there_is_work():
    parts = [te.placeholder((1, 16, 64, 64), name=f"p{i}") for i in range(2)]
    func = te.create_prim_func(parts + [topi.concatenate([_heavy(p, 0.1) for p in parts], axis=1)])
    sch = concat.scheduled(func, LANES)
    assert sch is not None and _loops(sch, ForKind.PARALLEL) == 2


@pytest.mark.parametrize("case", ["cheap", "last-axis", "shuffle"])
def test_other_concats_are_left_to_the_generic_schedule(case):
    """Copies (one vector loop over all parts is cheaper), a concat along the last axis, and a channel shuffle
    (its selects test an expression of the channel, not the channel) take the generic schedule."""
    a, b = te.placeholder((1, 8, 16, 16), name="a"), te.placeholder((1, 8, 16, 16), name="b")
    if case == "cheap":
        out = topi.concatenate([a, topi.multiply(b, 2.0)], axis=1)
    elif case == "last-axis":
        out = topi.concatenate([_heavy(a, 0.1), _heavy(b, 0.2)], axis=3)
    else:
        cat = topi.concatenate([_heavy(a, 0.1), _heavy(b, 0.2)], axis=1)
        out = topi.reshape(topi.transpose(topi.reshape(cat, (1, 2, 8, 16, 16)), (0, 2, 1, 3, 4)), (1, 16, 16, 16))
    func = te.create_prim_func([a, b, out])
    assert concat.scheduled(func, LANES) is None
    assert generic.apply(func, LANES) is not None


def test_fpn_neck_compiles_to_the_rule_and_agrees():
    """A DB-style neck in an ONNX model (each branch scaled, upsampled by Resize, concatenated): its kernel
    computes each part in its own slice, nothing stored in between, and the model matches onnxruntime."""
    nodes, inits = [], []
    names = []
    for i, f in enumerate((4, 2, 1)):
        inits.append(numpy_helper.from_array(np.full((1, 4, 1, 1), 0.5 + i, np.float32), f"s{i}"))
        nodes.append(helper.make_node("Mul", [f"x{i}", f"s{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", f"x{i}"], [f"a{i}"]))
        if f > 1:
            inits.append(numpy_helper.from_array(np.array([1, 1, f, f], np.float32), f"r{i}"))
            nodes.append(helper.make_node("Resize", [f"a{i}", "", f"r{i}"], [f"u{i}"], mode="nearest"))
            names.append(f"u{i}")
        else:
            names.append(f"a{i}")
    nodes.append(helper.make_node("Concat", names, ["y"], axis=1))
    model = make_model(nodes, [(f"x{i}", [1, 4, 32 // f, 32 // f]) for i, f in enumerate((4, 2, 1))], [("y", None)],
                       inits)
    rng = np.random.default_rng(2)
    x = {f"x{i}": rng.standard_normal((1, 4, 32 // f, 32 // f)).astype("float32") for i, f in enumerate((4, 2, 1))}
    cm = tvmfuse.compile(model, target=HOST)
    (kernel,) = [cm.lowered[gv].script() for gv in cm.lowered.functions if "concatenate" in gv.name_hint]
    assert "sblock_alloc_buffer" not in kernel and kernel.count("T.parallel(") == 3  # a slice per part
    np.testing.assert_allclose(cm.run(x)[0], ort_run(model, x)[0], rtol=1e-5, atol=1e-5)
