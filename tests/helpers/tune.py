"""Shared helpers for the tuning tests: tuning records made without tuning, tiny models, subprocess scripts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tvmfuse import targets

from helpers import conv_relu

HOST = targets.resolve("x86-host")
MODEL = conv_relu(batch=1)


def wide_conv(seed: int = 0):
    """x[1,16,28,28] -> Conv(32, 3x3, pad 1) -> Relu: a kernel whose template has a couple dozen candidates."""
    import numpy as np
    from onnx import helper, numpy_helper

    from helpers import make_model

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((32, 16, 3, 3)).astype("float32"), "W")
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", [1, 16, 28, 28])], [("y", None)], [w])


def task_of(model=MODEL, spec=HOST):
    from tvmfuse.tune.tuner import extract_tasks

    (task,) = extract_tasks(model, spec)
    return task


def default_entry(task, spec=HOST, run_secs=1e-5):
    """``(workload JSON, record JSON)`` of the task's default schedule, as if it had been measured."""
    from tvm.s_tir import meta_schedule as ms

    from tvmfuse.schedules.x86 import templates
    from tvmfuse.tvmscript import light_tensor_intrin

    templates.register(spec.vector_bits())
    light_tensor_intrin(spec.backend_name)  # as the tuner does: TuneContext would import every target's intrinsics (20-50 s)
    ctx = ms.TuneContext(mod=task.mod, target=spec.tvm_target(), space_generator=templates.space_generator(),
                         search_strategy="evolutionary", task_name=task.name)
    trace = ctx.generate_design_space()[0].trace
    workload = ms.database.Workload(task.mod)
    args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
    record = ms.database.TuningRecord(trace, workload, [run_secs], spec.tvm_target(), args)
    return workload.as_json(), record.as_json()


def run_script(body: str, *args, timeout=600) -> subprocess.CompletedProcess:
    """Run ``body`` (Python) in a fresh interpreter; returns the completed process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def record_lines(folder: Path) -> list:
    path = Path(folder) / "database_tuning_record.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
