"""bench/cuda_kernels.py --bandwidth (issue #50's depthwise bar: 60% of the measured copy bandwidth): the copy
it is held to and the bytes it counts, built here with nvcc; the timing itself needs a GPU (the round)."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import cuda_kernels  # noqa: E402

from tvmfuse import targets  # noqa: E402

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@needs_nvcc
@pytest.mark.parametrize("dtype,vector", [("float32", "float4"), ("float16", "half4")])
def test_the_copy_moves_every_element_four_a_thread(dtype, vector):
    func = cuda_kernels.copy_func(3000, dtype)
    assert [int(p.ty.shape[0]) for p in func.params] == [3072, 3072]  # whole blocks of 256 x 4
    assert cuda_kernels.kernel_bytes(func) == 2 * 3072 * np.dtype(dtype).itemsize
    target = targets.resolve("cuda-sm90").tvm_target()
    with target:  # nvcc takes the architecture from the current target where no GPU is there to ask
        lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
    source = lib.mod.imports[0].inspect_source()
    assert f"*({vector}*)(dst_ptr" in source and f"*({vector}*)(src_ptr" in source


def test_the_bar_takes_the_depthwise_layers_of_56_and_larger():
    layers = [case for kind, case in cuda_kernels._grid().CASES if kind == "depthwise" and case[1] >= 56]
    assert len(layers) >= 4 and {case[1] for case in layers} >= {56, 112}


def test_a_kernel_moves_its_arguments_once():
    from tvm import te

    x = te.placeholder((1, 144, 56, 56), "float16", name="x")
    w = te.placeholder((144, 1, 3, 3), "float16", name="w")
    y = te.compute((1, 144, 56, 56), lambda n, c, i, j: x[n, c, i, j] * w[c, 0, 0, 0], name="y")
    func = te.create_prim_func([x, w, y])
    assert cuda_kernels.kernel_bytes(func) == 2 * (2 * 144 * 56 * 56 + 144 * 9)


@needs_nvcc
@pytest.mark.parametrize("precision,pairs", [("fp16", 2), ("fp32", 1)])
def test_each_layer_is_timed_with_one_and_two_channels_a_thread(precision, pairs):
    from tvmfuse.fuzz.cuda_cpu import outputs, random_args, serial

    case = next(case for kind, case in cuda_kernels._grid().CASES if kind == "depthwise" and case[1] == 56)
    func, chosen, other = cuda_kernels.bandwidth_kernels(case, "cuda-sm90", precision)
    assert chosen == pairs and other is not None
    assert "PaddedInput_shared" in func.script() and "PaddedInput_shared" in other.script()
    args = random_args(func)  # the same layer, only the threads' shares differ
    np.testing.assert_array_equal(outputs(serial(func), args), outputs(serial(other), args))
