"""What .ci/run relies on: the modules it repeats as an AVX2-only CPU exist, and it repeats them."""

from pathlib import Path

import conftest

ROOT = Path(__file__).resolve().parents[1]


def test_every_host_cpu_module_exists():
    missing = sorted(m for m in conftest.HOST_CPU_MODULES if not (ROOT / "tests" / m).is_file())
    assert not missing


def test_ci_repeats_the_host_cpu_tests_as_an_avx2_cpu():
    script = (ROOT / ".ci" / "run").read_text()
    assert "TVMFUSE_HOST_CPU=$avx2_cpu" in script and '-m "host_cpu and not slow"' in script
    assert '"znver3" if "sse4a"' in script and '"haswell")' in script  # Zen 3 on AMD, Haswell on Intel
