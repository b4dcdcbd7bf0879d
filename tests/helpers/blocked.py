"""Blocked-kernel test helpers shared by the layout and Winograd tests: a one-conv model, its partition
function and call arguments, and its blocked kernel run on given inputs (unpacked back to NCHW)."""

from __future__ import annotations

import numpy as np
import tvm
from onnx import helper, numpy_helper

from tvmfuse import frontend, targets
from tvmfuse.passes.lower import make_kernel
from tvmfuse.passes.partition import Partition, composites
from tvmfuse.passes.pipeline import canonicalize_passes
from tvmfuse.passes.utils import const_array
from tvmfuse.schedules.computes import blocked
from tvmfuse.schedules.computes.partition import anchor_call

from helpers import HOST, make_model

SPEC = targets.resolve(HOST)


def conv_model(cin, cout, hw, k, stride=1, pad=0, dilation=1, group=1, act="Relu", residual=False, seed=0):
    """x -> Conv(bias) [-> Add(r)] -> act; returns the model and its inputs."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype("float32")
    b = rng.standard_normal(cout).astype("float32")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[pad] * 4, dilations=[dilation] * 2, group=group)]
    inputs = [("x", [1, cin, hw, hw])]
    out_hw = (hw + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        inputs.append(("r", [1, cout, out_hw, out_hw]))
        last = "s"
    if act == "Relu6":
        mn, mx = numpy_helper.from_array(np.float32(0), "mn"), numpy_helper.from_array(np.float32(6), "mx")
        nodes.append(helper.make_node("Clip", [last, "mn", "mx"], ["y"]))
        inits = [mn, mx]
    else:
        nodes.append(helper.make_node(act, [last], ["y"]))
        inits = []
    model = make_model(nodes, inputs, [("y", None)], [numpy_helper.from_array(w, "W"),
                                                       numpy_helper.from_array(b, "B"), *inits])
    feeds = {name: rng.standard_normal(shape).astype("float32") for name, shape in inputs}
    return model, feeds


def partition_call(model):
    """(partition function, its call's arguments as numpy arrays or input names)."""
    mod = frontend.import_model(model).mod
    with SPEC.tvm_target(), tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(canonicalize_passes())(mod)
        mod = Partition()(mod)
    (fn,) = composites(mod).values()
    calls = []

    @tvm.relax.expr_functor.visitor
    class _Calls(tvm.relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.GlobalVar):
                calls.append(call)

    _Calls().visit_expr(mod["main"])
    args = [const_array(a) if const_array(a) is not None else a.name for a in calls[0].args]
    return fn, args


def run_blocked(model, feeds, block_inputs=True, spec=SPEC):
    """The partition's blocked kernel (default schedule for ``spec``, built for this host) run on ``feeds``;
    returns (NCHW output, kernel)."""
    lanes = spec.vector_bits() // 32
    fn, args = partition_call(model)
    data = [i for i, p in enumerate(fn.params) if p.same_as(anchor_call(fn).args[0])][0]
    blocks = {}
    for i, arg in enumerate(args):
        block = blocked.block_for(feeds[arg].shape[1], lanes) if isinstance(arg, str) else None
        if block and (block_inputs or i != data):
            blocks[i] = block
    kernel, layout = make_kernel(fn, spec, blocks=blocks)
    arrays = []
    for i, arg in enumerate(args):
        value = feeds[arg] if isinstance(arg, str) else arg
        if i in blocks:
            n, c, h, w = value.shape
            value = value.reshape(n, c // blocks[i], blocks[i], h, w).transpose(0, 1, 3, 4, 2)
        arrays.append(tvm.runtime.tensor(np.array(layout.pack(i, value), order="C")))
    out_shape = [int(d) for d in kernel.params[-1].ty.shape]
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))
    lib = tvm.compile(tvm.IRModule({"main": kernel.with_attr("global_symbol", "main")}), target=SPEC.tvm_target())
    lib["main"](*arrays, out)
    plain = layout.plain([a.numpy() for a in arrays] + [out.numpy()])
    return plain[-1], kernel
