"""Quantizing for CPU classes other than this one: x86-avx512 (VNNI), AVX2 without VNNI (7-bit weights on
vpmaddubsw, or 8-bit ones on the int16-pair step, ``weight_bits``), AVX-VNNI; the caution quantize gives
without VNNI. Where the host can run the build, its integers are compared with the host's."""

from __future__ import annotations

import numpy as np
import pytest

import tvmfuse
from tvmfuse import cli
from tvmfuse.schedules.computes import int8

from helpers import HOST
from helpers.quantize import conv_relu_conv, depthwise_5x5, inverted_residual, random_batches


def test_x86_avx512_build_calibrates_here_and_uses_vnni():
    cm = tvmfuse.quantize(conv_relu_conv(), calib=random_batches((1, 3, 8, 8), 2, 3), method="minmax",
                          target="x86-avx512")
    assert cm.target.name == "x86-avx512" and cm.quantization["int8_partitions"] == 2
    assert "vpdpbusd" in cm.kernel_source("asm")


@pytest.mark.parametrize("layout", ["nchw", "blocked"])
@pytest.mark.parametrize("bits", [7, 8])
def test_cpus_without_vnni_give_the_integers_of_vnni_for_the_same_weight_codes(bits, layout, tmp_path):
    """A target without VNNI (an AVX2 Zen 3 here) quantizes conv and dense weights to 7 bits and runs them on
    vpmaddubsw (int8 blocks marked exact); full-range codes (``weight_bits=8``, or a quantized model's own)
    take int16 pairs and vpmaddwd; in NCHW16c the depthwise taps come as int16 pairs either way. Its outputs
    equal, bit for bit, the host build's (VNNI or pairs) with the same codes."""
    from tvmfuse import targets

    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        pytest.skip("this CPU cannot run an AVX2 build")
    model, shape = inverted_residual(), (1, 8, 10, 10)
    calib = random_batches(shape, 4, 2)
    host = tvmfuse.quantize(model, calib=calib, method="minmax", target=HOST, table=tmp_path / "t.json", layout=layout,
                            weight_bits=bits)
    avx2 = tvmfuse.quantize(model, table=tmp_path / "t.json", target={"kind": "llvm", "mcpu": "znver3"}, layout=layout,
                            weight_bits=None if bits == 7 else bits)  # 7: the default there
    assert avx2.quantization["weight_bits"] == bits
    asm = avx2.kernel_source("asm")
    assert "vpmaddwd" in asm and "vpdpbusd" not in asm and "vphaddd" not in asm
    assert ("vpmaddubsw" in asm) == (bits == 7)
    script = avx2.lowered.script()
    assert (int8.EXACT_PAIRS_ATTR in script) == (bits == 7)
    if layout == "blocked":  # the depthwise conv's taps two by two, from interleaved neighbouring pixels
        assert "vpunpcklbw" in asm and '"int16")' in script
    else:
        assert ('"int16")' in script) == (bits == 8)  # the conv kernels' weight parameters
    for batch in random_batches(shape, 2, 7):
        for got, want in zip(avx2.run(batch), host.run(batch)):
            np.testing.assert_array_equal(got, want)


