"""Building and measuring candidates: a builder that starts in seconds, local or RPC runners, progress.

MetaSchedule's default build function imports ``tvm.s_tir.tensor_intrin`` in every builder process, which
registers the intrinsics of every GPU and DSP TVM supports: 30-60 s on a 2-core machine, and the builder
pool is restarted for every batch, so with the default 30 s timeout every candidate "times out" and tuning
finds "0 valid samples". Our build function imports only what the target needs (scheduled candidates carry
their intrinsics inlined already; :func:`tvmfuse.tvmscript.light_tensor_intrin`), and the same trick keeps
``TuneContext`` from paying it in this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import signal
import sys
import threading
import time

from .. import threads
from ..errors import TvmfuseError
from ..targets import TargetSpec
from ..tvmscript import light_tensor_intrin

# The runner's workers inherit the environment: TVM's pool in each sizes itself by the CPUs this process may use
# (see tvmfuse.threads; a value the user set wins).
threads.configure()
from .workers import close_pool, new_pool, track_pool, worker_initializer

class TuningError(TvmfuseError):
    """Tuning could not produce a usable result (nothing built, nothing valid, no RPC device)."""


def build_candidate(mod, target, _params, backend: str | None = None):
    """Build one scheduled candidate (MetaSchedule ``f_build``; runs in a builder process). ``backend``: the
    target's backend (:func:`make_builder` binds it), else the default of the TVM target's kind."""
    import tvm
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from tvmfuse.targets import KIND_BACKENDS, backend_class

    backend = backend or KIND_BACKENDS[str(target.kind.name)]
    light_tensor_intrin(backend)
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    # The backend's passes on scheduled kernels, as compile runs them: the candidate is timed as it will run.
    mod = tvm.transform.Sequential(backend_class(backend).kernel_passes())(mod)
    return tvm_build(mod, target=target, pipeline=backend_class(backend).tir_pipeline())


@dataclasses.dataclass(frozen=True)
class RPCSpec:
    """Where candidates are measured remotely: a TVM RPC tracker and the device key servers registered with."""

    host: str
    port: int
    key: str

    @staticmethod
    def parse(address: str, key: str) -> "RPCSpec":
        """From ``HOST:PORT`` and a key; raises TuningError naming what is malformed."""
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not key:
            raise TuningError(f"--rpc must be HOST:PORT with --key KEY, got {address!r} and key {key!r}")
        return RPCSpec(host, int(port), key)

    def check(self, timeout: float = 10.0) -> int:
        """Ask the tracker how many servers have this key free or busy; raises TuningError when none."""
        import socket

        from tvm import rpc

        try:
            # TVM's connect_tracker retries a refused connection for 60 s; a wrong address fails at once here.
            socket.create_connection((self.host, self.port), timeout=timeout).close()
            tracker = rpc.connect_tracker(self.host, self.port)
            summary = tracker.summary()
        except Exception as err:  # noqa: BLE001 - any connection failure is reported the same way
            raise TuningError(f"cannot reach the RPC tracker at {self.host}:{self.port}: {err}") from err
        queue = summary.get("queue_info", {}).get(self.key)
        servers = sum(1 for s in summary.get("server_info", []) if str(s.get("key", "")).endswith(self.key))
        if not queue and not servers:
            raise TuningError(f"the RPC tracker at {self.host}:{self.port} has no server with key {self.key!r}")
        return servers


def _builder_class():
    """MetaSchedule's LocalBuilder, with its per-batch process pool closed on every exit path: the original
    shuts it down only after a batch completes, so Ctrl-C or an error mid-batch left its workers running."""
    global _BUILDER
    if _BUILDER is not None:
        return _BUILDER
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import local_builder as lb
    from tvm.support.popen_pool import StatusKind

    @derived_object
    class ReapingLocalBuilder(ms.builder.LocalBuilder._cls):
        def build(self, build_inputs):
            pool = new_pool(self.max_workers, self.timeout_sec, self.initializer)
            try:
                jobs = [(self.f_build, self.f_export, b.mod, b.target, lb._serialize_params(b.params))
                        for b in build_inputs]
                results = []
                for res in pool.map_with_error_catching(lambda x: lb._worker_func(*x), jobs):
                    if res.status == StatusKind.COMPLETE:
                        results.append(ms.builder.BuilderResult(res.value, None))
                    elif res.status == StatusKind.TIMEOUT:
                        results.append(ms.builder.BuilderResult(
                            None, f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds"))
                    else:
                        results.append(ms.builder.BuilderResult(
                            None, "LocalBuilder: An exception occurred\n" + str(res.value)))
                return results
            finally:
                close_pool(pool)

        def _sanity_check(self):
            def _check(f_build, f_export):
                lb.get_global_func_with_default_on_worker(name=f_build, default=None)
                lb.get_global_func_with_default_on_worker(name=f_export, default=None)

            pool = new_pool(self.max_workers, self.timeout_sec, self.initializer)
            try:
                pool.submit(_check, self.f_build, self.f_export).result()
            finally:
                close_pool(pool)

    _BUILDER = ReapingLocalBuilder
    return _BUILDER


_BUILDER = None


def make_builder(timeout_sec: float = 120.0, backend: str | None = None):
    """The builder of candidates for a target of ``backend`` (None: the default of each target's kind)."""
    f_build = build_candidate if backend is None else functools.partial(build_candidate, backend=backend)
    # The constructor's own worker check runs under the timeout too: build it with room, then apply ours.
    builder = _builder_class()(f_build=f_build, timeout_sec=max(timeout_sec, 60.0),
                               initializer=worker_initializer())
    builder.timeout_sec = timeout_sec
    return builder


def close_runner(runner) -> None:
    """Shut the runner's worker pool down (LocalRunner and RPCRunner keep one for their whole life)."""
    close_pool(getattr(runner, "pool", None))


def make_runner(rpc: RPCSpec | None, timeout_sec: float = 60.0):
    """Local runner, or an RPC runner through ``rpc``'s tracker (one worker per server is MetaSchedule's job)."""
    from tvm.s_tir import meta_schedule as ms

    # Flush the caches before each run (all but the first argument, the input a previous layer just wrote):
    # measured hot, tuned kernels came out 4-5% slower than the defaults inside MobileNetV2.
    evaluator = ms.runner.EvaluatorConfig(number=1, repeat=8, min_repeat_ms=0, enable_cpu_cache_flush=True)
    if rpc is None:
        runner = ms.runner.LocalRunner(timeout_sec=timeout_sec, evaluator_config=evaluator,
                                       initializer=worker_initializer())
    else:
        config = ms.runner.RPCConfig(tracker_host=rpc.host, tracker_port=rpc.port, tracker_key=rpc.key,
                                     session_timeout_sec=int(timeout_sec))
        runner = ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator, max_workers=rpc.check(),
                                     initializer=worker_initializer())
    track_pool(runner.pool)  # it lives as long as the runner: close_runner or reaping_workers ends it
    return runner


