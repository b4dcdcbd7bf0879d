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


def test_x86_avx512_is_avx512_vnni_without_sapphire_rapids_only_extensions():
    spec = targets.resolve("x86-avx512")
    assert spec.is_cpu and spec.vector_bits() == 512 and spec.config["mcpu"] == "sapphirerapids"
    assert spec.features() == {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512vbmi"}
    # VBMI is Ice Lake's and Zen 4's: a Cascade Lake is refused with a message rather than a SIGILL.
    assert targets.required_cpu_flags(spec) == ["avx2", "avx512_vnni", "avx512bw", "avx512f", "avx512vbmi",
                                                "avx512vl", "fma"]
    # The plain CPU name has them: a library for it needs a Sapphire Rapids.
    spr = targets.resolve({"kind": "llvm", "mcpu": "sapphirerapids"})
    assert {"avxvnni", "avx512fp16", "amx-int8"} <= spr.features()
    assert {"avx_vnni", "avx512_fp16", "amx_int8"} <= set(targets.required_cpu_flags(spr))


def _int8_depthwise_asm(target, layout="blocked"):
    import numpy as np

    from helpers.quantize import depthwise_s2

    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((1, 8, 16, 16)).astype("float32")} for _ in range(2)]
    cm = tvmfuse.quantize(depthwise_s2(), calib=calib, method="minmax", target=target, logs=False, layout=layout)
    assert cm.quantization["int8_partitions"] == 3
    return cm, cm.executable.mod.imports[0].inspect_source("asm")


def test_x86_avx512_int8_code_has_no_vex_vnni_amx_or_fp16():
    # For mcpu=sapphirerapids LLVM emits the NCHW depthwise kernel's multiply-add as VEX-encoded AVX-VNNI
    # vpdpwssd, which AVX-512 CPUs without AVX-VNNI (Ice Lake, Zen 4) fault on; x86-avx512 turns it off.
    import re

    _, spr = _int8_depthwise_asm({"kind": "llvm", "mcpu": "sapphirerapids"}, layout="nchw")
    assert re.search(r"\{vex\}\s*vpdp", spr)
    for layout in ("nchw", "blocked"):
        cm, asm = _int8_depthwise_asm("x86-avx512", layout)
        assert "vpdpbusd" in asm and not re.search(r"\{vex\}", asm)
        assert ("vpermb" in asm) == (layout == "blocked")  # the depthwise taps' transpose (AVX512-VBMI)
        for op in (r"tileloadd\w*", r"tdp\w+", r"ldtilecfg", r"vdpbf16ps", r"vcvtne2?ps2bf16",
                   r"v(add|sub|mul|div|min|max|f\w*madd\w*)ph", r"vcvtps2phx"):
            assert not re.search(rf"\b{op}\b", asm), op


@pytest.mark.avx512
def test_x86_avx512_int8_runs_and_matches_the_host_build():
    import numpy as np

    cm, _ = _int8_depthwise_asm("x86-avx512")
    host, _ = _int8_depthwise_asm("x86-host")
    x = {"x": np.random.default_rng(7).standard_normal((1, 8, 16, 16)).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], host.run(x)[0], rtol=1e-5, atol=1e-5)


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
