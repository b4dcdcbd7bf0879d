"""bench/amx_check.py: the tile arm (x86-host) and the VNNI arm (x86-avx512) quantized with one table, every
output compared exactly. Without AMX here both arms run VNNI: this checks the script (its arms, table and
comparison), the device round checks the tiles."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import amx_check  # noqa: E402

from tvmfuse import targets  # noqa: E402


@pytest.mark.skipif(not targets.resolve("x86-avx512").backend().runs_on_this_cpu(),
                    reason="this CPU cannot run x86-avx512 code (the VNNI arm)")
def test_both_arms_give_the_same_integers(capsys):
    row = amx_check.check("tiny_convnet", repeat=6)
    assert row["outputs differing"] == 0
    assert float(row["x86-host / VNNI"].rstrip("x")) > 0
    assert amx_check.main(["--models", "tiny_convnet", "--repeat", "6"]) == 0
    assert "outputs differing" in capsys.readouterr().out
