"""Reading the CUDA source TVM generates: kernels, their static shared memory, a known bug pattern."""

from __future__ import annotations

import re


def kernels(source: str) -> dict:
    """Kernel name -> its body, from the CUDA source."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?'
                                                            r'(\w+)\([^;{]*\)\s*{', source)]
    ends = [s for s, _ in starts[1:]] + [len(source)]
    return {name: source[start:end] for (start, name), end in zip(starts, ends)}


def built_together(funcs: list, target, alone_on_error: bool = True) -> list[str]:
    """The CUDA source of each scheduled PrimFunc of ``funcs``, built (nvcc) as one module: one nvcc run for
    many kernels instead of one each (about a second of nvcc's start and headers each). Kernel ``i`` is
    ``k{i}`` (TVM names its device functions ``k{i}_kernel...``); where the whole build fails, each kernel is
    built alone, so the error names the one nvcc refuses (``alone_on_error``; else the error is raised)."""
    import tvm

    mod = tvm.IRModule({f"k{i}": f.with_attr("global_symbol", f"k{i}") for i, f in enumerate(funcs)})
    try:
        with target:
            source = tvm.compile(mod, target=target).mod.imports[0].inspect_source()
    except Exception:  # noqa: BLE001 - built again one by one below, for the error of the kernel at fault
        if len(funcs) == 1 or not alone_on_error:
            raise
        return [built_together([f], target)[0] for f in funcs]
    bodies = kernels(source)
    return ["".join(body for name, body in bodies.items() if re.fullmatch(rf"k{i}_kernel(_\d+)?", name))
            for i in range(len(funcs))]


def shared_bytes(body: str) -> int:
    sizes = {"float": 4, "float2": 8, "half": 2, "half2": 4, "int": 4, "signed char": 1, "unsigned char": 1}
    total = 0
    for dtype, count in re.findall(r"__shared__ (?:alignas\(\d+\) )?(float2|float|half2|half|int|signed char|"
                                   r"unsigned char) \w+\[(\d+)\]", body):
        total += sizes[dtype] * int(count)
    return total


def guarded_partial_sums(source: str) -> list[str]:
    """Kernels where a partial sum (an ``rf`` register) is initialised only under a thread-index guard but
    enters the cross-thread sum unguarded: the threads outside the guard add an uninitialised register.
    That is how a squeeze-excite conv reading 24 channels with 32 lanes gave mobilenet_v3_large
    run-dependent outputs on the H100. (A partial sum read back under the same guard, through an
    initialised ``in_thread`` value, is fine.)"""
    found, kernel, previous, guarded = [], None, "", set()
    for line in source.splitlines():
        head = re.search(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", line)
        if head:
            kernel, guarded = head.group(1), set()
        init = re.search(r"(\w*rf\w*)\[\d+\] = 0x0p\+0f", line)
        if init and re.search(r"if \(.*threadIdx", previous):
            guarded.add(init.group(1))
        read = re.search(r"red_buf\w*\[\d+\] = (\w+)\[", line)
        if read and read.group(1) in guarded:
            found.append(kernel)
        previous = line
    return sorted(set(found))


def dynamic_shared_bytes(func, target) -> int:
    """Bytes of dynamic shared memory the kernel of the scheduled PrimFunc ``func`` launches with: the size of
    the buffer TVM merges every ``shared.dyn`` allocation into (the CUDA source declares it unsized)."""
    import tvm

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main").with_attr("target", target)})
    with target, tvm.transform.PassContext(opt_level=3):
        lowered = tvm.tirx.get_tir_pipeline("default")[0](mod)
    found = re.findall(r'buf_dyn_shmem = T\.alloc_buffer\(\((\d+),\), "uint8", scope="shared\.dyn"', lowered.script())
    return max((int(n) for n in found), default=0)


# The zoo models whose kernels are checked for sm_80 as well as sm_90: the A100's SM count changes only tile and
# grid choices, and these cover every kind of partition the zoo has (depthwise with squeeze-excitation, grouped
# convs, 7x7 depthwise with layer norms, dense layers, resizes and concatenations). CRNN, the slowest to schedule,
# is left to sm_90: its convs are of these kinds and its LSTM's GEMVs take no SM count.
SM80_MODELS = ["mobilenet_v3_large", "resnext50_32x4d", "convnext_tiny", "yolov8n"]


def zoo_builds() -> list:
    """Every zoo model as a pytest parameter for tests that have nvcc build a whole model (10-30 s each on 2
    cores): those of :data:`SM80_MODELS` run in every suite, the others are marked ``slow`` (their partitions'
    kinds are among those four's; every model's partitions are still checked for their rules without nvcc)."""
    import pytest

    from tvmfuse import zoo

    return [pytest.param(n, marks=() if n in SM80_MODELS else pytest.mark.slow) for n in zoo.names()]
