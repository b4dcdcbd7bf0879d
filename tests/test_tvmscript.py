"""``tvmfuse.tvmscript``: TVM's tensor intrinsics imported on demand, with Python's frozen import frames known
to ``inspect`` first (what made ``import tvm.s_tir.tensor_intrin.cuda`` take 20 s); the frames
``inspect.stack()`` reports are the same with and without that."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import inspect, json, sys
    sys.path.insert(0, sys.argv[1])
    if sys.argv[2] == "noted":
        from tvmfuse import tvmscript
        tvmscript._note_frozen_modules()
        assert "<frozen importlib._bootstrap>" in inspect.modulesbyfile
    import probe_module
    print(json.dumps(probe_module.FRAMES))
""")


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe_module.py").write_text(
        "import inspect\nFRAMES = [(f.filename, f.lineno, f.function, f.code_context) for f in inspect.stack()]\n")
    return tmp_path


def _frames(probe, mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, str(probe), mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_noting_the_frozen_frames_changes_no_frame_inspect_reports(probe):
    plain, noted = _frames(probe, "plain"), _frames(probe, "noted")
    assert "<frozen importlib._bootstrap>" in plain and plain == noted


def test_cuda_intrinsics_load_alone_and_register_the_wmma_group():
    code = textwrap.dedent("""
        import sys
        from tvmfuse.tvmscript import light_tensor_intrin
        light_tensor_intrin("cuda")
        from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group
        from tvm.s_tir import TensorIntrin
        group = get_wmma_intrin_group("shared.dyn", "shared.dyn", "float16", "float32", True)
        assert all(TensorIntrin.get(name) is not None for name in group.values())
        assert "tvm.s_tir.tensor_intrin.x86" not in sys.modules and "tvm.s_tir.tensor_intrin.rocm" not in sys.modules
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