class Progress:
    """Counts trials per task, keeps the best latency and the first build/run error, prints a line per batch."""

    def __init__(self, total_trials: int, enabled: bool = True, stream=None):
        self.total, self.enabled = total_trials, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.start = 0, time.monotonic()
        self.task, self.task_index, self.task_count = "", 0, 0
        self.task_trials, self.task_valid, self.best = 0, 0, float("inf")
        self.first_error: str | None = None
        self.stop_requested = False

    @contextlib.contextmanager
    def catching_ctrl_c(self):
        """Turn Ctrl-C into a stop after the current batch.

        MetaSchedule calls back into Python while sampling schedules and swallows exceptions raised there as
        failed samples, so a plain KeyboardInterrupt can vanish; the flag is checked after each measured batch
        instead. A second Ctrl-C interrupts at once.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            self.stop_requested = True
            signal.signal(signal.SIGINT, previous)
            print("[tune] stopping after the current batch (Ctrl-C again to stop now)", file=self.stream, flush=True)

        previous = signal.signal(signal.SIGINT, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def begin_task(self, name: str, index: int, count: int) -> None:
        self.task, self.task_index, self.task_count = name, index, count
        self.task_trials, self.task_valid, self.best = 0, 0, float("inf")

    def measured(self, builder_results, runner_results) -> None:
        if not builder_results:
            return  # an exhausted search space sends empty batches
        for built, ran in zip(builder_results, runner_results):
            self.task_trials += 1
            self.done += 1
            error = built.error_msg or ran.error_msg
            if error:
                self.first_error = self.first_error or str(error).strip().splitlines()[-1][:300]
                continue
            secs = [float(s) for s in ran.run_secs]
            self.task_valid += 1
            self.best = min(self.best, sum(secs) / len(secs))
        self.print_line()

    def eta(self) -> str:
        if not self.done or self.done >= self.total:
            return "-"
        left = (time.monotonic() - self.start) / self.done * (self.total - self.done)
        return f"{int(left // 60)}m{int(left % 60):02d}s"

    def print_line(self) -> None:
        if not self.enabled:
            return
        best = f"{self.best * 1e6:.1f} us" if self.best < float("inf") else "none valid yet"
        print(f"[tune] task {self.task_index}/{self.task_count} {self.task}: {self.task_trials} trials "
              f"({self.task_valid} valid), best {best} | all tasks {self.done}/{self.total} trials, ETA {self.eta()}",
              file=self.stream, flush=True)


def progress_callback(progress: Progress):
    """A MetaSchedule measure callback feeding ``progress``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class _Callback(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            progress.measured(builder_results, runner_results)
            if progress.stop_requested:
                # Runs after the database callback: the batch just measured is already on disk.
                raise KeyboardInterrupt

    return _Callback()


def target_runs_here(spec: TargetSpec) -> bool:
    return spec.backend().runs_on_this_cpu()
