"""Target registry, raw target dicts and host capability checks."""

import pytest
import tvm

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
    assert spec.backend_name == "x86" and spec.vector_bits() == 512 and spec.config["mcpu"] == "sapphirerapids"
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
    return cm, cm.kernel_source("asm")


def _nchw_depthwise_kernel_asm(target) -> str:
    """An NCHW INT8 depthwise kernel (8 channels, 16x16, 3x3 stride 2, relu) scheduled for AVX512-VNNI and
    built for ``target``: LLVM forms its int16 multiply-adds into vpdpwssd, some on ymm registers."""
    from tvm import te

    from tvmfuse.schedules.computes import int8
    from tvmfuse.schedules.computes import int8_depthwise as int8_dw
    from tvmfuse.schedules.x86 import int8_depthwise

    x, w = te.placeholder((1, 8, 16, 16), "uint8", name="x"), te.placeholder((8, 1, 3, 3), "int8", name="w")
    b, m = te.placeholder((8,), "int32", name="b"), te.placeholder((8,), "float32", name="m")
    out = int8_dw.depthwise_conv2d_compute(x, w, b, m, strides=2, padding=1, input_zero_point=3,
                                           epilogue=int8.Epilogue.make("uint8", 3, 0.05, "relu"))
    func = int8_depthwise.apply(int8.prim_func([x, w, b, m, out]), 512, True).with_attr("global_symbol", "main")
    return tvm.compile(tvm.IRModule({"main": func}), target=target).mod.inspect_source("asm")


def test_x86_avx512_int8_code_has_no_vex_vnni_amx_or_fp16():
    # For mcpu=sapphirerapids LLVM emits an NCHW depthwise kernel's ymm multiply-adds as VEX-encoded AVX-VNNI
    # vpdpwssd (which form it takes follows its register allocation), which AVX-512 CPUs without AVX-VNNI
    # (Ice Lake, Zen 4) fault on; x86-avx512 turns it off.
    import re

    spr = _nchw_depthwise_kernel_asm(tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assert re.search(r"\{vex\}\s*vpdp", spr)
    ours = _nchw_depthwise_kernel_asm(targets.resolve("x86-avx512").tvm_target())
    assert "vpdpwssd" in ours and not re.search(r"\{vex\}", ours)
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
    assert spec.backend().runs_on_this_cpu()
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
        assert spec.backend_name == "cuda" and spec.config["arch"] == arch
        # The host code runs on whatever CPU drives the GPU.
        assert spec.host == {"kind": "llvm"}
        assert not spec.backend().runs_on_this_cpu()


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
    asm = cm.kernel_source("asm")
    assert "zmm" in asm
    if not cm.target.backend().runs_on_this_cpu():
        with pytest.raises(TargetError, match="lacks"):
            cm.run({"input": None})


@pytest.mark.avx512
def test_avx512_runs_when_host_has_it(tiny_compiled):
    import numpy as np

    cm = tvmfuse.compile("zoo:tiny_convnet", target="x86-avx512")
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")}
    np.testing.assert_allclose(cm.run(x)[0], tiny_compiled.run(x)[0], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ TVMFUSE_HOST_CPU: this machine as another CPU


@pytest.mark.parametrize("cpu", sorted(targets.KNOWN_CPU_FEATURES))
def test_runtime_only_cpu_table_is_what_llvm_says(cpu):
    assert targets.KNOWN_CPU_FEATURES[cpu] == targets._llvm_cpu_features(cpu)


def _stand_in_for_avx2(monkeypatch):
    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        pytest.skip("this CPU cannot stand in for an AVX2 one: it lacks AVX2 or FMA")
    monkeypatch.setenv(targets.HOST_CPU_ENV, "znver3")


def test_host_cpu_env_makes_x86_host_an_avx2_cpu(monkeypatch):
    _stand_in_for_avx2(monkeypatch)
    host = targets.resolve("x86-host")
    assert targets.host_mcpu() == host.config["mcpu"] == "znver3" and host.vector_bits() == 256
    assert host.backend().runs_on_this_cpu()
    avx512 = targets.resolve("x86-avx512")
    assert not avx512.backend().runs_on_this_cpu()
    assert "avx512f" in avx512.backend().why_not_runnable()
    assert not {"avx512f", "avx512_vnni", "avx512bw"} & targets.host_cpu_flags()
    assert targets.host_cpu_flags() <= targets._cpuinfo_flags()


def test_host_cpu_env_refuses_an_x86_avx512_library_at_load(monkeypatch, tmp_path):
    _stand_in_for_avx2(monkeypatch)
    cm = tvmfuse.compile("zoo:tiny_convnet", target="x86-avx512")
    cm.export(tmp_path / "m.so")
    with pytest.raises(TargetError, match="lacks: .*avx512f"):
        tvmfuse.load(tmp_path / "m.so")


def test_host_cpu_env_with_a_cpu_llvm_does_not_know_is_one_line(monkeypatch):
    monkeypatch.setenv(targets.HOST_CPU_ENV, "pentium9")
    with pytest.raises(TargetError, match="TVMFUSE_HOST_CPU='pentium9' is not a CPU LLVM knows"):
        targets.host_cpu_flags()


def test_host_cpu_env_cannot_name_a_richer_cpu(monkeypatch):
    have = targets._cpuinfo_flags()
    richer = [cpu for cpu, feats in targets.KNOWN_CPU_FEATURES.items()
              if any(targets._CPUINFO_FLAG[f] not in have for f in feats)]
    if not richer:
        pytest.skip("this CPU has every feature of every CPU in the table")
    monkeypatch.setenv(targets.HOST_CPU_ENV, richer[0])
    with pytest.raises(TargetError, match="which this machine lacks"):
        targets.host_mcpu()


def test_host_cpu_env_reaches_a_runtime_only_process(monkeypatch):
    import os
    import subprocess
    import sys

    _stand_in_for_avx2(monkeypatch)
    code = ("import tvm_ffi, sys; from tvmfuse import targets; import tvmfuse.runtime; "
            "assert 'tvm.relax' not in sys.modules; print(' '.join(sorted(targets.host_cpu_flags() & "
            "{'avx2', 'fma', 'avx512f', 'avx512_vnni'})))")
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["avx2", "fma"]
