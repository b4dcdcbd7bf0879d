"""A model's outputs with tvmfuse's graph passes and NCHW partition kernels (the computes CUDA schedules,
unscheduled) built for LLVM: the computes' numerics checked on a machine without a GPU."""

from __future__ import annotations

import numpy as np


def cpu_outputs(model, precision: str, inputs: dict, shapes=None) -> list[np.ndarray]:
    import tvm
    from tvm import relax

    from tvmfuse import frontend
    from tvmfuse.passes.pipeline import PassRecord, run_graph_passes

    target = tvm.target.Target("llvm")
    imported = frontend.import_model(model, shapes)
    mod = run_graph_passes(imported.mod, None, target, PassRecord(), blocked=False, precision=precision)
    with target:
        vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(inputs[i.name]) for i in imported.inputs])
    return [o.numpy() for o in ([out] if hasattr(out, "numpy") else out)]
