"""Tuning loads only its target's tensor intrinsics (``tvmfuse.tvmscript.light_tensor_intrin``).

A MetaSchedule ``TuneContext`` imports ``tvm.s_tir.tensor_intrin``, whose ``__init__`` parses ~500 TVMScript
intrinsics of every GPU and DSP TVM supports, each parse walking the stack with ``inspect``: 18 s in a fresh
process on a 2-core Zen 4, 54 s forty frames deep (as under pytest). Each test runs in a fresh interpreter, so
what another test imported cannot hide an import.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.tune import run_script

TESTS = str(Path(__file__).resolve().parents[1])
PACKAGE = "tvm.s_tir.tensor_intrin"

_LOADED = f"""
import json, sys
sys.path.insert(0, {TESTS!r})
PACKAGE = {PACKAGE!r}
def loaded():
    return sorted(m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + "."))
"""


def _last_json(proc) -> list:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_tuning_run_loads_only_the_x86_intrinsics(tmp_path):
    proc = run_script(_LOADED + """
from helpers.tune import HOST, MODEL
from tvmfuse.tune.tuner import tune
report = tune(MODEL, HOST, trials=2, logs=sys.argv[1], trials_per_iter=2, progress=False)
assert report.tasks[0].trials >= 1
print(json.dumps(loaded()))
""", tmp_path / "logs")
    assert _last_json(proc) == [PACKAGE, f"{PACKAGE}.x86"]


def test_a_light_package_still_imports_any_target_on_request():
    """TuneContext works on the light package, and another target's module still imports explicitly."""
    proc = run_script(_LOADED + """
from tvmfuse.tvmscript import light_tensor_intrin
from helpers.tune import default_entry, task_of
light_tensor_intrin("x86")
default_entry(task_of())  # creates a TuneContext and its design space
before = loaded()
import tvm.s_tir.tensor_intrin.arm_cpu
print(json.dumps([before, "arm_cpu" in dir(sys.modules[PACKAGE]), loaded()]))
""")
    before, attached, after = _last_json(proc)
    assert before == [PACKAGE, f"{PACKAGE}.x86"]
    assert attached and f"{PACKAGE}.arm_cpu" in after and f"{PACKAGE}.hexagon" not in after


def test_cuda_tuning_loads_the_cuda_intrinsics_alone():
    proc = run_script(_LOADED + """
from tvmfuse.tvmscript import light_tensor_intrin
light_tensor_intrin("cuda")
print(json.dumps(loaded()))
""")
    loaded = _last_json(proc)
    assert f"{PACKAGE}.cuda" in loaded
    assert not {f"{PACKAGE}.{name}" for name in ("x86", "arm_cpu", "hexagon", "rocm", "metal")} & set(loaded)
