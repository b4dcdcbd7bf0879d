"""Kernel names and keys follow the kernel alone: a model with one layer changed keeps every other kernel's name,
and its compile builds only the new kernel, every other object coming from the cache."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import tvmfuse
from helpers import HOST, make_model, ort_run
from tvmfuse.passes import kernel_names
from tvmfuse.runtime import random_inputs

WIDTHS = [3, 8, 16, 24, 32]


def _chain(changed: str | None = None) -> "onnx.ModelProto":  # noqa: F821
    """Four conv + ReLU layers of different widths (each its own kernel), then two ReduceMax over different axes
    and a Softmax (kernels TVM makes and numbers); the first ReLU replaced by ``changed``."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i, (cin, cout) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        weights.append(numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype("float32") * 0.3,
                                               f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node(changed if i == 0 and changed else "Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    nodes += [helper.make_node("ReduceMax", [x], ["m0"], axes=[2], keepdims=0),
              helper.make_node("ReduceMax", ["m0"], ["m1"], axes=[2], keepdims=0),
              helper.make_node("Softmax", ["m1"], ["y"], axis=1)]
    return make_model(nodes, [("x", [1, 3, 12, 12])], [("y", [1, 32])], weights, opset=17)


def _kernels(cm) -> set:
    return set(cm.kernel_info["kernels"])


def test_a_changed_layer_renames_no_other_kernel_and_rebuilds_only_its_own(tmp_path):
    first = tvmfuse.compile(_chain(), HOST, cache=tmp_path, whole=False)
    changed = tvmfuse.compile(_chain("Sigmoid"), HOST, cache=tmp_path, whole=False)
    new = _kernels(changed) - _kernels(first)
    assert [kernel_names.kind(n) for n in new] == ["tvmfuse_conv2d_sigmoid"], new
    # the other three convs kept their names (numbered names shifted: tvmfuse_conv2d_relu1 became ..._relu)
    assert len(_kernels(changed) & _kernels(first)) == len(_kernels(changed)) - 1
    assert changed.cache_info["from_cache"] == changed.cache_info["kernels"] - 1
    x = random_inputs(changed.inputs)
    np.testing.assert_allclose(changed.run(x)[0], ort_run(_chain("Sigmoid"), x)[0], rtol=1e-5, atol=1e-6)


def test_tvm_kernels_are_named_by_kind_and_digest():
    cm = tvmfuse.compile(_chain(), HOST)
    names = _kernels(cm)
    assert all(kernel_names.STABLE.search(n) for n in names), names
    kinds = sorted(kernel_names.kind(n) for n in names)
    assert kinds.count("tvmfuse_conv2d_relu") == 4 and any("max" in k for k in kinds), kinds
    assert not any(k[-1].isdigit() for k in kinds if "conv2d" not in k), kinds  # TVM's numbers gone: max, not max1


@pytest.mark.parametrize("name,kind", [("cast16", "cast"), ("max1", "max"), ("conv2d_nchw", "conv2d_nchw"),
                                       ("fused_cast16_reshape12_multiply", "fused_cast_reshape_multiply")])
def test_stable_names_drop_tvm_numbers_but_not_an_op_s_digits(name, kind):
    from tvm.script import tirx as T

    @T.prim_func
    def func(a: T.Buffer((4,), "float32")):
        a[0] = T.float32(1)

    stable = kernel_names.stable_name(name, func)
    assert kernel_names.kind(stable) == kind and kernel_names.STABLE.search(stable)
    assert stable == kernel_names.stable_name(name, func.with_attr("global_symbol", "other"))  # its code only


def test_a_kernel_two_partitions_make_is_found_whichever_comes_first(tmp_path):
    # UNet has partitions that lower to one kernel (Relax's builder keeps the first); with its middle ReLU
    # changed, another partition came first and a key of the partition missed that kernel's object.
    from tvmfuse import zoo
    from tvmfuse.frontend.load import load_model

    proto, _ = load_model("zoo:unet")
    shapes = zoo.default_shapes("unet")
    first = tvmfuse.compile(proto, HOST, shapes=shapes, cache=tmp_path, whole=False)
    relus = [n for n in proto.graph.node if n.op_type == "Relu"]
    relus[len(relus) // 2].op_type = "LeakyRelu"
    changed = tvmfuse.compile(proto, HOST, shapes=shapes, cache=tmp_path, whole=False)
    new = _kernels(changed) - _kernels(first)
    assert len(new) == 1 and changed.cache_info["from_cache"] == changed.cache_info["kernels"] - 1, \
        (new, changed.cache_info)


def _sum_kernel(block: str):
    """A row sum whose block is named ``block`` (TVM's legalization names blocks after the Relax value,
    ``lv1335_red``; its buffers after other names)."""
    import tvm

    return tvm.script.from_source(f"""
# from tvm.script import tirx as T
@T.prim_func(s_tir=True)
def main(x: T.Buffer((4, 64), "float32"), out: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 64):
        with T.sblock("{block}"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                out[vi] = T.float32(0)
            out[vi] = out[vi] + x[vi, vk]
""")


def test_value_numbers_in_block_names_are_keyed_only_where_a_tuning_record_could_find_blocks_by_them():
    from tvmfuse.cache import kernels, schedules

    a, b, other = _sum_kernel("lv1335_red"), _sum_kernel("lv1337_red"), _sum_kernel("lv1335_total")
    target, context = HOST, kernels.pass_options()
    # an object (a scheduled kernel: a block's name changes no instruction) and a schedule with no record
    assert kernels.kernel_key(a, target, context) == kernels.kernel_key(b, target, context)
    assert schedules.schedule_key(a, target, context, "") == schedules.schedule_key(b, target, context, "")
    # a record's trace finds its blocks by name: the name decides whether it replays
    assert schedules.schedule_key(a, target, context, "[r]") != schedules.schedule_key(b, target, context, "[r]")
    # only the value number goes: a block of another name is another key
    assert kernels.kernel_key(a, target, context) != kernels.kernel_key(other, target, context)
    assert '"lv_red"' in kernels.unnamed_json(a, block_numbers=True)
    assert '"lv1335_red"' in kernels.unnamed_json(a)
