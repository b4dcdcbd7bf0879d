"""``tvmfuse tune``: tune a model's kernels with MetaSchedule + XGBoost into the per-target tuning logs.

Tasks are the kernels of the compiled module in the state compile applies logs to (after TVM's fusion): our
partition kernels, tuned through their backend's templates (e.g. ``schedules/x86/templates.py``), and the
kernels of TVM's default path, tuned with MetaSchedule's default rules. A workload already in the logs is never tuned again,
whatever model it came from. Tasks are tuned one after the other, each to ``trials`` measured candidates,
sharing one XGBoost cost model; after each task its best candidate is checked against the default schedule
and only then written to the shared log.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

from .. import frontend, targets
from ..schedules import families
from ..schedules.backend import kernel_of
from ..passes.pipeline import PassRecord, fused_module, run_graph_passes
from . import validate
from .database import LogStore, default_root
from .measure import (Progress, RPCSpec, TuningError, close_runner, light_tensor_intrin, make_builder, make_runner,
                      progress_callback, target_runs_here)
from .workers import reaping_workers, workers_without
from .runs import StagingRun

# MetaSchedule's package logger: its loggers, and those of every task, hang under it.
MS_LOGGER = "tvm.s_tir.meta_schedule"


@dataclasses.dataclass
class Task:
    """One distinct workload: a kernel module, how often the model calls it, its structural hash."""

    name: str
    mod: object
    weight: int
    key: str
    family: str | None = None


@dataclasses.dataclass
class TaskResult:
    """What happened to one task: ``status`` is "in logs", "tuned", "default kept" or "rejected"."""

    name: str
    status: str
    trials: int = 0
    tuned_us: float | None = None
    default_us: float | None = None
    detail: str = ""


@dataclasses.dataclass
class TuneReport:
    """The outcome of :func:`tune`: per-task results, the log folder, records written, seconds."""

    logs: str
    tasks: list
    records_written: int
    seconds: float

    def table(self) -> str:
        """Markdown table, one row per task."""
        rows = ["| task | status | trials | default us | tuned us | speed-up |", "|---|---|---|---|---|---|"]
        for t in self.tasks:
            fmt = (lambda v: f"{v:.1f}" if v is not None else "-")
            gain = f"{t.default_us / t.tuned_us:.2f}x" if t.tuned_us and t.default_us else "-"
            rows.append(f"| {t.name} | {t.status} | {t.trials} | {fmt(t.default_us)} | {fmt(t.tuned_us)} | {gain} |")
        return "\n".join(rows)


def extract_tasks(model, spec, shapes=None, precision: str = "fp32", consts=None, table=None) -> list[Task]:
    """The distinct kernels of ``model`` compiled for ``spec`` in ``precision`` (deduplicated structurally), but
    the layout transforms between NCHW and NCHW[b]c and the blocked pooling kernels. ``consts``: pinned inputs,
    as for ``tvmfuse.compile``. ``table`` (a ``CalibrationTable``): the model quantized with it, as
    ``tvmfuse.quantize(table=...)`` builds it (an INT8 kernel's epilogue holds the table's zero points and
    bounds, so its tuning records apply to libraries quantized with the same table)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    imported = frontend.import_model(model, shapes, consts=consts, **frontend.target_options(spec.backend()))
    target = spec.tvm_target()
    quantize = None
    if table is not None:
        from ..passes.int8.quantize import QuantizeGraph

        quantize = QuantizeGraph(table, spec)  # quantize's default layout, as the library will be built
    mod = fused_module(run_graph_passes(imported.mod, spec, target, PassRecord(), quantize=quantize,
                                        precision=precision), spec, target)
    tasks = []
    for extracted in ms.relax_integration.extract_tasks(mod, target):
        task_mod = extracted.dispatched[0]
        family = kernel_of(task_mod["main"])
        if family in families.FIXED_KERNELS:
            continue  # a copy at a partition boundary or a blocked pooling: its fixed schedule is all there is
        tasks.append(Task(extracted.task_name, task_mod, int(extracted.weight),
                          str(tvm_ffi.structural_hash(task_mod)), family))
    return tasks


def _context(task: Task, spec, run: StagingRun, seed: int, space_size: int | None):
    from tvm.s_tir import meta_schedule as ms

    space, strategy = "post-order-apply", "evolutionary"
    if space_size is not None:
        space = spec.backend().space_generator()
        # A template space is small (tens of schedules) and has no mutators: a smaller population, and giving
        # up sooner on finding unmeasured ones, saves minutes of re-sampling per task.
        strategy = ms.search_strategy.EvolutionarySearch(population_size=64, init_min_unmeasured=min(16, space_size),
                                                         max_fail_count=2, genetic_num_iters=2,
                                                         genetic_max_fail_count=2)
    logger = _task_logger(str(run.path), task.name)
    return ms.TuneContext(mod=task.mod, target=spec.tvm_target(), space_generator=space,
                          search_strategy=strategy, task_name=task.name, logger=logger,
                          rand_state=seed, num_threads=targets._cores()).clone()


