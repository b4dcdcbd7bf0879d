"""CUDA targets build on a GPU-less machine (nvcc only); running them needs a GPU."""

import ctypes
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tvmfuse
from helpers.cuda_source import kernels

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _global_kernels(cm) -> set[str]:
    return set(kernels(cm.executable.mod.imports[0].imports[0].inspect_source()))


@pytest.fixture(scope="module")
def cuda_sm90():
    return tvmfuse.compile("zoo:tiny_convnet", target="cuda-sm90")


def test_cuda_export_has_a_kernel_per_fused_function(cuda_sm90, tmp_path):
    lib = cuda_sm90.export(tmp_path / "tiny_cuda.so")
    assert lib.stat().st_size > 0
    kernels = _global_kernels(cuda_sm90)
    functions = cuda_sm90.manifest()["kernels"]
    # Partitions are tvmfuse kernels; everything else is fused by TVM's default path.
    assert any(f.startswith("tvmfuse_conv2d") for f in functions)
    assert any(f.startswith("tvmfuse_depthwise_conv2d") for f in functions)
    missing = [f for f in functions if f"{f}_kernel" not in kernels]
    assert not missing, f"no __global__ kernel for {missing}"


def _kernel_format(library: Path) -> bytes:
    """The format tag TVM serialized the CUDA module with (``cubin``/``fatbin``/``ptx``, or ``cuda`` = source)."""
    data = library.read_bytes()
    at = data.find(struct.pack("<Q", 4) + b"cuda")
    assert at >= 0, "no CUDA module in the library"
    at += 12 + 8  # key, then the blob's length
    (length,) = struct.unpack("<Q", data[at:at + 8])
    return data[at + 8:at + 8 + length]


def test_cuda_library_holds_compiled_kernels(cuda_sm90, tmp_path):
    # A driverless build machine still ships cubins: tvmfuse loads a stub driver (tvmfuse.cuda_driver).
    lib = cuda_sm90.export(tmp_path / "bin.so")
    assert _kernel_format(lib) in (b"cubin", b"fatbin", b"ptx")
    assert json.loads(lib.with_suffix(".json").read_text())["cuda_code"] == "binary"


def _has_real_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    from tvmfuse import cuda_driver

    return cuda_driver.state["driver"] == "real"


@pytest.mark.skipif(_has_real_driver(), reason="an NVIDIA driver is installed: the stub is never used")
def test_without_the_stub_kernels_stay_source_with_a_warning(tmp_path):
    code = ("import warnings, tvmfuse\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    cm = tvmfuse.compile('zoo:tiny_convnet', target='cuda-sm90')\n"
            f"cm.export({str(tmp_path / 'src.so')!r})\n"
            "print([str(x.message) for x in w if 'CUDA runtime' in str(x.message)])\n")
    env = dict(os.environ, TVMFUSE_CUDA_STUB="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "kept as source" in proc.stdout
    assert _kernel_format(tmp_path / "src.so") == b"cuda"
    assert json.loads((tmp_path / "src.json").read_text())["cuda_code"] == "source"


def test_stub_exports_every_driver_symbol_tvm_links(tmp_path):
    import tvm

    from tvmfuse import cuda_driver

    if shutil.which("nm") is None or shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("needs nm and a C compiler")
    runtime = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    out = subprocess.run(["nm", "-D", "--undefined-only", str(runtime)], capture_output=True, text=True).stdout
    needed = sorted({line.split()[-1].split("@")[0] for line in out.splitlines()
                     if re.search(r" cu[A-Z]\w*$", line.split("@")[0])})
    assert needed, "libtvm_runtime_cuda.so links no driver symbols?"
    stub = ctypes.CDLL(str(cuda_driver.build_stub(tmp_path)))
    missing = [name for name in needed if not hasattr(stub, name)]
    assert not missing, f"add {missing} to tvmfuse.cuda_driver.STUB_SOURCE"


def test_cuda_sm80_builds():
    cm = tvmfuse.compile("zoo:tiny_convnet", target="cuda-sm80")
    assert _global_kernels(cm)


@pytest.mark.gpu
def test_cuda_runs_on_gpu(cuda_sm90, tmp_path):
    from helpers import ort_run
    from tvmfuse import zoo

    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")}
    out = tvmfuse.load(cuda_sm90.export(tmp_path / "gpu.so")).run(x)[0]
    np.testing.assert_allclose(out, ort_run(zoo.get("tiny_convnet"), x)[0], rtol=1e-4, atol=1e-4)
