"""Exported libraries load and run with the TVM runtime alone (no compiler library mapped)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tvmfuse
from tvmfuse.errors import ModelLoadError, TargetError
from tvmfuse.runtime.integrity import manifest_digest

CHILD = r"""
import json, sys
import numpy as np
import tvmfuse
model = tvmfuse.load(sys.argv[1])
x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
out = model.run({"input": x})[0]
bench = model.benchmark(repeat=3, warmup=1)
maps = open("/proc/self/maps").read()
print(json.dumps({"out": out.tolist(), "median_ms": bench["median_ms"],
                  "compiler_mapped": "libtvm_compiler" in maps, "runtime_mapped": "libtvm_runtime" in maps,
                  "relax_imported": "tvm.relax" in sys.modules}))
"""


def test_load_in_subprocess_without_compiler(tiny_compiled, tiny_exported):
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tiny_exported)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["compiler_mapped"] and result["runtime_mapped"] and not result["relax_imported"]
    assert result["median_ms"] > 0
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    np.testing.assert_allclose(np.array(result["out"], "float32"), tiny_compiled.run({"input": x})[0], rtol=1e-6)


def test_load_errors(tiny_exported, tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        tvmfuse.load(tmp_path / "missing.so")
    lonely = tmp_path / "lonely.so"
    lonely.write_bytes(tiny_exported.read_bytes())
    with pytest.raises(ModelLoadError, match="manifest lonely.json is missing"):
        tvmfuse.load(lonely)
    lonely.with_suffix(".json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not a tvmfuse manifest"):
        tvmfuse.load(lonely)
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a shared library")
    junk.with_suffix(".json").write_text(tiny_exported.with_suffix(".json").read_text())
    with pytest.raises(ModelLoadError, match="junk.so: size does not match its manifest"):
        tvmfuse.load(junk)
    # A manifest from before the checksums (format_version 1) loads unchecked, with a warning; the loader's
    # own error then names the file.
    legacy = json.loads(tiny_exported.with_suffix(".json").read_text())
    del legacy["library"], legacy["digest"]
    legacy["format_version"] = 1
    junk.with_suffix(".json").write_text(json.dumps(legacy))
    with pytest.warns(UserWarning, match="records no checksum"), \
            pytest.raises(ModelLoadError, match="cannot load library"):
        tvmfuse.load(junk)


def test_load_refuses_cpu_features_the_host_lacks(tiny_exported, tmp_path):
    # A library built for a richer CPU must fail with a message, not SIGILL.
    lib = tmp_path / "future.so"
    lib.write_bytes(tiny_exported.read_bytes())
    manifest = json.loads(tiny_exported.with_suffix(".json").read_text())
    manifest["cpu_flags"] = ["avx2", "imaginary_isa_flag"]
    manifest["digest"] = manifest_digest(manifest)  # as if exported so, not edited afterwards
    lib.with_suffix(".json").write_text(json.dumps(manifest))
    with pytest.raises(TargetError, match="imaginary_isa_flag"):
        tvmfuse.load(lib)


def test_unknown_device(tiny_exported):
    with pytest.raises(TargetError, match="unknown device"):
        tvmfuse.load(tiny_exported, device="tpu")


def test_library_exported_after_a_run_loads_without_scope_warnings(tiny_compiled, tmp_path):
    """A VM records an empty memory scope per constant in the executable it runs, and TVM's loader logs one
    ``Scope Loaded:`` warning per recorded entry. tvmfuse links the library once, before the first run, and
    exports those bytes: nothing is recorded in it, so not even TVM's bare loader prints them (``load`` would
    drop them anyway, see the next test)."""
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
    tiny_compiled.run({"input": x})
    path = tiny_compiled.export(tmp_path / "ran.so")
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    raw = subprocess.run([sys.executable, "-c", f"import tvm; tvm.runtime.load_module({str(path)!r})"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert raw.returncode == 0 and "Scope Loaded:" not in raw.stderr, raw.stderr[-1000:]
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Scope Loaded" not in proc.stderr, proc.stderr[-1000:]


def test_scope_warning_filter_passes_other_lines_on(capfd):
    from tvmfuse.runtime.tvm_log import quiet_tvm_warnings

    with quiet_tvm_warnings():
        os.write(2, b"[12:00:00] executable.cc:340: Warning: Scope Loaded:\nsomething else went wrong\n")
    err = capfd.readouterr().err
    assert "Scope Loaded" not in err and "something else went wrong" in err


CUDA_CHILD = r"""
import ctypes, sys
if sys.argv[2]:
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)  # the build stub standing in for an NVIDIA driver
import tvmfuse
try:
    tvmfuse.load(sys.argv[1])
except Exception as e:
    print(type(e).__name__, "|", e)
"""


def test_a_runtime_only_process_maps_tvms_cuda_runtime_for_a_cuda_library(tmp_path):
    """``TVM_USE_RUNTIME_LIB=1`` maps libtvm_runtime alone, which has no loader for CUDA modules: every CUDA
    library failed with "a loader of that name is not registered" (seen on an H200). tvmfuse now maps
    ``libtvm_runtime_cuda.so`` itself. With the driver stub standing in for a driver the library loads and the
    device check is what stops it; without any driver, a one-line error names the CUDA runtime."""
    from helpers import conv_relu
    from tvmfuse import cuda_driver

    stub = cuda_driver.cache_dir() / "cuda-stub" / "libcuda.so.1"
    if cuda_driver.state["driver"] != "stub" or not stub.exists() or not cuda_driver.cuda_codegen_ready():
        pytest.skip("needs the CUDA build stub (a machine with nvcc and no NVIDIA driver)")
    lib = tvmfuse.compile(conv_relu(batch=1), target="cuda-sm90").export(tmp_path / "conv.so")
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    seen = {}
    for name, preload in (("stub", str(stub)), ("none", "")):
        proc = subprocess.run([sys.executable, "-c", CUDA_CHILD, str(lib), preload], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        seen[name] = proc.stdout.strip().splitlines()[-1]
    assert seen["stub"].startswith("TargetError | device 'cuda' requested but no CUDA GPU is visible"), seen
    assert seen["none"].startswith("ModelLoadError | cannot load TVM's CUDA runtime"), seen
    assert "libcuda.so.1" in seen["none"] and "\n" not in seen["none"]
