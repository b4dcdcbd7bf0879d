"""bench/vcpu_probe.py: one figure per core for each round, and the line real_models.py prints."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import vcpu_probe  # noqa: E402


def test_probe_times_every_core_at_once():
    (round_,) = vcpu_probe.probe(rounds=1)
    assert len(round_) == len(os.sched_getaffinity(0))
    assert all(gflops > 0 and gbs > 0 for gflops, gbs in round_)


def test_summary_gives_each_round_its_spread():
    line = vcpu_probe.summary([[(100.0, 16.0), (80.0, 8.0)], [(99.0, 15.0), (99.0, 15.0)]])
    assert line.endswith("100/80 (1.25) 16.0/8.0 (2.00), 99/99 (1.00) 15.0/15.0 (1.00)")
