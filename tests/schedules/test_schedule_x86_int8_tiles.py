"""The register tiles the x86 INT8 conv rule chooses (``int8_conv2d.default_config``) and how it threads: tiles
that stay in registers for each step, one channel block of a wide row for an NCHW output, one thread below
``SERIAL_MACS``; each checked against the numpy reference where it runs."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tvm import te

from tvmfuse import targets
from tvmfuse.schedules.computes import int8, int8_ref
from tvmfuse.schedules.x86.intrin import vnni
from tvmfuse.schedules.x86 import int8_conv2d

from helpers import HOST
from helpers.int8_kernels import (AVX512, HOST_BITS, Conv, build, check_conv, codes, conv_kernel, epilogue,
                                  kernel_data, packed_for, run, weight_placeholder)


@pytest.mark.parametrize("channels, out_channels, size, parallel", [(88, 22, 1, False), (200, 50, 1, False),
                                                                    (8, 8, 24, True), (64, 64, 7, True)])
def test_conv2d_below_serial_macs_runs_on_one_thread(channels, out_channels, size, parallel):
    """A squeeze-and-excitation conv on a 1x1 map costs less than waking a second thread: neither the
    repacking nor the conv is parallel. The parallel ones keep both, and the serial one stays bit-exact."""
    x = te.placeholder((1, channels, size, size), "uint8", name="x")
    wt = weight_placeholder((-(-out_channels // 16), -(-channels // 4), 1, 1, 16, 4), "host")
    b, m = te.placeholder((out_channels,), "int32", name="b"), te.placeholder((out_channels,), "float32", name="m")
    ep = epilogue("uint8", "relu", None)
    out = int8.conv2d_compute(x, wt, b, m, out_channels=out_channels, input_zero_point=3, epilogue=ep)
    func = int8_conv2d.apply(int8.prim_func([x, wt, b, m, out]), HOST_BITS, False)
    assert func.script().count("T.parallel") == (2 if parallel else 0)
    rng = np.random.default_rng(2)
    xv = codes(rng, (1, channels, size, size), "uint8", False)
    wv = codes(rng, (out_channels, channels, 1, 1), "int8", False)
    bias, mult, _ = kernel_data(rng, (1, out_channels, size, size), out_channels, None, False)
    args = [xv, packed_for(int8_ref.pack_conv2d_weight(wv), "host"), int8_ref.fold_zero_point(bias, wv, 3), mult]
    ref = int8_ref.conv2d_ref(xv, wv, bias, mult, None, input_zero_point=3, epilogue=ep)
    np.testing.assert_array_equal(run(func, args, out), ref)


def test_byte_pair_step_tiles_one_pixel_of_many_blocks_for_narrow_1x1_convs():
    """The vpmaddubsw step (7-bit weights without VNNI): a 1x1 conv over a map up to 28 wide takes 6 (else 4)
    channel blocks of one pixel; 3x3 convs and wider maps keep the pair tiles; full-range pairs are unchanged."""
    config = int8_conv2d.default_config
    assert config(24, 14, 256, False, exact_pairs=True) == int8_conv2d.Config(6, 1)
    assert config(16, 7, 256, False, stride=2, exact_pairs=True) == int8_conv2d.Config(4, 1)
    assert config(24, 14, 256, False, exact_pairs=True, taps=9) == int8_conv2d.Config(3, 2)
    assert config(9, 56, 256, False, exact_pairs=True) == int8_conv2d.Config(3, 2)
    assert config(24, 14, 256, False, pairs=True) == int8_conv2d.Config(3, 2)


def test_an_nchw_output_takes_one_block_of_a_wide_row():
    """A kernel writing NCHW (float32 for FP32 readers) tiles one channel block of up to 8 pixels (fewer where
    the registers do not hold 8), whatever its step: each channel's pixels are one store. Its rule picks it."""
    config, cfg = int8_conv2d.default_config, int8_conv2d.Config
    assert config(6, 160, 512, True, plain_out=True) == cfg(1, 8)
    assert config(6, 160, 256, False, exact_pairs=True, plain_out=True) == cfg(1, 5)  # 12 ymm: 6 pixels at most
    assert config(6, 14, 512, True, in_channels=32, plain_out=True) == cfg(1, 7)
    case = Conv(32, 96, 16, 1, out="float32")
    func, _ = conv_kernel(case, "host")
    host_vnni = vnni.target_has_vnni(targets.resolve(HOST).tvm_target())
    script = int8_conv2d.apply(func, HOST_BITS, host_vnni).script()
    tile = [int(re.search(rf"for {axis}_1_init in T.unroll\((\d+)\)", script).group(1)) for axis in ("ob", "x")]
    assert tile[0] == 1 and 4 <= tile[1] <= 8, tile  # (channel blocks, pixels) of the register tile
    check_conv(case, "host")


def test_vnni_tiles_avoid_the_spilling_row_tiles():
    """AVX512-VNNI: at most 7 pixels a row tile (2 blocks of 8 spill), and 1x1 convs reading up to 256 channels
    take 6, 4, 3 or 2 blocks of 2-4 pixels first; wider reductions and 3x3 convs keep 2 blocks of the row."""
    config, cfg = int8_conv2d.default_config, int8_conv2d.Config
    assert config(4, 56, 512, True, in_channels=64) == cfg(4, 2)
    assert config(9, 56, 512, True, in_channels=24) == cfg(3, 4)
    assert config(12, 28, 512, True, in_channels=32) == cfg(6, 2)
    assert config(16, 14, 512, True, in_channels=1024) == cfg(2, 7)
    assert config(4, 56, 512, True, taps=9, in_channels=64) == cfg(2, 7)
    assert config(1, 96, 512, True, taps=9, in_channels=8) == cfg(1, 6)
    asm = build(int8_conv2d.apply(conv_kernel(Conv(64, 64, 16, 1), "generic")[0], 512, True), AVX512).mod.inspect_source("asm")
    assert "vpdpbusd" in asm and asm.count("(%rsp)") < 100  # the accumulators stay in registers
