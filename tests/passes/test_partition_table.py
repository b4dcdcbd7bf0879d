"""The pattern table handed to FuseOpsByPattern leaves out patterns calling an op the module never calls
(``passes/partition.applicable``): the partitions and the reasons for refusals stay exactly the same."""

import pytest
import tvm
from tvm.relax.dpl import is_const, is_op, wildcard

from tvmfuse import frontend, patterns
from tvmfuse.passes import partition
from tvmfuse.passes.pipeline import canonicalize_passes


def test_required_ops_of_alternatives_are_what_both_call():
    conv = is_op("relax.nn.conv2d")(wildcard(), is_const())
    either = is_op("relax.nn.relu")(conv) | is_op("relax.clip")(conv, wildcard(), wildcard())
    assert partition.required_ops(either) == {"relax.nn.conv2d"}
    assert partition.required_ops(is_op("relax.add")(either, wildcard())) == {"relax.add", "relax.nn.conv2d"}
    assert partition.required_ops(wildcard()) == frozenset()


@pytest.mark.parametrize("model", ["zoo:mobilenet_v3_large", "zoo:crnn", "zoo:resnet18"])
def test_partitions_as_with_the_whole_table(model, monkeypatch):
    mod = tvm.transform.Sequential(canonicalize_passes())(frontend.import_model(model).mod)
    table = patterns.table()
    kept = partition.applicable(table, partition.called_ops(mod))
    assert 0 < len(kept) < len(table)
    results = []
    for whole in (False, True):
        if whole:
            monkeypatch.setattr(partition, "applicable", lambda table, ops: table)
        rejections: dict = {}
        results.append((partition.Partition(rejections)(mod), rejections))
    tvm.ir.assert_structural_equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]
