"""fp16 conv2d and dense on tensor cores (``tvmfuse.schedules.cuda.tensor_core``): every tile the rule or a
tuning round may pick lowers and builds (nvcc) with ``wmma`` fragments and within 48 KiB of shared memory, the
default tile fills the SMs, fp16 one-op models take the rule; on a GPU (marker ``gpu``) they match onnxruntime
FP32 within the fp16 tolerance."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import s_tir, tirx

import tvmfuse
from helpers import ort_run
from helpers.cuda_source import built_together, dynamic_shared_bytes, kernels
from tvmfuse import frontend, targets
from tvmfuse.comparison import correctness
from tvmfuse.passes.pipeline import fused_module, run_graph_passes
from tvmfuse.schedules.cuda import conv2d, tensor_core

sys.path.insert(0, str(Path(__file__).parent))
from test_cuda_rules import conv_model, dense_model  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
TARGET = "cuda-sm90"
# (cin, cout, size, window, stride, dilation, epilogue), the CUDA-core rule's grid: stem, 1x1, residual 3x3,
# strided, a 7x7-map 1x1 to 2,048 channels, a dilated 5x5, odd channel counts.
CONV = [(3, 16, 224, 3, 2, 1, "relu6"), (16, 96, 112, 1, 1, 1, "relu6"), (64, 64, 56, 3, 1, 1, "bn_residual"),
        (128, 256, 28, 3, 2, 1, "relu"), (512, 2048, 7, 1, 1, 1, "bn_residual"), (24, 40, 29, 5, 1, 2, "silu"),
        (7, 10, 13, 3, 1, 1, "hardswish"), (256, 256, 14, 3, 1, 1, "relu")]  # the last: K split 8 ways
DENSE = [(16, 100, 7, "relu"), (32, 256, 100, "relu"), (64, 768, 3072, "silu")]


def _kernel(model):
    """The fp16 partition kernel of a one-op model, before scheduling, and the TVM target."""
    spec = targets.resolve(TARGET)
    target = spec.tvm_target()
    spec.backend()  # maps TVM's CUDA runtime, so builds make cubins
    mod = fused_module(run_graph_passes(frontend.import_model(model).mod, spec, target, precision="fp16"), spec, target)
    (func,) = [f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith("tvmfuse_")]
    return func, target


def _cuda_source(func, target) -> str:
    """The CUDA source nvcc built for one scheduled kernel."""
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "k")})
    with target:
        return tvm.compile(mod, target=target).mod.imports[0].inspect_source()


@pytest.fixture(scope="module")
def conv_kernel():
    return _kernel(conv_model(64, 64, 56, 3, epilogue="bn_residual"))  # a GEMM of 3136 x 64 x 576


def test_every_candidate_tile_builds_on_wmma_within_shared_memory(conv_kernel):
    func, target = conv_kernel
    configs = conv2d.kernel_candidates(func, 132)
    assert configs and all(isinstance(c, tensor_core.Config) for c in configs)
    assert configs[0] == tensor_core.default_config(3136, 64, 576, 132)
    assert {c.step_k for c in configs} == {16, 32, 64} and len({(c.tile_i, c.tile_j) for c in configs}) == 8
    scheduled = []
    for config in configs:
        sch = s_tir.Schedule(func)
        assert conv2d.schedule(sch, 132, config), config
        scheduled.append(sch.mod["main"])
        used = dynamic_shared_bytes(scheduled[-1], target)
        assert 0 < used <= config.shared_bytes() <= 48 * 1024, (config, used)
    for config, source in zip(configs, built_together(scheduled, target)):
        assert "nvcuda::wmma::mma_sync" in source and "wmma::accumulator, 16, 16, 16, float" in source, config
        assert f"__launch_bounds__({config.block_warps * 32})" in source, config


def test_the_default_tile_fills_the_sms_and_pads_little():
    # ResNet-50's layers (I pixels, J channels, K): the tile shrinks until every SM has a block.
    for dims in [(3136, 64, 576), (784, 128, 1152), (196, 256, 2304), (49, 512, 4608), (12544, 32, 27)]:
        config = tensor_core.default_config(*dims, sms=132)
        i, j, _ = dims
        blocks = -(-i // config.tile_i) * -(-j // config.tile_j)
        assert blocks >= 132 or (config.tile_i, config.tile_j) == (16, 16), (dims, config)
        assert config.shared_bytes() <= 48 * 1024
    assert tensor_core.default_config(12544, 32, 27).step_k == 32  # K = 27 is one padded step
    assert tensor_core.default_config(3136, 256, 64, sms=108).tile_i * tensor_core.default_config(
        3136, 256, 64, sms=108).tile_j >= 64 * 64


def test_k_is_split_over_warp_groups_where_the_grid_is_short_of_warps():
    # ResNet's 3x3 layers and a late 1x1: one-warp 16x16 blocks walking K alone left an SM one warp; split,
    # the grid has WARPS_PER_SM per SM (or the most the limits allow), each group two steps and 128 of K.
    for dims in [(3136, 64, 576), (784, 128, 1152), (196, 256, 2304), (49, 512, 4608), (49, 2048, 512)]:
        config = tensor_core.default_config(*dims, sms=132)
        i, j, k = dims
        blocks = -(-i // config.tile_i) * -(-j // config.tile_j)
        assert config.warps_k > 1, dims
        assert blocks * config.block_warps >= tensor_core.WARPS_PER_SM * 132 or config.warps_k == 8, (dims, config)
        assert config.block_warps <= tensor_core.MAX_WARPS and config.shared_bytes() <= 48 * 1024
        assert k // config.warps_k >= max(2 * config.step_k, tensor_core.MIN_GROUP_K), (dims, config)
        assert k % config.span_k == 0, (dims, config)  # these K need no padding, split or not
    # A split never pads K further than the unsplit tile, nor takes one-fragment steps (no software pipeline):
    # MobileNetV2's 576 -> 96 at 14x14 splits in 2 with steps of 32, not in 4 (K padded to 640, or steps of 16).
    assert tensor_core.default_config(196, 96, 576) == tensor_core.Config(1, 1, 1, 1, step_k=32, warps_k=2)
    for dims in [(196, 96, 576), (49, 160, 960), (49, 1280, 320), (3136, 64, 576)]:
        config = tensor_core.default_config(*dims)
        assert config.step_k > tensor_core.FRAG and dims[2] % config.span_k == 0, (dims, config)
    # A grid with the warps already, or a K too short to share, is not split.
    assert tensor_core.default_config(12544, 32, 27).warps_k == 1
    assert tensor_core.default_config(3136, 256, 64).warps_k == 1
    assert tensor_core.default_config(2048, 2048, 1024).warps_k == 1


def test_a_split_block_is_one_kernel_summing_its_groups_in_shared_memory():
    func, target = _kernel(conv_model(512, 512, 7, 3, epilogue="bn_residual"))  # 49 x 512 x 4608
    config = conv2d.kernel_candidates(func, 132)[0]
    assert config.warps_k == 8 and config.block_warps == 8
    sch = s_tir.Schedule(func)
    assert conv2d.schedule(sch, 132, config)
    assert 0 < dynamic_shared_bytes(sch.mod["main"], target) <= config.shared_bytes() <= 48 * 1024
    source = _cuda_source(sch.mod["main"], target)
    # One launch whose arguments are the kernel's own tensors: no second kernel, no global workspace.
    (name, body), = kernels(source).items()
    head = body[:body.index("{")]
    assert head.count("_ptr") == 4 and "float*" not in head, head
    assert "__launch_bounds__(256)" in head and body.count("nvcuda::wmma::mma_sync") >= 1
    # Each group stores its accumulator tile, then every thread sums the groups for its outputs.
    assert "nvcuda::wmma::store_matrix_sync" in body and "__syncthreads();" in body.split("store_matrix_sync")[-1]
    assert "for (int ax0 = 0; ax0 < 8; ++ax0)" in body.split("store_matrix_sync")[-1]


def test_a_3x3_conv_walks_k_tap_by_tap_and_a_stem_keeps_its_order():
    # K ordered (kernel row, column, channel): the input's index in the main loop is affine in the step, no
    # division by the 9 taps of a channel; a 3-channel stem (taps would split fragments) keeps (c, r, s).
    import re

    def source(cin, cout, size, window):
        func, target = _kernel(conv_model(cin, cout, size, window, epilogue="bn_residual"))
        sch = s_tir.Schedule(func)
        assert conv2d.schedule(sch, 132)
        return _cuda_source(sch.mod["main"], target)

    windowed = source(64, 64, 56, 3)
    assert not re.search(r"[/%] 9\)", windowed)
    loads = re.findall(r"p0_ptr\[([^\]]*)\]", windowed)
    assert loads and not any("/ 9" in i or "% 9" in i for i in loads)
    assert re.search(r"[/%] 9\)", source(3, 16, 32, 3))  # the stem: K = c * 9 + r * 3 + s as before


@pytest.mark.parametrize("case,fours", [((256, 64, 56, 1), True), ((1024, 256, 14, 1), True),
                                        ((512, 2048, 7, 1), False), ((64, 64, 56, 3), False),
                                        ((128, 256, 28, 1, 2), False)])
def test_a_1x1_conv_loads_its_input_four_pixels_a_thread(case, fours):
    # A 1x1, stride-1 conv reads its NCHW input along the output pixels: on maps of a multiple of 4 pixels the
    # input tile is loaded as half4 (one load instead of four, the index math once), else one half a thread.
    func, target = _kernel(conv_model(*case, epilogue="bn_residual"))
    sch = s_tir.Schedule(func)
    assert conv2d.pixels_in_fours(sch.get(sch.get_sblock(conv2d.ANCHOR))) == fours
    assert conv2d.schedule(sch, 132)
    source = _cuda_source(sch.mod["main"], target)
    assert ("*(half4*)(p0_ptr" in source) == fours
    assert "p0_ptr[" not in source if fours else "p0_ptr[" in source


def test_a_config_whose_accumulator_tile_would_alias_an_operand_tile_is_not_offered():
    # TVM's StorageRewrite puts a float32 tile into a larger dead float16 buffer and then fails to lower the
    # wmma store into it; the accumulator rows are padded to stay larger, or the config is dropped.
    for tile in tensor_core.TILES:
        for step in tensor_core.STEPS_K["float16"]:
            config = tensor_core.Config(*tile, step_k=step)
            pad = config.pad_floats
            if pad is None:
                assert config not in tensor_core.candidates(4096, 4096, 4096)
                continue
            assert pad % 4 == 0 and 4 <= pad < 32
            staged = config.tile_i * (config.tile_j + pad) * 4
            assert staged > max(config.operand_bytes(config.tile_i), config.operand_bytes(config.tile_j))


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(kind, case):
        if (kind, case) not in cache:
            model = conv_model(*case[:6], epilogue=case[6]) if kind == "conv" else dense_model(*case)
            cache[kind, case] = (model, tvmfuse.compile(model, target=TARGET, precision="fp16", logs=False))
        return cache[kind, case]

    return get


CASES = [("conv", c) for c in CONV] + [("dense", c) for c in DENSE]
IDS = [f"{kind}-" + "-".join(str(v) for v in case) for kind, case in CASES]


@pytest.mark.parametrize("kind,case", CASES, ids=IDS)
def test_fp16_conv_and_dense_take_the_tensor_cores(compiled, kind, case):
    _, cm = compiled(kind, case)
    partitions = {k: v for k, v in cm.manifest()["scheduled_by"].items() if k.startswith("tvmfuse_")}
    assert list(partitions.values()) == [f"tvmfuse.cuda.{'conv2d' if kind == 'conv' else 'dense'}"]
    bodies = kernels(cm.executable.mod.imports[0].imports[0].inspect_source())
    (body,) = [b for n, b in bodies.items() if n.startswith(next(iter(partitions)))]
    assert "nvcuda::wmma::mma_sync" in body and "half" in body


@pytest.mark.gpu
@pytest.mark.parametrize("kind,case", CASES, ids=IDS)
def test_fp16_tensor_core_rule_matches_onnxruntime_on_gpu(compiled, kind, case):
    model, cm = compiled(kind, case)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = {"x": np.random.default_rng(1).standard_normal(shape).astype("float32")}
    got, want = cm.run(x)[0], ort_run(model, x)[0]
    error = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
    assert error <= correctness.FP16_REL, error
