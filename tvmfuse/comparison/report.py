"""The comparison report: one JSON document (``report.json``) every other output is rendered from.

Schema ``tvmfuse.compare/1`` (every time in milliseconds unless the key says ``us``)::

    {
      "schema": "tvmfuse.compare/1",
      "created": "2026-11-24T10:00:00+00:00",
      "command": "tvmfuse compare zoo:mobilenet_v2 --targets ...",
      "seed": 0,
      "model": {"source": "zoo:mobilenet_v2", "sha256": "...", "inputs": [{"name", "shape", "dtype"}],
                "samples": 4, "labels": false},
      "settings": {"threads": 2, "budget_s": 60.0, "baseline": "x86-avx512", "target_ci": 0.02,
                   "calibration": "4 seeded random batches, entropy"},
      "environment": {"host": "...", "cpu": "AMD EPYC (family 25 model 17; AVX-512, VNNI, AVX2)",
                      "cpu_flags": ["avx2", ...], "cores": 2, "load_before": [0.1, 0.2, 0.3],
                      "load_after": [...], "versions": {"tvmfuse": ..., "tvm": ..., "llvm": ...,
                      "onnxruntime": ..., "openvino": ...}, "python": "3.11.7",
                      "roofline": {"bandwidth_gbs": 20.1, "peak_gflops": 150.0, "how": "..."}},
      "contenders": [                         # one per arm, peer and the A/A twin, in command order
        {"name": "x86-avx512", "kind": "tvmfuse" | "peer" | "aa",
         "target": "x86-avx512" | null, "precision": "fp32" | "int8", "logs": "default" | "none" | PATH,
         "device": "cpu: AMD EPYC ..." | "cuda: ...",   # rows are grouped by device
         "run": "host 2026-11-24T10:00:00",             # rows measured together share it (merge keeps it)
         "status": "measured" | "build-only" | "failed" | "not installed",
         "reason": "" | "why it was not measured",
         "build": {"seconds": 3.1, "library": "libs/x86-avx512.so", "library_bytes": 123456,
                   "kernels": 33, "tuned_kernels": 5, "tvmfuse_kernels": 30} | null,
         "threads": {"requested": 2, "read_back": 2} | null,
         "correctness": {"max_abs_err": 1e-6, "rel_err": 1e-7, "top1_agreement": 1.0, "accuracy": null,
                         "fp32_agreement": null | 0.98, "tolerance": "max abs error <= ...",
                         "within_tolerance": true} | null,
         "latency": {"rounds": [[ms, ms, ...], ...],   # raw samples, one list per round
                     "p50": 3.1, "p90": 3.3, "p99": null | 3.9, "mean": 3.15, "samples": 240} | null,
         "profile": {"end_to_end_us": 3100.0, "runs": 20, "source": "Relax VM instrument hook",
                     "kernels": [{"name", "kind", "fused_ops", "schedule", "partition", "calls",
                                  "us", "share", "flops", "bytes", "gflops"}],
                     "unattributed_us": 120.0} | null}
      ],
      "ratios": [{"contender": "x86-host", "baseline": "x86-avx512", "ratio": 1.21, "ci": [1.18, 1.24],
                  "rounds": 30, "device": "cpu: ..."}],    # latency ratio contender / baseline, paired per round
      "fastest": {"cpu: ...": "x86-avx512"}                # per device, among rows within tolerance
    }

``kind`` in a profile row is the kernel family (``conv2d_nchwc``, ``dense``, ...) or, for TVM's own
kernels, the name without its numeric suffix; ``schedule`` is ``tvmfuse rule``, ``tuning record`` or
``TVM default``; ``flops`` and ``bytes`` are the kernel's arithmetic and the size of its arguments (a
lower bound on its memory traffic). Peer profiles hold one row per operator type, from the peer's own
profiler.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import warnings
from pathlib import Path

from ..errors import InputError

SCHEMA = "tvmfuse.compare/1"


class Report:
    """A comparison report: ``rows`` (the contenders), ``ratio(a, b)``, ``write(dir)``, ``Report.load(path)``."""

    def __init__(self, data: dict):
        self.data = data

    @property
    def rows(self) -> list[dict]:
        """One dict per contender (arm, peer, A/A twin), in the order of the command."""
        return self.data["contenders"]

    def row(self, name: str) -> dict:
        for r in self.rows:
            if r["name"] == name:
                return r
        raise KeyError(f"no contender {name!r} in the report; there are {', '.join(r['name'] for r in self.rows)}")

    def ratio(self, a: str, b: str) -> dict:
        """Latency ratio ``a / b`` with its paired confidence interval: ``{"ratio", "ci", "rounds", "device"}``.

        Only contenders measured in the same run on the same device are ever paired.
        """
        from .stats import paired_ratio

        for r in self.data.get("ratios", []):
            if r["contender"] == a and r["baseline"] == b:
                return r
        ra, rb = self.row(a), self.row(b)
        if ra["device"] != rb["device"] or ra.get("run") != rb.get("run"):
            raise InputError(f"{a} and {b} were measured on different devices or in different runs: "
                             "their ratio would compare machines, not builds")
        if not (ra.get("latency") and rb.get("latency")):
            raise InputError(f"{a} or {b} has no latency (status {ra['status']}, {rb['status']})")
        est = paired_ratio(ra["latency"]["rounds"], rb["latency"]["rounds"])
        return {"contender": a, "baseline": b, "device": ra["device"], **est}

    def write(self, directory: str | Path, formats=("json", "md", "html")) -> Path:
        """Write ``report.json`` (and, by default, ``report.md`` and ``index.html``) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if "json" in formats:
            atomic_write(directory / "report.json", json.dumps(self.data, indent=1, sort_keys=False) + "\n")
        if "md" in formats:
            from .render_md import render_markdown

            atomic_write(directory / "report.md", render_markdown(self.data))
        if "html" in formats:
            why = html_missing()
            if why:  # what could be written is: a run of minutes is not lost for a plotting library
                warnings.warn(f"{directory / 'index.html'} not written: {why}, then tvmfuse compare --render "
                              f"{directory}; report.json and report.md are written", stacklevel=2)
                return directory
            from .render_html import render_html

            atomic_write(directory / "index.html", render_html(self.data))
        return directory

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        """Read a ``report.json`` (or the directory holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "report.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(f"{path}: no such report") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{path}: not a readable report ({type(e).__name__}: {e})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise InputError(f"{path}: schema {found!r}, expected {SCHEMA!r}")
        return cls(data)

    def __repr__(self) -> str:
        return f"Report({self.data['model']['source']!r}, {len(self.rows)} contenders)"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder: never a half-written file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would hide the report from the rest of the team
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def html_missing() -> str:
    """Why ``index.html`` cannot be rendered here ('' when it can): the ``report`` extra's libraries."""
    missing = [m for m in ("jinja2", "matplotlib") if importlib.util.find_spec(m) is None]
    return f"it needs {' and '.join(missing)} (pip install 'tvmfuse[report]')" if missing else ""
