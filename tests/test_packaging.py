"""The wheel must contain every package folder, and schedules/ must only load as tvmfuse.schedules."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # tests/ is one level below the root


def _config():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    # A folder missing from `packages` is silently left out of the wheel.
    tool = _config()["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for top, folder in tool["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            found.add(".".join((top, *rel)))
    assert found == listed


def test_stack_is_pinned():
    deps = _config()["project"]["dependencies"]
    assert "apache-tvm==0.27.0.post1" in deps
    # tvm-ffi 0.1.15.x segfaults in every MetaSchedule TuneContext.
    assert "apache-tvm-ffi==0.1.14.post0" in deps


def test_xgboost_is_the_cpu_build_and_the_version_is_one():
    from tvmfuse.version import __version__

    config = _config()
    deps = config["project"]["dependencies"]
    # the CPU build: the default wheel pulls NCCL (351 MB) that the cost model never uses
    assert any(d.startswith("xgboost-cpu") for d in deps) and not any(d.startswith("xgboost>") for d in deps)
    assert config["project"]["version"] == __version__


def test_top_level_schedules_import_fails_loudly():
    proc = subprocess.run([sys.executable, "-c", "import schedules"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "must be imported as tvmfuse.schedules" in proc.stderr


def test_schedules_installed_as_subpackage():
    import tvmfuse.schedules

    assert Path(tvmfuse.schedules.__file__).parent == ROOT / "schedules"
