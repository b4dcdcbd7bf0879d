"""Target registry, raw target dicts and host capability checks."""

import pytest

import tvmfuse
from tvmfuse import targets
from tvmfuse.errors import TargetError


def test_registry_names():
    assert {"x86-avx512", "x86-host", "cuda-sm80", "cuda-sm90"} <= set(targets.names())


def test_unknown_name_lists_known_ones():
    with pytest.raises(TargetError) as e:
        targets.resolve("x86-avx1024")
    for name in targets.names():
        assert name in str(e.value)


def test_x86_avx512_has_vnni_and_amx():
    spec = targets.resolve("x86-avx512")
    assert spec.is_cpu and spec.vector_bits() == 512
    assert {"avx512f", "avx512vnni", "amx-int8"} <= spec.features()
    assert "avx512_vnni" in targets.required_cpu_flags(spec)
    # No kernel executes AMX or BF16 instructions (checked below): an Ice Lake or Zen 4 runs the code.
    assert not {"amx_int8", "amx_bf16", "avx512_bf16"} & set(targets.required_cpu_flags(spec))


def test_avx512_int8_build_has_no_amx_bf16_or_vex_vnni():
    # What _NOT_EMITTED promises: a quantized x86-avx512 build (VNNI kernels and MetaSchedule-free defaults)
    # holds no AMX tile, BF16 or FP16 instruction, and its dot products use 512-bit EVEX vpdpbusd only (a
    # ymm/xmm one could be re-encoded as AVX-VNNI, which AVX-512 CPUs such as Zen 4 lack).
    import re

    import numpy as np

    rng = np.random.default_rng(0)
    calib = [{"input": rng.standard_normal((1, 3, 32, 32)).astype("float32")} for _ in range(2)]
    cm = tvmfuse.quantize("zoo:tiny_convnet", calib=calib, method="minmax", target="x86-avx512", logs=False)
    asm = cm.executable.mod.imports[0].inspect_source("asm")
    dots = re.findall(r"vpdpbus[dw]s?\s+[^\n]*", asm)
    assert dots and all("%zmm" in d and "%ymm" not in d and "%xmm" not in d for d in dots)
    for op in (r"tileloadd\w*", r"tdp\w+", r"ldtilecfg", r"vdpbf16ps", r"vcvtne2?ps2bf16",
               r"v(add|sub|mul|div|min|max|f\w*madd\w*)ph", r"vcvtps2phx"):
        assert not re.search(rf"\b{op}\b", asm), op


def test_x86_host_runs_here():
    spec = targets.resolve("x86-host")
    assert targets.host_can_run(spec)
    assert spec.vector_bits() in (256, 512)


def test_host_mcpu_from_flags_for_intel_and_llvm_name_for_amd():
    spr = frozenset({"avx512f", "avx512_vnni", "amx_int8"})
    assert targets.mcpu_for(spr, "rocketlake") == "sapphirerapids"  # LLVM's guess in a VM loses AMX
    assert targets.mcpu_for(frozenset({"avx512f", "avx512_vnni"}), "icelake-server") == "cascadelake"
    assert targets.mcpu_for(frozenset({"avx512f"}), "skylake-avx512") == "skylake-avx512"
    assert targets.mcpu_for(frozenset({"avx512f", "avx512_vnni"}), "znver4") == "znver4"
    assert targets.mcpu_for(frozenset({"avx2", "fma"}), "znver3") == "znver3"


def test_cuda_targets_have_generic_host():
    for name, arch in (("cuda-sm80", "sm_80"), ("cuda-sm90", "sm_90")):
        spec = targets.resolve(name)
        assert spec.is_cuda and spec.config["arch"] == arch
        # The host code runs on whatever CPU drives the GPU.
        assert spec.host == {"kind": "llvm"}
        assert not targets.host_can_run(spec)


def test_raw_dict():
    spec = targets.resolve({"kind": "llvm", "mcpu": "znver3"})
    assert spec.name == "custom" and spec.features() >= {"avx2", "fma"}
    assert str(spec.tvm_target().kind) == "llvm"
    cuda = targets.resolve({"kind": "cuda", "arch": "sm_86"})
    assert cuda.host == {"kind": "llvm"}
    with pytest.raises(TargetError, match="kind"):
        targets.resolve({"kind": "vulkan"})
    with pytest.raises(TargetError):
        targets.resolve(42)


def test_avx512_build_uses_zmm_registers(tiny_compiled):
    # Structural: compiles anywhere; only running it needs AVX-512.
    cm = tvmfuse.compile("zoo:tiny_convnet", target="x86-avx512")
    asm = cm.executable.mod.imports[0].inspect_source("asm")
    assert "zmm" in asm
    if not targets.host_can_run(cm.target):
        with pytest.raises(TargetError, match="lacks"):
            cm.run({"input": None})


@pytest.mark.avx512
def test_avx512_runs_when_host_has_it(tiny_compiled):
    import numpy as np

    cm = tvmfuse.compile("zoo:tiny_convnet", target="x86-avx512")
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], tiny_compiled.run(x)[0], rtol=1e-4, atol=1e-4)
