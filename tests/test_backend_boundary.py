"""The backend boundary: a target names its backend, the backend answers the device questions, and adding a
target is one backend package, one TargetSpec line and its rules. A stub Arm backend, defined here and written
nowhere under schedules/, compiles a model through tvmfuse.compile."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from helpers import conv_relu
from tvmfuse import api, targets
from tvmfuse.errors import TargetError
from tvmfuse.schedules import backend as base

ARM = "arm-neoverse-n1"


class _ArmBackend(base.Backend):
    """What an Arm CPU backend would start as: TVM's generic CPU pipeline, no rules of its own yet."""

    name = "armstub"
    device = "cpu"

    def why_not_runnable(self) -> str:
        return "this machine is not an Arm CPU"

    def device_label(self) -> str:
        return "cpu: Arm Neoverse N1"

    def relax_pipeline(self, target, scheduling: list):
        import tvm
        from tvm.relax.backend.cpu_generic import pipeline as cpu

        @tvm.transform.module_pass(opt_level=0, name="armstub.RelaxPipeline")
        def _pipeline(mod, _ctx):
            with target:
                passes = (self.legalize_passes(target) + scheduling + cpu.dataflow_lower_passes(target)
                          + cpu.finalize_passes(target))
                return tvm.transform.Sequential(passes)(mod)

        return _pipeline


@pytest.fixture
def arm_target(monkeypatch):
    package = types.ModuleType("tvmfuse.schedules.armstub")
    package.Backend = _ArmBackend
    monkeypatch.setitem(sys.modules, package.__name__, package)  # the backend folder
    monkeypatch.setitem(targets.TARGETS, ARM, lambda: targets.TargetSpec(  # the TargetSpec line
        ARM, {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}, backend_name="armstub"))
    return ARM


def test_a_stub_arm_target_compiles_with_its_own_backend(arm_target):
    cm = api.compile(conv_relu(batch=1), target=arm_target)
    backend = cm.target.backend()
    assert isinstance(backend, _ArmBackend) and backend is cm.target.backend()  # one Backend per target
    assert cm.target.kind == "llvm" and cm.target.features() == frozenset()  # no x86 feature of LLVM's
    assembly = cm.kernel_source("asm")
    assert "fmla" in assembly and "vfmadd" not in assembly  # the kernels are AArch64 code
    assert backend.device_label() == "cpu: Arm Neoverse N1"
    with pytest.raises(TargetError, match=f"compiled for {ARM} cannot run here: this machine is not an Arm CPU"):
        cm.run({"x": None})  # refused before any of its code is mapped


def test_a_raw_dict_may_name_its_backend(arm_target):
    spec = targets.resolve({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "backend": "armstub"})
    assert spec.backend_name == "armstub" and "backend" not in spec.config
    assert targets.resolve({"kind": "llvm"}).backend_name == "x86"
    assert targets.resolve({"kind": "cuda", "arch": "sm_90"}).backend_name == "cuda"
    with pytest.raises(TargetError, match="names backend 'rocm'; the backends are .*cuda.*x86"):
        targets.resolve({"kind": "llvm", "backend": "rocm"})
    with pytest.raises(TargetError, match="names backend 'computes'"):  # a package of schedules/, not a backend
        targets.resolve({"kind": "llvm", "backend": "computes"})


def test_backends_answer_the_device_questions():
    host, cuda = targets.resolve("x86-host").backend(), targets.resolve("cuda-sm90").backend()
    assert host.can_run() and host.runs_on_this_cpu() and host.build_warning() == ""
    assert host.device_label().startswith("cpu: ")
    assert not cuda.runs_on_this_cpu() and cuda.device_label().startswith("cuda: ")
    assert cuda.can_run() == (cuda.why_not_runnable() == "")


def test_importing_the_schedules_sets_no_environment_and_maps_nothing():
    """``import tvmfuse.schedules`` (and its registry, computes and backends) runs ``tvmfuse/__init__``: it must
    set no variable (TVM's thread count is set by the runtime) and map no CUDA stub (the CUDA backend does, when
    made)."""
    code = ("import os, sys\n"
            "before = dict(os.environ)\n"
            "import tvmfuse.schedules, tvmfuse.schedules.families, tvmfuse.schedules.computes.partition\n"
            "import tvmfuse.schedules.x86, tvmfuse.schedules.cuda\n"
            "from tvmfuse import cuda_driver\n"
            "changed = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k))\n"
            "maps = open('/proc/self/maps').read()\n"
            "print(changed, cuda_driver.state['driver'], 'cuda-stub' in maps, 'tvmfuse.runtime' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "TVM_CUDA_COMPILE_MODE")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[] unchecked False False"


@pytest.mark.parametrize("module", ["tvmfuse.runtime", "tvmfuse.api", "tvmfuse.calibration", "tvmfuse.tune.measure"])
def test_every_path_that_runs_kernels_sets_the_thread_count(module):
    code = f"import os, {module}\nprint(os.environ.get('TVM_NUM_THREADS'))\n"
    env = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().isdigit()


def test_the_api_imports_no_tvm_until_it_compiles():
    """``import tvmfuse.api`` (the CLI's, every workflow's) stays cheap: TVM (0.7 s here) is imported by the
    first compile, not by the import."""
    code = "import sys, tvmfuse.api, tvmfuse.cli\nprint('tvm' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
