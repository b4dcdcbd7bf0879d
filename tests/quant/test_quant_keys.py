"""Tensor keys (tvmfuse.quant.keys): the low module QuantizeGraph and calibration share, re-exported by collect.

The key naming itself is tested through collect in tests/test_quant_collect.py.
"""

from __future__ import annotations

from conftest import HOST
from quantize_helpers import residual_block
from tvmfuse import frontend, targets
from tvmfuse.passes import partition
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes
from tvmfuse.quant import collect, keys


def _partitioned(model):
    spec = targets.resolve(HOST)
    record = PassRecord()
    run_graph_passes(frontend.import_model(model).mod, spec, spec.tvm_target(), record)
    return record.partitioned


def test_collect_reexports_the_keys_module():
    assert collect.observed_tensors is keys.observed_tensors


def test_partition_test_agrees_with_the_pass_layer():
    mod = _partitioned(residual_block(from_input=False))
    funcs = [f for _, f in mod.functions_items()]
    assert any(partition.is_partition(f) for f in funcs)
    assert [keys._is_partition(f) for f in funcs] == [partition.is_partition(f) for f in funcs]

