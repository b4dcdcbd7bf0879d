"""The Python API: ``compile`` an ONNX model into a :class:`CompiledModel`, run, benchmark, export."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from . import frontend, opcheck, targets
from .export import build, export_library, kernel_names, make_manifest
from .passes.pipeline import PassRecord, run_graph_passes
from .progress import Steps
from .runtime import Runner, check_cpu_flags, random_inputs
from .tensors import TensorInfo


class CompiledModel:
    """A model compiled for one target.

    Attributes
    ----------
    inputs, outputs : list of TensorInfo
        Names, static shapes and dtypes, in the model's order.
    target : TargetSpec
        The target the model was compiled for.
    mod : tvm.IRModule
        The Relax module after tvmfuse's graph passes (what was built).
    lowered : tvm.IRModule
        The module after the Relax pipeline; its PrimFuncs are the library's kernels.
    stats : dict
        Seconds spent per compile step.
    """

    def __init__(self, executable, mod, lowered, spec: targets.TargetSpec, inputs: Sequence[TensorInfo],
                 outputs: Sequence[TensorInfo], source: str, stats: dict):
        self.executable, self.mod, self.lowered, self.target = executable, mod, lowered, spec
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.source, self.stats = source, stats
        self.record = PassRecord()
        self.tuning_logs: dict | None = None
        self._runner: Runner | None = None

    def _get_runner(self) -> Runner:
        if self._runner is None:
            if self.target.is_cuda:
                self._runner = Runner(self.executable, self.inputs, self.outputs, device="cuda")
            else:
                check_cpu_flags(targets.required_cpu_flags(self.target),
                                f"model compiled for {self.target.name} ({self.target.config.get('mcpu')})")
                self._runner = Runner(self.executable, self.inputs, self.outputs, device="cpu")
        return self._runner

    def run(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run once on checked inputs; return the outputs as numpy arrays.

        With ``TVMFUSE_OPCHECK=1`` every partition is also checked against the unfused reference.
        """
        if opcheck.enabled() and self.target.is_cpu:
            return opcheck.run_checked(self, inputs)[0]
        return self._get_runner().run(inputs)

    def opcheck(self, inputs: Mapping[str, np.ndarray] | None = None, rtol: float = 1e-4, atol: float = 1e-4):
        """Check every partition against TVM's unfused path on ``inputs`` (seeded random by default).

        Returns the list of :class:`tvmfuse.opcheck.PartitionCheck`; raises ``OpCheckError`` at the first
        partition whose output differs beyond tolerance.
        """
        inputs = inputs if inputs is not None else random_inputs(self.inputs)
        return opcheck.run_checked(self, inputs, rtol=rtol, atol=atol)[1]

    def partition_report(self):
        """What the partitioner grouped and left out (see ``tvmfuse partition``)."""
        from .partition_report import build_report

        return build_report(self.record.partitioned, self.record.rejections, self.source, self.target.name)

    def benchmark(self, inputs: Mapping[str, np.ndarray] | None = None, repeat: int = 50, warmup: int = 5) -> dict:
        """Median/min/max/mean latency in ms over ``repeat`` runs (seeded random inputs by default)."""
        return self._get_runner().benchmark(inputs, repeat=repeat, warmup=warmup)

    def manifest(self) -> dict:
        """The manifest :meth:`export` writes beside the library."""
        return make_manifest(self.target, self.inputs, self.outputs, self.source,
                             {"kernels": kernel_names(self.lowered), "tuning_logs": self.tuning_logs})

    def export(self, path: str | Path) -> Path:
        """Write the shared library ``path`` (.so) and its JSON manifest beside it."""
        return export_library(self.executable, path, self.manifest())

    def __repr__(self) -> str:
        ins = ", ".join(str(i) for i in self.inputs)
        return f"CompiledModel({self.source!r}, target={self.target.name!r}, inputs=[{ins}])"


def _relax_output_infos(mod, names: Sequence[str]) -> list[TensorInfo]:
    """Output shapes/dtypes from the Relax signature; -1 marks a dim only known at run time (e.g. NonZero)."""
    from tvm import ir, tirx

    def dim(d) -> int:
        return int(d) if isinstance(d, (int, tirx.IntImm)) else -1

    ret = mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, ir.TupleType) else [ret]
    infos = []
    for name, f in zip(names, fields):
        shape = tuple(dim(d) for d in f.shape) if f.shape is not None else (-1,) * max(int(f.ndim), 0)
        infos.append(TensorInfo(name, shape, str(f.dtype)))
    return infos


def _load_logs(logs, spec: targets.TargetSpec):
    """The tuning-log database for ``spec`` and its manifest entry; (None, None) when there is nothing to apply."""
    if logs is False or not spec.is_cpu:
        return None, None
    from .tune.database import LogStore, default_root

    store = LogStore(default_root() if logs is None or logs is True else logs, spec)
    db, report = store.load()
    if report.records == 0 and not report.skipped:
        return None, None
    return db, report.to_json()


def compile(model, target="x86-avx512", shapes: Mapping[str, Sequence[int]] | None = None,
            progress: bool = False, logs=None) -> CompiledModel:
    """Compile an ONNX model for a target.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        A path to an ``.onnx`` file, a ModelProto, or ``"zoo:NAME"`` for a built-in model.
    target : str, dict or TargetSpec
        A registered name (``tvmfuse.targets.names()``) or a raw TVM target dict.
    shapes : dict, optional
        Static shapes for inputs with dynamic dims, e.g. ``{"input": (1, 3, 224, 224)}``.
    progress : bool
        Print one line per compile step on stderr.
    logs : str, os.PathLike, None or False
        Tuning logs to apply: a logs folder (its ``<target>/`` subfolder is read), None for the default
        (``$TVMFUSE_TUNING_LOGS`` or the repository's ``tuning_logs/``), False for none. Bad lines are
        skipped with a warning; the manifest records the folder and the kernels tuned records scheduled.

    Returns
    -------
    CompiledModel
    """
    spec = targets.resolve(target)
    steps = Steps(3, enabled=progress)
    with steps.step("import ONNX"):
        imported = frontend.import_model(model, shapes)
    tvm_target = spec.tvm_target()
    record = PassRecord()
    with steps.step("partition and fuse"):
        mod = run_graph_passes(imported.mod, spec, tvm_target, record)
    database, log_info = _load_logs(logs, spec)
    applied: list[str] = []
    with steps.step(f"build for {spec.name}"):
        executable, lowered = build(mod, spec, database, applied)
    names = [o.name for o in imported.outputs]
    outputs = _relax_output_infos(mod, names)
    cm = CompiledModel(executable, mod, lowered, spec, imported.inputs, outputs, imported.source, steps.times)
    cm.record = record
    if log_info is not None:
        cm.tuning_logs = dict(log_info, applied=applied)
    return cm
