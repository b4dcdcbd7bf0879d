"""`tvmfuse bundle`: a runtime-only TVM + tvmfuse that runs exported libraries where TVM is not installed."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tvmfuse.runtime.bundle import BundleError, runtime_bundle
from tvmfuse.cli import main as cli_main

CHILD = r"""
import json, sys
sys.modules["onnx"] = None  # the deploy machine has no onnx either
import numpy as np
import tvm, tvmfuse
model = tvmfuse.load(sys.argv[1])
x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
out = model.run({"input": x})[0]
print(json.dumps({"out": out.tolist(), "tvm": tvm.__file__, "tvmfuse": tvmfuse.__file__,
                  "compiler_mapped": "libtvm_compiler" in open("/proc/self/maps").read()}))
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    path = tmp_path_factory.mktemp("bundle") / "site"
    return path, runtime_bundle(path)


def test_bundle_leaves_the_compiler_out(bundle):
    path, made = bundle
    files = {p.name for p in path.rglob("*") if p.is_file()}
    assert "libtvm_runtime.so" in files and "libtvm_compiler.so" not in files
    assert (path / "tvmfuse" / "runtime" / "__init__.py").is_file() and (path / "tvmfuse" / "targets.py").is_file()
    assert made["bytes"] < 60 * 2**20, made
    assert made["python"] == f"cpython-{sys.version_info.major}{sys.version_info.minor}"


def test_bundle_runs_an_exported_library(bundle, tiny_compiled, tiny_exported, tmp_path):
    path = str(bundle[0])
    env = dict(os.environ, PYTHONPATH=path, TVM_USE_RUNTIME_LIB="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tiny_exported)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tvm"].startswith(path) and result["tvmfuse"].startswith(path)
    assert not result["compiler_mapped"]
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    np.testing.assert_allclose(np.array(result["out"], "float32"), tiny_compiled.run({"input": x})[0], rtol=1e-6)


def _wheel(path, names):
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "")
    return path


def test_ffi_from_another_pythons_wheel(tmp_path):
    wheel = _wheel(tmp_path / "ffi.whl", ["tvm_ffi/__init__.py", "tvm_ffi/core.cpython-312-x86_64-linux-gnu.so",
                                         "tvm_ffi/include/x.h", "apache_tvm_ffi-0.1.dist-info/METADATA"])
    made = runtime_bundle(tmp_path / "site", wheel)
    assert made["python"] == "cpython-312"
    assert (tmp_path / "site" / "tvm_ffi" / "core.cpython-312-x86_64-linux-gnu.so").exists()
    assert not (tmp_path / "site" / "tvm_ffi" / "include").exists()


def test_bad_inputs_are_named(tmp_path):
    with pytest.raises(BundleError, match="wheel not found: .*missing.whl"):
        runtime_bundle(tmp_path / "a", tmp_path / "missing.whl")
    with pytest.raises(BundleError, match="not an apache-tvm-ffi wheel"):
        runtime_bundle(tmp_path / "b", _wheel(tmp_path / "other.whl", ["numpy/__init__.py"]))
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip")
    with pytest.raises(BundleError, match="junk.whl: cannot read"):
        runtime_bundle(tmp_path / "c", junk)
    (tmp_path / "file").write_text("x")
    with pytest.raises(BundleError, match="not a folder"):
        runtime_bundle(tmp_path / "file")


def test_cli(tmp_path, capsys):
    assert cli_main(["bundle", str(tmp_path / "site")]) == 0
    assert "TVM_USE_RUNTIME_LIB=1" in capsys.readouterr().out
    assert cli_main(["bundle", str(tmp_path / "x"), "--ffi-wheel", str(tmp_path / "none.whl")]) == 2


def test_a_plain_python_with_numpy_alone_runs_a_library_from_the_bundle(bundle, tiny_exported, tmp_path):
    """A fresh virtual environment (no pip, nothing installed) with numpy alone on its path: the CLI's
    ``run`` works from the bundle (it failed on tvm_ffi's ``import typing_extensions`` before the bundle
    carried it)."""
    import site
    import venv

    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    numpy_only = tmp_path / "numpy_only"
    numpy_only.mkdir()
    for folder in site.getsitepackages():
        for name in ("numpy", "numpy.libs"):
            if (Path(folder) / name).is_dir() and not (numpy_only / name).exists():
                (numpy_only / name).symlink_to(Path(folder) / name)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "TVM_USE_RUNTIME_LIB": "1",
           "PYTHONPATH": f"{bundle[0]}{os.pathsep}{numpy_only}"}
    python = tmp_path / "venv" / "bin" / "python"
    bare = subprocess.run([str(python), "-c", "import typing_extensions"], env=dict(env, PYTHONPATH=str(numpy_only)),
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode != 0  # the environment really lacks it
    proc = subprocess.run([str(python), "-m", "tvmfuse", "run", str(tiny_exported)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "output: shape (1, 10) float32" in proc.stdout
