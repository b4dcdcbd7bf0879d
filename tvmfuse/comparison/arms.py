"""Arms of a comparison: ``TARGET[:fp32|:fp16|:int8][@LOGS]``, each compiled, exported and described.

An arm's library is exported into the report folder (``libs/``) and measured from there, as a user would
load it; ``--measure-only`` measures the same files on another machine.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from .. import targets
from ..errors import InputError, TvmfuseError

PRECISIONS = ("fp32", "fp16", "int8")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One compiled contender: a target, a precision and the tuning logs to apply."""

    name: str  # the spec as written, e.g. "x86-avx512:int8@none"
    target: str
    precision: str = "fp32"
    logs: str = "default"  # "default" (shipped logs), "none" or a folder

    @property
    def logs_arg(self):
        """``logs=`` for :func:`tvmfuse.compile`."""
        return {"default": None, "none": False}.get(self.logs, self.logs)

    @property
    def library_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.name) + ".so"


def parse_arm(text: str) -> Arm:
    """Parse ``TARGET[:fp32|:fp16|:int8][@LOGS]`` (``@none``: no tuning logs; ``@DIR``: that logs folder)."""
    spec, _, logs = text.strip().partition("@")
    target, _, precision = spec.partition(":")
    precision = precision or "fp32"
    if target not in targets.names():
        raise InputError(f"arm {text!r}: unknown target {target!r}; known: {', '.join(targets.names())}")
    if precision not in PRECISIONS:
        raise InputError(f"arm {text!r}: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and "fp16" not in targets.resolve(target).backend().precisions:
        raise InputError(f"arm {text!r}: target {target} does not build fp16 (a CUDA target does)")
    if logs and logs != "none" and not Path(logs).is_dir():
        raise InputError(f"arm {text!r}: tuning logs folder {logs!r} does not exist")
    return Arm(text.strip(), target, precision, logs or "default")


def parse_arms(text: str) -> list[Arm]:
    """Parse a comma-separated list of arms; names must be unique."""
    arms = [parse_arm(t) for t in text.split(",") if t.strip()]
    if not arms:
        raise InputError("--targets: no arm given (e.g. x86-avx512,x86-avx512:int8,x86-host)")
    seen = set()
    for a in arms:
        if a.name in seen:
            raise InputError(f"--targets: arm {a.name!r} is given twice")
        seen.add(a.name)
    return arms


def device_of(spec: targets.TargetSpec) -> str:
    """The report's device key for code compiled for ``spec`` (its backend's runtime device)."""
    return spec.backend().device_label()


def build(arm: Arm, model, shapes, calib, method: str, libs: Path) -> tuple[dict, object]:
    """Compile ``arm`` and export its library into ``libs``; return its report row and the CompiledModel
    (None when the build failed: the row says why)."""
    from .. import api

    spec = targets.resolve(arm.target)
    row = {"name": arm.name, "kind": "tvmfuse", "target": arm.target, "precision": arm.precision,
           "logs": arm.logs, "device": device_of(spec), "status": "build-only", "reason": "", "build": None,
           "threads": None, "correctness": None, "latency": None, "profile": None}
    start = time.perf_counter()
    try:
        if arm.precision == "int8":
            cm = api.quantize(model, calib=calib, method=method, target=spec, shapes=shapes, logs=arm.logs_arg)
        else:
            cm = api.compile(model, target=spec, shapes=shapes, logs=arm.logs_arg, precision=arm.precision)
        seconds = time.perf_counter() - start
        path = cm.export(libs / arm.library_name)
    except TvmfuseError as e:
        row.update(status="failed", reason=f"build: {e}")
        return row, None
    except Exception as e:  # noqa: BLE001 - one arm's compiler failure must not lose the others' rows
        first = (str(e).strip().splitlines() or [""])[0][:300]
        row.update(status="failed", reason=f"build: {type(e).__name__}: {first}")
        return row, None
    info = kernel_info(cm)
    row["build"] = {"seconds": round(seconds, 2), "library": f"{libs.name}/{path.name}",
                    "library_bytes": path.stat().st_size, "kernels": len(info),
                    "tuned_kernels": sum(k["schedule"] == "tuning record" for k in info.values()),
                    "tvmfuse_kernels": sum(k["tvmfuse"] for k in info.values()),
                    "cache": dict(cm.cache_info), "kernel_info": info}
    if cm.quantization is not None:
        row["build"]["quantization"] = {k: cm.quantization.get(k) for k in ("method", "int8_partitions",
                                                                           "fp32_partitions") if k in cm.quantization}
    row["reason"] = spec.backend().why_not_runnable()
    return row, cm


def kernel_info(cm) -> dict[str, dict]:
    """Per kernel of ``cm``: kind, fused ops, schedule source, partition, FLOPs and argument bytes."""
    import numpy as np
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    from ..partition_report import op_name
    from ..passes import kernel_names

    applied = set((cm.tuning_logs or {}).get("applied", []))
    out = {}
    for gv, fn in cm.lowered.functions_items():
        if not isinstance(fn, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        family = fn.attrs.get("tvmfuse.family") if fn.attrs else None
        part = cm.record.kernels.get(name, (None, None))[0]
        if part is not None:
            ops = [op_name(b.value) for blk in part.body.blocks for b in blk.bindings]
            partition = str(part.attrs["Composite"])
        elif fn.attrs and "tvmfuse.ops" in fn.attrs:  # an INT8 kernel: QuantizeGraph records what it computes
            ops = str(fn.attrs["tvmfuse.ops"]).split(",")
            partition = str(fn.attrs.get("tvmfuse.partition", ""))
        else:
            ops, partition = [kernel_names.kind(name)], ""
        try:
            flops = float(estimate_tir_flops(tvm.IRModule({name: fn})))
        except Exception:  # noqa: BLE001 - loops TVM cannot count (data-dependent extents)
            flops = 0.0
        nbytes = 0
        for p in fn.params:
            ty = getattr(p, "ty", None)
            shape = getattr(ty, "shape", None)
            if shape is not None and all(isinstance(d, (int, tvm.tirx.IntImm)) for d in shape):
                nbytes += int(np.prod([int(d) for d in shape])) * tvm.DataType(ty.dtype).bits // 8
        schedule = "tuning record" if name in applied else "tvmfuse rule" if family else "TVM default"
        out[name] = {"kind": str(family) if family else kernel_names.kind(name), "fused_ops": ops,
                     "schedule": schedule, "tvmfuse": bool(family), "partition": partition, "flops": flops, "bytes": nbytes}
    return out
