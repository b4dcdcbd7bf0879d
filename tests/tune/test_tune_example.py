"""The scripting entry (``from tvmfuse.tune import tune``) and docs/examples/tune_two_models.py: two models tuned
into one log folder, the shared kernel tuned once, both compiled with the folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from helpers import conv_relu
from helpers.tune import wide_conv

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "tune_two_models.py"


def test_the_short_entry_is_the_tuner():
    import tvmfuse.tune
    from tvmfuse.tune import TuningError, tune
    from tvmfuse.tune import tuner

    assert tune is tuner.tune and issubclass(TuningError, Exception)
    with pytest.raises(AttributeError, match="no attribute 'tunes'"):
        tvmfuse.tune.tunes  # noqa: B018 - the attribute access is the test


@pytest.mark.slow
def test_example_tunes_two_models_into_one_folder_and_compiles_with_it(tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(conv_relu(batch=1), a)
    onnx.save(wide_conv(), b)
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), "--logs", str(logs), "--trials", "2",
                           "--repeat", "3"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stdout
    assert lines[0].startswith(f"{a}: 1 kernels") and lines[1].startswith(f"{b}: 1 kernels")
    assert all("kernels from the logs; median" in line for line in lines[2:])
    assert lines[2].startswith(f"{a}: 1 kernels from the logs") and lines[3].startswith(f"{b}: 1 kernels from")
    (folder,) = [p for p in logs.iterdir() if p.is_dir()]
    assert folder.name.startswith("x86-host-")
