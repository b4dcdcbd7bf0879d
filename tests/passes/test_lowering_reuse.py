"""Less work for the same lowering: the pattern table handed to FuseOpsByPattern leaves out patterns calling an op
the module never calls (``passes/partition.applicable``), layout transform kernels are made once per shape."""

import pytest
import tvm
from tvm.relax.dpl import is_const, is_op, wildcard

from tvmfuse import frontend, patterns
from tvmfuse.passes import partition
from tvmfuse.passes.pipeline import canonicalize_passes


def test_required_ops_are_those_of_one_alternative_or_the_other():
    conv, relu, clip, add = "relax.nn.conv2d", "relax.nn.relu", "relax.clip", "relax.add"
    anchor = is_op(conv)(wildcard(), is_const())
    either = is_op(relu)(anchor) | is_op(clip)(anchor, wildcard(), wildcard())
    assert partition.required_ops(either) == {frozenset({conv, relu, (conv, relu)}),
                                              frozenset({conv, clip, (conv, clip)})}
    biased = is_op(add)(anchor, is_const()) | anchor
    assert partition.required_ops(is_op(relu)(biased)) == {
        frozenset({conv, add, relu, (conv, add), (add, relu)}), frozenset({conv, relu, (conv, relu)})}
    assert partition.required_ops(wildcard()) == {frozenset()}


def test_a_pattern_whose_ops_the_module_calls_unchained_is_left_out():
    """MobileNetV2 calls add, clip, multiply and divide, but no clip reads an add of a constant and no multiply
    reads a clip: the hardswish entries cannot match there; relu6 (a clip reading the conv or its bias add) can."""
    mod = tvm.transform.Sequential(canonicalize_passes())(frontend.import_model("zoo:mobilenet_v2").mod)
    facts = partition.module_facts(mod)
    assert {"relax.nn.conv2d", "relax.clip", ("relax.add", "relax.clip")} <= facts
    names = {entry.name for entry in partition.applicable(patterns.table(), facts)}
    assert "tvmfuse.conv2d_clip" in names and "tvmfuse.conv2d_hardswish" not in names
    ops_only = {fact for fact in facts if isinstance(fact, str)}
    assert "tvmfuse.conv2d_hardswish" in {entry.name for entry in partition.applicable(patterns.table(), ops_only)} \
        or "relax.multiply" not in ops_only


@pytest.mark.parametrize("model, int8", [("zoo:mobilenet_v3_large", False), ("zoo:crnn", False),
                                         ("zoo:resnet18", False), ("zoo:yolov8n", False), ("zoo:convnext_tiny", False),
                                         ("zoo:mobilenet_v3_large", True), ("zoo:yolov8n", True)])
def test_partitions_as_with_the_whole_table(model, int8, monkeypatch):
    mod = tvm.transform.Sequential(canonicalize_passes(int8=int8))(frontend.import_model(model).mod)
    table = patterns.table(int8=int8)
    kept = partition.applicable(table, partition.module_facts(mod))
    assert 0 < len(kept) < len(table) or int8  # the INT8 table's activations are those of MobileNetV3
    results = []
    for whole in (False, True):
        if whole:
            monkeypatch.setattr(partition, "applicable", lambda table, ops: table)
        rejections: dict = {}
        results.append((partition.Partition(rejections, int8)(mod), rejections))
    tvm.ir.assert_structural_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]


def test_layout_transform_kernels_made_once_per_shape(monkeypatch):
    """Lowering reuses the to_plain/to_blocked kernels it made for a shape (``passes/layout._KERNELS``): a second
    lowering of a model makes none of them again and gives the same module as one made from scratch."""
    from tvmfuse import targets
    from tvmfuse.passes import layout
    from tvmfuse.passes.pipeline import run_graph_passes

    spec = targets.resolve("x86-host")
    mod = frontend.import_model("zoo:mobilenet_v2").mod
    made = []
    real = layout.layout_kernel
    monkeypatch.setattr(layout, "layout_kernel", lambda *a, **k: made.append(1) or real(*a, **k))
    lowered = []
    for _ in range(2):
        monkeypatch.setattr(layout, "_KERNELS", {})  # the first lowering, as in a fresh process
        lowered.append(run_graph_passes(mod, spec, spec.tvm_target()))
    first = len(made) // 2
    assert 0 < first < 34  # fewer than MobileNetV2's blocked kernels: outputs of one shape share one
    run_graph_passes(mod, spec, spec.tvm_target())
    assert len(made) - 2 * first < first // 2  # only kernels not made by shape (a blocked pooling's)
    tvm.ir.assert_structural_equal(lowered[0], lowered[1])
