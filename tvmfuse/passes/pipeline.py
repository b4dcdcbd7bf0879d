"""Per-target pass lists: the graph passes tvmfuse runs, and the Relax pipeline handed to tvm.compile."""

from __future__ import annotations

from ..targets import TargetSpec


def graph_passes(spec: TargetSpec):
    """Passes run on the imported module before the build, in order."""
    from tvm import relax

    return [relax.transform.FoldConstant()]


def relax_pipeline(spec: TargetSpec, target):
    """The Relax pipeline for ``tvm.compile``.

    On CPU TVM's ``"default"`` pipeline only legalizes (no fusion); the generic CPU pipeline fuses
    elementwise ops into their producers, so it is used instead. CUDA's default pipeline adds dlight
    schedules. Either way the result is a module pass that lowers to VM code plus PrimFuncs.
    """
    from tvm import relax

    return relax.get_default_pipeline(target)


def run_graph_passes(mod, spec: TargetSpec, target):
    """Apply :func:`graph_passes` under the target context."""
    import tvm

    seq = tvm.transform.Sequential(graph_passes(spec), name="tvmfuse.GraphPasses")
    with target, tvm.transform.PassContext(opt_level=3):
        return seq(mod)