def _task_logger(work_dir: str, name: str):
    """MetaSchedule's logger for one task, writing under ``work_dir``.

    MetaSchedule logs every batch at INFO on stdout; its files under the run folder keep it all. Its console
    handler takes the package logger's level when the loggers are (re)configured, so the level is set before
    and after. Configuring them rebuilds the package logger from ``logging.config.dictConfig``, which names
    every handler already on it: a handler with no name (``None.format`` fails) or one it did not create (an
    unknown name) stops the tuning. Such handlers belong to whoever embeds tvmfuse (an application, a test
    runner), so they are set aside while MetaSchedule configures and put back after.
    """
    from tvm.s_tir import meta_schedule as ms

    package = logging.getLogger(MS_LOGGER)
    package.setLevel(logging.WARNING)
    foreign = [h for h in package.handlers if not (h.get_name() or "").startswith(MS_LOGGER + ".")]
    for handler in foreign:
        package.removeHandler(handler)
    try:
        (logger,) = ms.logging.get_loggers_from_work_dir(work_dir, [name])
    finally:
        for handler in foreign:
            package.addHandler(handler)
    for handler in package.handlers:
        if type(handler) is logging.StreamHandler and handler not in foreign:
            handler.setLevel(logging.WARNING)
    return logger


def _schedule_of(record, task: Task):
    from tvm import s_tir

    sch = s_tir.Schedule(task.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def _default_trace(task: Task, ctx, spec, templated: bool = False):
    """The trace of the schedule a compile without logs gives ``task``'s kernel: for a kernel with a template
    the template's first decision (the hand schedule), for every other kernel the backend's default (INT8
    rules, the generic schedule)."""
    if templated:
        return ctx.generate_design_space()[0].trace
    return spec.backend().default_trace(task.mod)


def _accept(task: Task, ctx, db, store: LogStore, spec, device, progress: Progress,
            templated: bool = False) -> TaskResult:
    """Validate the task's best records (best first); write the first correct one, or the default if faster."""
    from tvm.s_tir import meta_schedule as ms

    workload = db.commit_workload(task.mod)
    top = db.get_top_k(workload, 5)
    if not top:
        raise TuningError(f"task {task.name}: no candidate was built and measured "
                          f"(first error: {progress.first_error or 'none reported'}); the builder or runner is "
                          "failing, see the task log under the run folder")
    for rank, record in enumerate(top):
        check = validate.check(_schedule_of(record, task), task.mod, spec, device=device)
        if not check.ok:
            print(f"[tune] {task.name}: candidate {rank + 1} rejected, wrong result ({check.detail})",
                  file=sys.stderr)
            continue
        status = "tuned"
        if check.default_us < check.tuned_us:
            # Record the default itself so the workload counts as tuned (see _default_trace).
            trace = _default_trace(task, ctx, spec, templated)
            record = ms.database.TuningRecord(trace, workload, [check.default_us * 1e-6], spec.tvm_target(),
                                              record.args_info)
            status = "default kept"
        store.append([(workload.as_json(), record.as_json())])
        return TaskResult(task.name, status, progress.task_trials, check.tuned_us, check.default_us)
    return TaskResult(task.name, "rejected", progress.task_trials, detail="every candidate gave wrong results")


def tune(model, target=targets.DEFAULT, trials: int = 64, *, logs=None, resume: bool = False,
         rpc: RPCSpec | None = None, shapes=None, trials_per_iter: int = 16, builder_timeout: float = 120.0,
         progress: bool = True, seed: int = 0, consts=None) -> TuneReport:
    """Tune every kernel of ``model`` for ``target`` that the logs do not hold yet.

    Parameters
    ----------
    model : str, os.PathLike or onnx.ModelProto
        As for :func:`tvmfuse.compile`.
    target : str, dict or TargetSpec
        The target; its logs are ``<logs>/<target key>/``.
    trials : int
        Measured candidates per task.
    logs : str or Path, optional
        Logs folder (default: ``$TVMFUSE_TUNING_LOGS`` or the repository's ``tuning_logs/``).
    resume : bool
        Continue the newest unfinished run for this target: its measured records count as trials done.
    rpc : RPCSpec, optional
        Measure on remote devices through a TVM RPC tracker instead of this machine.
    consts : dict, optional
        Pinned inputs, as for :func:`tvmfuse.compile` (the model compiled with the same values then finds its
        kernels in the logs).
    """
    if trials < 1:
        raise TuningError(f"trials must be at least 1, got {trials}")
    spec = targets.resolve(target)
    if not spec.backend().online_tuning:
        raise TuningError(f"target {spec.name}: its backend ({spec.backend().name}) has no MetaSchedule templates "
                          f"to tune here; tune it offline: tvmfuse tune MODEL --target {spec.name} --export-candidates "
                          "DIR, time DIR on the device (bench/device/time_candidates.py), then tvmfuse tune "
                          "--import-results")
    if rpc is None and not target_runs_here(spec):
        why = spec.backend().why_not_runnable() or f"its code runs on {spec.backend().device}, not this CPU"
        raise TuningError(f"target {spec.name} cannot run on this machine ({why}): measure on a device "
                          "that can with rpc (tvmfuse tune --rpc HOST:PORT --key KEY)")
    start = time.monotonic()
    store = LogStore(logs if logs is not None else default_root(), spec)
    tasks = extract_tasks(model, spec, shapes, consts=consts)
    db, _ = store.load()
    results = {t.name: TaskResult(t.name, "in logs") for t in tasks if db.has_workload(t.mod)}
    todo = [t for t in tasks if t.name not in results]
    written = _Session(spec, store, model, trials, resume, rpc, trials_per_iter, builder_timeout, progress,
                       seed).run(todo, results) if todo else 0
    return TuneReport(str(store.path), [results[t.name] for t in tasks], written, time.monotonic() - start)


class _Session:
    """One tuning run over the tasks the logs lack: staging folder, builder/runner, cost model, progress."""

    def __init__(self, spec, store, model, trials, resume, rpc, per_iter, builder_timeout, show, seed):
        self.spec, self.store, self.model, self.trials, self.resume = spec, store, model, trials, resume
        self.rpc, self.per_iter, self.builder_timeout, self.show, self.seed = rpc, per_iter, builder_timeout, show, seed

    def _open_run(self) -> StagingRun:
        run = StagingRun.adopt(self.store) if self.resume else None
        if self.resume and run is None:
            print(f"[tune] nothing to resume in {self.store.path}: starting a new run", file=sys.stderr)
        elif not self.resume and StagingRun.orphans(self.store):
            print(f"[tune] {self.store.path} holds unfinished runs: --resume continues the newest", file=sys.stderr)
        info = {"model": str(self.model), "target": self.spec.to_json(), "trials": self.trials}
        return run or StagingRun.create(self.store, info)

    def run(self, todo: list[Task], results: dict) -> int:
        """Tune ``todo`` one task after the other; fill ``results``; return the records written."""
        spec = self.spec
        self.staging = self._open_run()
        self.done = self.staging.trials_by_workload()
        light_tensor_intrin(spec.backend_name)
        backend = spec.backend()
        backend.register_templates()
        self.sizes = {t.key: backend.space_size(t.mod) if t.family else None for t in todo}
        self.progress = Progress(sum(self._left(t) for t in todo), enabled=self.show)
        # The workers start lazily, while tuning: the whole run is inside. However it ends (done, error, Ctrl-C)
        # every builder and runner worker it started is killed and reaped on the way out.
        with workers_without(), reaping_workers():
            return self._run(todo, results)

    def _run(self, todo: list[Task], results: dict) -> int:
        from tvm.s_tir import meta_schedule as ms

        self.builder = self.runner = None
        try:
            self.builder, self.runner = make_builder(self.builder_timeout, self.spec.backend_name), make_runner(self.rpc)
            self.cost_model = ms.cost_model.CostModel.create("xgb", num_tuning_cores=targets._cores())
            self.db = self.staging.database()
            # Tuned kernels are checked (and timed against the default) where they will run.
            self.device = validate.LocalDevice() if self.rpc is None else validate.RPCDevice(self.rpc)
            with self.progress.catching_ctrl_c():
                for i, task in enumerate(todo):
                    results[task.name] = self._tune_one(i, task, len(todo))
                    if self.progress.stop_requested:
                        raise KeyboardInterrupt
        except BaseException:
            close_runner(self.runner)
            self.staging.release(remove=False)
            print(f"[tune] stopped: the records measured so far are kept in {self.staging.path}; "
                  "run again with --resume to continue", file=sys.stderr)
            raise
        close_runner(self.runner)
        self.staging.release(remove=True)
        return sum(results[t.name].status != "rejected" for t in todo)

    def _left(self, task: Task) -> int:
        """Trials still to measure: up to ``trials`` (or the template's whole space), minus staged ones."""
        return max(0, min(self.trials, self.sizes[task.key] or self.trials) - self.done[task.key])

    def _tune_one(self, index: int, task: Task, count: int) -> TaskResult:
        from tvm.s_tir import meta_schedule as ms

        self.progress.begin_task(task.name, index + 1, count)
        ctx = _context(task, self.spec, self.staging, self.seed + index, self.sizes[task.key])
        left = self._left(task)
        if left > 0:
            callbacks = list(ms.measure_callback.MeasureCallback.create("default")) + [progress_callback(self.progress)]
            ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir=str(self.staging.path), max_trials_global=left,
                          max_trials_per_task=left, num_trials_per_iter=min(self.per_iter, left),
                          builder=self.builder, runner=self.runner, database=self.db, cost_model=self.cost_model,
                          task_scheduler="round-robin", measure_callbacks=callbacks)
        self.progress.task_trials += self.done[task.key]
        return _accept(task, ctx, self.db, self.store, self.spec, self.device, self.progress,
                       self.sizes[task.key] is not None)