def test_weight_bits_choose_the_codes_and_the_step(tmp_path, capsys):
    """weight_bits=8 on a CPU without VNNI keeps full-range codes (the int16-pair step, and the caution says
    8-bit weights run about as fast as FP32); weight_bits=7 on an AVX-512 VNNI target quantizes conv (and
    dense) weights to [-64, 64] there too; the manifest says which; anything else is refused in one line."""
    import warnings

    from tvmfuse.calibration import CalibrationError

    znver3 = {"kind": "llvm", "mcpu": "znver3"}
    calib = random_batches((1, 8, 10, 10), 2, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        full = tvmfuse.quantize(inverted_residual(), calib=calib, method="minmax", target=znver3, weight_bits=8)
    assert full.quantization["weight_bits"] == 8 and "vpmaddubsw" not in full.kernel_source("asm")
    assert any("with 8-bit weights" in str(w.message) for w in caught)
    seven = tvmfuse.quantize(inverted_residual(), calib=calib, method="minmax", target="x86-avx512", weight_bits=7)
    assert seven.quantization["weight_bits"] == 7 and "vpdpbusd" in seven.kernel_source("asm")
    codes = [c.value.numpy() for c in tvm_constants(seven.mod) if c.value.numpy().dtype == np.int8]
    # the three convs' 16x4 blocks in [-64, 64]; the depthwise taps keep 8 bits
    assert sorted(int(np.abs(c).max()) for c in codes) == [64, 64, 64, 127] and codes[1].ndim == 5
    with pytest.raises(CalibrationError, match="weight_bits must be 7 or 8"):
        tvmfuse.quantize(inverted_residual(), calib=calib, method="minmax", target=HOST, weight_bits=4)
    model = tmp_path / "ir.onnx"
    model.write_bytes(inverted_residual().SerializeToString())
    with pytest.raises(SystemExit) as exit_:
        cli.main(["quantize", str(model), "--calib", "random:1", "--weight-bits", "6", "-o", str(tmp_path / "x.so")])
    assert exit_.value.code == 2 and "--weight-bits" in capsys.readouterr().err


def tvm_constants(mod):
    """Every constant in ``mod``'s main function."""
    from tvm import relax
    from tvm.ir.expr import GenericConst

    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, GenericConst) else None)
    return found


def test_avx_vnni_cpus_take_vnni_blocks_for_convs_and_pairs_for_the_depthwise_taps(tmp_path):
    """Alder Lake and later client cores, Sierra Forest: VNNI on ymm only. Conv2d and dense use 256-bit
    vpdpbusd on the VNNI-packed int8 weights; the depthwise taps come as int16 pairs (the zmm VNNI depthwise
    step needs vpermb). Built here, not run (this CPU may lack the VEX form)."""
    from tvmfuse import targets

    spec = targets.resolve({"kind": "llvm", "mcpu": "alderlake"})
    assert spec.backend().int8_weights == "avxvnni" and spec.backend().int8_caution() == ""
    cm = tvmfuse.quantize(inverted_residual(), calib=random_batches((1, 8, 10, 10), 2, 2), method="minmax",
                          target=spec)
    asm = cm.kernel_source("asm")
    assert "{vex}\tvpdpbusd\t%ymm" in asm and "vpunpcklbw" in asm and "zmm" not in asm
    # 5-wide kernel rows sum in float, as without VNNI (the pair step would waste 3 of 8 taps)
    wide = tvmfuse.quantize(depthwise_5x5(), calib=random_batches((1, 8, 3, 20), 2, 2), method="minmax",
                            target=spec)
    (kernel,) = [f for gv, f in wide.lowered.functions_items() if gv.name_hint.startswith("tvmfuse_int8_depthwise")]
    assert str(kernel.params[1].ty.dtype) == "float32" and "vfmadd231ps\t" in wide.kernel_source("asm")


def test_quantizing_for_a_cpu_without_vnni_says_its_weights_are_7_bit(monkeypatch):
    import warnings

    from tvmfuse import targets

    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        pytest.skip("this CPU cannot stand in for an AVX2 one")
    calib = [{"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = tvmfuse.quantize("zoo:tiny_convnet", calib=calib, method="minmax", target={"kind": "llvm", "mcpu": "znver3"})
    said = [str(w.message) for w in caught if "no VNNI" in str(w.message)]
    assert len(said) == 1 and "tvmfuse compare MODEL --targets custom,custom:int8" in said[0] and "7 bits" in said[0]
    assert "vpmaddubsw" in q.kernel_source("asm")  # the 7-bit weights' step
    assert caught[[str(w.message) for w in caught].index(said[0])].filename == __file__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tvmfuse.quantize("zoo:tiny_convnet", calib=calib, method="minmax", target="x86-avx512")  # VNNI: quiet
    assert not [w for w in caught if "no VNNI" in str(w.message)]
