"""What a comparison runs: tvmfuse libraries loaded with the runtime only, onnxruntime and OpenVINO.

Every contender runs on the same numpy inputs with the same thread count, set and then read back from the
runtime itself. Each has ``run(inputs) -> list of arrays``, ``threads() -> int | None`` (read back) and
``profile(inputs, runs) -> dict | None`` (where its time goes, measured apart from the timing runs).
"""

from __future__ import annotations

import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np


class TvmfuseContender:
    """An exported tvmfuse library, loaded with :func:`tvmfuse.load` (what a user ships)."""

    def __init__(self, name: str, library: Path, threads: int, kernel_info: dict | None = None):
        from .. import runtime

        self.name, self.kernel_info = name, kernel_info or {}
        self.model = runtime.load(library)
        self.on_cpu = self.model.device_name == "cpu"
        self._threads = threads
        self._configured = False

    def _configure(self) -> None:
        """Size the calling thread's TVM pool (its pool is per calling thread: do it in the timing thread)."""
        if self.on_cpu and not self._configured:
            import tvm

            tvm.get_global_func("runtime.config_threadpool")(1, self._threads)
            self._configured = True

    def run(self, inputs: dict) -> list[np.ndarray]:
        self._configure()
        return self.model.run(inputs)

    def threads(self) -> int | None:
        if not self.on_cpu:
            return None
        import tvm

        self._configure()
        return int(tvm.runtime.num_threads())

    def profile(self, inputs: dict, runs: int) -> dict:
        """Per kernel time through the Relax VM's instrument hook (a callback around every call)."""
        self._configure()
        # On the whole pool: under the hook every call is slower, which the governor would take for contention.
        end_to_end = median_call_us(lambda: self.model.run_whole_pool(inputs), runs)
        walls: list[float] = []
        times = kernel_times(self.model._vm, lambda: self.model.run_whole_pool(inputs), runs, walls)
        rows = []
        for symbol, ts in times.items():
            info = self.kernel_info.get(symbol)
            us = sum(ts) / runs * 1e6
            row = {"name": symbol, "calls": len(ts) // runs, "us": us}
            if info is None:  # a VM builtin (allocation, shape checks, tuple access)
                row.update(kind="VM builtin", fused_ops=[symbol], schedule="TVM runtime", partition="",
                           flops=0.0, bytes=0)
            else:
                row.update({k: info[k] for k in ("kind", "fused_ops", "schedule", "partition", "flops", "bytes")})
            row["gflops"] = row["flops"] / (us * 1e3) if us > 0 and row["flops"] else 0.0
            rows.append(row)
        return _profile(rows, end_to_end, runs, "Relax VM instrument hook; each call's time includes the hook's own "
                        "cost, about a microsecond", float(np.median(walls)) * 1e6)


def median_call_us(call, runs: int, warmup: int = 3) -> float:
    """Median wall time of ``call()`` in microseconds over ``runs`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def kernel_times(vm, call, runs: int, walls: list | None = None, sync=None) -> dict[str, list[float]]:
    """Kernel (or VM builtin) name -> its call times in seconds over ``runs`` calls of ``call()``, through
    ``vm``'s instrument hook (a Python callback around every call the VM makes; it is removed after).
    ``walls``, when given, receives each whole call's wall time in seconds. ``sync``, when given, waits for
    the device before and after every call (a GPU's launches return before the kernel has run)."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    started = {}

    def instrument(func, symbol, before_run, ret_value, *args):
        if sync is not None:
            sync()
        if before_run:
            started["t"] = time.perf_counter()
        else:
            times[str(symbol)].append(time.perf_counter() - started["t"])
        return 0

    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            start = time.perf_counter()
            call()
            if walls is not None:
                walls.append(time.perf_counter() - start)
    finally:
        vm.set_instrument(lambda *a: 0)
    return times


def _profile(rows: list[dict], end_to_end_us: float, runs: int, source: str, profiled_us: float) -> dict:
    """The profile dict: each kernel's share of a profiled run, applied to the measured latency.

    Profiled runs are not the timed ones: a profiler (onnxruntime's, OpenVINO's counters, the VM hook) slows
    every call, so its per-kernel times can add up to more than the latency measured without it (onnxruntime's
    Conv read 137% of it, and "unattributed" went negative). A kernel's share is its time over the profiled run's
    own wall time (``profiled_us``, or the kernels' sum where that is larger), and its ``us`` that share of
    ``end_to_end_us``: the shares add up to at most 100% and "unattributed" is what the profiler did not see.
    ``profiled_us`` on each row keeps the profiler's own figure.
    """
    whole = max(profiled_us, sum(r["us"] for r in rows))
    for r in rows:
        r["profiled_us"] = r["us"]
        r["share"] = r["us"] / whole if whole > 0 else 0.0
        r["us"] = r["share"] * end_to_end_us
        if r.get("flops"):
            r["gflops"] = r["flops"] / (r["us"] * 1e3) if r["us"] > 0 else 0.0
    rows.sort(key=lambda r: -r["us"])
    return {"end_to_end_us": end_to_end_us, "runs": runs, "kernels": rows, "profiled_run_us": whole,
            "source": f"{source}; times are shares of a profiled run ({whole:.0f} us) applied to the latency",
            "unattributed_us": max(0.0, end_to_end_us - sum(r["us"] for r in rows))}


def _op_rows(by_type: dict[str, float], calls: dict[str, int], runs: int, schedule: str) -> list[dict]:
    return [{"name": op, "kind": op, "fused_ops": [op], "schedule": schedule, "partition": "",
             "calls": calls[op] // runs, "us": us / runs, "flops": 0.0, "bytes": 0, "gflops": 0.0}
            for op, us in by_type.items()]


class OnnxRuntimeContender:
    """onnxruntime's CPU provider: ``threads`` intra-op threads, one inter-op thread, spinning off."""

    def __init__(self, name: str, model_bytes: bytes, threads: int, _profiling: bool = False):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.enable_profiling = _profiling
        if _profiling:
            opts.profile_file_prefix = str(Path(tempfile.mkdtemp(prefix="tvmfuse-ort-")) / "ort")
        self.name, self._bytes, self._threads = name, model_bytes, threads
        self.session = ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])

    def run(self, inputs: dict) -> list[np.ndarray]:
        return self.session.run(None, inputs)

    def threads(self) -> int:
        return int(self.session.get_session_options().intra_op_num_threads)

    def profile(self, inputs: dict, runs: int) -> dict:
        """Per operator type, from onnxruntime's own profiler (a second session with profiling on)."""
        end_to_end = median_call_us(lambda: self.run(inputs), runs)
        prof = OnnxRuntimeContender(self.name, self._bytes, self._threads, _profiling=True)
        profiled = median_call_us(lambda: prof.run(inputs), runs)
        path = Path(prof.session.end_profiling())
        try:
            events = json.loads(path.read_text())
        finally:
            path.unlink(missing_ok=True)
            try:
                path.parent.rmdir()
            except OSError:
                pass
        by_type, calls = collections.defaultdict(float), collections.Counter()
        nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
        for e in nodes[len(nodes) * 3 // (3 + runs):]:  # drop the warm-up runs' events
            op = e.get("args", {}).get("op_name", "?")
            by_type[op] += float(e.get("dur", 0))
            calls[op] += 1
        rows = _op_rows(by_type, calls, runs, "onnxruntime")
        return _profile(rows, end_to_end, runs, "onnxruntime profiler (per operator type)", profiled)


class OpenVinoContender:
    """OpenVINO's CPU plugin: float32 inference, ``threads`` threads, one stream, latency hint."""

    def __init__(self, name: str, model_path: Path, shapes: dict, threads: int, _profiling: bool = False):
        import openvino as ov

        core = ov.Core()
        net = core.read_model(str(model_path))
        net.reshape({n: ov.PartialShape(list(s)) for n, s in shapes.items()})
        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": _profiling}
        self.name, self._args = name, (model_path, shapes, threads)
        self.compiled = core.compile_model(net, "CPU", config)
        self.request = self.compiled.create_infer_request()
        self._outputs = list(self.compiled.outputs)

    def run(self, inputs: dict) -> list[np.ndarray]:
        result = self.request.infer(inputs)
        return [np.asarray(result[o]) for o in self._outputs]

    def threads(self) -> int:
        return int(self.compiled.get_property("INFERENCE_NUM_THREADS"))

    def profile(self, inputs: dict, runs: int) -> dict:
        """Per operator type, from OpenVINO's performance counters (a second compiled model with them on)."""
        end_to_end = median_call_us(lambda: self.run(inputs), runs)
        prof = OpenVinoContender(self.name, *self._args, _profiling=True)
        by_type, calls, walls = collections.defaultdict(float), collections.Counter(), []
        for i in range(3 + runs):
            start = time.perf_counter()
            prof.run(inputs)
            if i < 3:
                continue
            walls.append(time.perf_counter() - start)
            for info in prof.request.profiling_info:
                if str(info.status).endswith("EXECUTED") and "NOT" not in str(info.status):
                    by_type[info.node_type] += info.real_time.total_seconds() * 1e6
                    calls[info.node_type] += 1
        rows = _op_rows(by_type, calls, runs, "OpenVINO")
        return _profile(rows, end_to_end, runs, "OpenVINO performance counters (per operator type)",
                        float(np.median(walls)) * 1e6)


def peer_names() -> tuple[str, ...]:
    return ("onnxruntime", "openvino")


def make_peer(name: str, model_bytes: bytes, model_path: Path, shapes: dict, threads: int):
    """A peer contender, or a string saying why it cannot be made (not installed, cannot read the model)."""
    module = {"onnxruntime": "onnxruntime", "openvino": "openvino"}[name]
    try:
        __import__(module)
    except ImportError:
        return f"{name} is not installed (pip install {module})"
    try:
        if name == "onnxruntime":
            return OnnxRuntimeContender(name, model_bytes, threads)
        return OpenVinoContender(name, model_path, shapes, threads)
    except Exception as e:  # noqa: BLE001 - a peer that cannot load the model is a row with the reason
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return f"{name} cannot load the model: {type(e).__name__}: {first}"

