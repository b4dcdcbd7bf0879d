"""A CUDA-scheduled kernel run on the CPU, against the same kernel unscheduled: the schedule's index arithmetic,
layouts and vector lanes checked where no GPU is (``tests/schedules/test_cuda_on_cpu.py``, and every kernel of
random graphs in ``bench/fuzz_cuda.py --simulate``).

The scheduled PrimFunc's thread bindings become serial loops (the threads of a block then run one after
another, each phase for all threads before the next, as ``__syncthreads`` orders them), its shared, thread-local
and fragment buffers global ones, its software pipelines plain loops; LLVM builds it. A tensor-core schedule is
made without its final tensorize steps for it (``Backend.serial_check_schedule``): every stage tiled, placed and
laid out, the fragment loads, products and stores left as the loops the instructions replace. The blocks run in
order and in reverse: a block that stores into outputs another block owns leaves its values there in one of the
two.

What this checks: that the schedule computes what the compute says for every output (a tile's bounds, a
layout's transform, a vector's lanes, a strip's and a halo's offsets) and that blocks store only their own
outputs. What it cannot: races between the threads of a block, a thread-local buffer read by another thread
(here all threads share it), the instructions themselves (tensor cores, shuffles in code written by hand) and
what nvcc makes of the source; those need the GPU round.
"""

from __future__ import annotations

import re

import numpy as np


def serial(func, reverse_blocks: bool = False):
    """``func`` (a scheduled CUDA PrimFunc) with every thread binding a serial loop and every buffer global.
    ``reverse_blocks``: the thread blocks run last to first. A block that writes outputs another block owns
    (a race on a GPU) leaves its values there when it runs after the owner; one order or the other shows it."""
    import tvm

    text = func.script()
    if reverse_blocks:
        text = _reversed_blocks(text)
    text = re.sub(r'T\.thread_binding\((\d+), thread="[\w.]+"(, annotations=\{[^}]*\})?\)', r"T.serial(\1\2)", text)
    text = re.sub(r'scope="(shared|shared\.dyn|local|warp|wmma\.\w+)"', 'scope="global"', text)
    # Lowering hints that only hold for GPU memory: a shared tile staged through registers, a software pipeline
    # over K (a reordering of the same loads and products, TVM's to keep right).
    text = re.sub(r', "tirx\.manifest_shared_memory_local_stage": 1', "", text)
    text = re.sub(r', annotations=\{"software_pipeline_order": \[[^\]]*\], "software_pipeline_stage": \[[^\]]*\]\}', "",
                  text)
    parsed = tvm.script.from_source(text)
    return parsed["main"] if isinstance(parsed, tvm.IRModule) else parsed


def _reversed_blocks(text: str) -> str:
    """The script with each ``blockIdx`` loop run last to first: ``for b in T.thread_binding(N, ...)`` becomes
    ``for b_r in range(N)`` around ``for b in range(b_order[b_r], b_order[b_r] + 1)``, the order read from a
    table (a parameter put first, filled by :func:`block_orders`). ``b`` stays a loop variable (``T.axis.remap``
    takes only variables), and its range read from a table is opaque to TVM's buffer compaction, which took an
    extent of -32 from an index computed as ``(13 - r) // 7 * 16``."""
    lines, tables = text.split("\n"), []
    for number, line in enumerate(lines):
        found = re.match(r'( *)for (\w+) in T\.thread_binding\((\d+), thread="blockIdx\.\w+"[^:]*\):$', line)
        if not found:
            continue
        indent, var, extent = found.group(1), found.group(2), found.group(3)
        tables.append(f'{var}_order: T.Buffer(({extent},), "int32")')
        end = number + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > len(indent)):
            end += 1
        body = ["    " + row if row.strip() else row for row in lines[number + 1:end]]
        lines[number:end] = [f"{indent}for {var}_r in range({extent}):",
                             f"{indent}    for {var} in range({var}_order[{var}_r], {var}_order[{var}_r] + 1):"] + body
    text = "\n".join(lines)
    return text.replace("def main(", "def main(" + "".join(t + ", " for t in tables), 1)


def build(func):
    """``func`` built for this CPU (a serial one of :func:`serial`, or any kernel written for LLVM)."""
    import tvm

    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")


def random_args(func, seed: int = 0) -> list[np.ndarray]:
    """Arrays for ``func``'s parameters (the last its output): normal floats, integers across their range."""
    rng = np.random.default_rng(seed)
    arrays = []
    for param in func.params:
        shape, dtype = [int(d) for d in param.ty.shape], str(param.ty.dtype)
        if dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            arrays.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


def outputs(func, args: list[np.ndarray]) -> np.ndarray:
    """``func`` built for the CPU and run on ``args``: its last parameter's value."""
    import tvm

    tensors = [tvm.runtime.tensor(a) for a in args]
    build(func)["main"](*tensors)
    return tensors[-1].numpy()


def block_orders(func) -> list[np.ndarray]:
    """The block-order tables of ``serial(..., reverse_blocks=True)``'s parameters: each index last to first."""
    return [np.arange(int(p.ty.shape[0]), dtype="int32")[::-1].copy() for p in func.params
            if p.name.endswith("_order")]


def _differences(unscheduled, scheduled, seed: int) -> tuple[float, float]:
    """(largest absolute difference of the scheduled kernel, its blocks in order and reversed, from the
    unscheduled one; the unscheduled output's largest magnitude)."""
    args = random_args(unscheduled, seed)
    want = outputs(unscheduled, args).astype("float64")
    if not want.size:
        return 0.0, 0.0
    forward, backward = serial(scheduled), serial(scheduled, reverse_blocks=True)
    diff = max(float(np.max(np.abs(want - outputs(forward, args).astype("float64")))),
               float(np.max(np.abs(want - outputs(backward, block_orders(backward) + args).astype("float64")))))
    return diff, float(np.max(np.abs(want)))


def mismatch(unscheduled, scheduled, seed: int = 0) -> float:
    """Largest absolute difference between the scheduled kernel run serially, its blocks in order and reversed,
    and the unscheduled one."""
    return _differences(unscheduled, scheduled, seed)[0]


def relative_mismatch(unscheduled, scheduled, seed: int = 0) -> float:
    """:func:`mismatch` over the largest magnitude of the unscheduled kernel's output."""
    diff, scale = _differences(unscheduled, scheduled, seed)
    return diff / max(scale, 1e-30)


def kernel_mismatches(mod, spec) -> dict:
    """Every tvmfuse partition kernel of ``mod`` (a module after the graph passes) scheduled by ``spec``'s backend
    for a serial run (``Backend.serial_check_schedule``) and run on the CPU: kernel name -> (who scheduled it,
    relative mismatch against the kernel unscheduled); empty for a backend whose kernels run here as built."""
    import tvm

    from tvmfuse.passes.pipeline import fused_module
    from tvmfuse.schedules.backend import SCHEDULED_BY

    found = {}
    backend = spec.backend()
    for gv, func in fused_module(mod, spec, spec.tvm_target()).functions_items():
        if not (isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint.startswith("tvmfuse_")):
            continue
        scheduled = backend.serial_check_schedule(func)
        if scheduled is not None and SCHEDULED_BY in scheduled.attrs:
            found[gv.name_hint] = (str(scheduled.attrs[SCHEDULED_BY]), relative_mismatch(func, scheduled))
    return found
