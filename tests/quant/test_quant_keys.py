"""Tensor keys (tvmfuse.quant.keys): the low module QuantizeGraph and calibration share, also used by the calibration driver.

The key naming itself is tested through the calibration driver in tests/test_calibration.py.
"""

from __future__ import annotations

from helpers import HOST
from helpers.quantize import residual_block
from tvmfuse import frontend, targets
from tvmfuse.passes import partition
from tvmfuse.passes.pipeline import PassRecord, run_graph_passes
from tvmfuse import calibration
from tvmfuse.quant import keys


def _partitioned(model):
    spec = targets.resolve(HOST)
    record = PassRecord()
    run_graph_passes(frontend.import_model(model).mod, spec, spec.tvm_target(), record)
    return record.partitioned


def test_calibration_uses_the_keys_module():
    assert calibration.observed_tensors is keys.observed_tensors


def test_partition_test_agrees_with_the_pass_layer():
    mod = _partitioned(residual_block(from_input=False))
    funcs = [f for _, f in mod.functions_items()]
    assert any(partition.is_partition(f) for f in funcs)
    assert [keys._is_partition(f) for f in funcs] == [partition.is_partition(f) for f in funcs]

