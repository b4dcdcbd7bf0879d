"""Time the candidates ``tvmfuse tune --export-candidates`` built, on the GPU they are for (TVM runtime only).

    python3 bench/device/time_candidates.py CANDIDATES_DIR OUT.json [--repeat 20] [--device cuda]

For each kernel's library: every ``candidate<i>`` runs on the same seeded inputs; its output is checked
against ``candidate0`` (the default schedule; max abs difference within 1e-3 of the output's scale in
float32, 1e-2 in float16), then timed with ``time_evaluator`` (GPU-synchronized, ``number`` 20 runs per
repeat, median of the repeats; the L2 cache is not flushed: a kernel's operands are as warm as inside a model
run back to back). Writes ``OUT.json`` after each kernel, for ``tvmfuse tune --import-results``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

TIMES = "tvmfuse-candidate-times"


def _inputs(args: list[dict], seed: int) -> list[np.ndarray]:
    """Random arguments; an INT8 kernel's (uint8 codes in) get any code and small float multipliers, so its
    requantized outputs spread over the codes instead of saturating."""
    rng = np.random.default_rng(seed)
    int8 = args[0]["dtype"] == "uint8"
    scale = 1e-3 if int8 else 1.0
    return [(rng.standard_normal(a["shape"]) * scale).astype(a["dtype"]) if a["dtype"].startswith("float")
            else rng.integers(0, 256, a["shape"]).astype(a["dtype"]) if int8 and a["dtype"] == "uint8"
            else rng.integers(-4, 5, a["shape"]).astype(a["dtype"]) for a in args]


def time_kernel(info: dict, directory: Path, dev, repeat: int) -> dict:
    import tvm

    lib = tvm.runtime.load_module(str(directory / info["library"]))
    arrays = _inputs(info["args"], 0)
    out_dtype = info["args"][-1]["dtype"]
    tolerance = 1e-2 if out_dtype == "float16" else 1e-3
    reference, rows = None, []
    for candidate in info["candidates"]:
        name = candidate["function"]
        args = [tvm.runtime.tensor(a, dev) for a in arrays[:-1]]
        args.append(tvm.runtime.tensor(np.zeros_like(arrays[-1]), dev))
        row = {"function": name, "ok": False, "us": None, "max_abs_diff": None}
        try:
            lib[name](*args)
            dev.sync()
            out = args[-1].numpy().astype(np.float64)
            if reference is None:
                reference = out
            scale = max(1.0, float(np.abs(reference).max()))
            row["max_abs_diff"] = float(np.abs(out - reference).max())
            row["ok"] = bool(np.isfinite(out).all() and row["max_abs_diff"] <= tolerance * scale)
            timer = lib.time_evaluator(name, dev, number=20, repeat=repeat)
            row["us"] = statistics.median(timer(*args).results) * 1e6
        except Exception as e:  # noqa: BLE001 - one failing candidate is a result, not the end of the run
            row["error"] = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        rows.append(row)
    return {"key": info["key"], "candidates": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("out")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args(argv)
    import tvm

    dev = tvm.device(args.device, 0)
    if not dev.exist:
        print(f"no {args.device} device here", file=sys.stderr)
        return 1
    directory = Path(args.directory)
    result = {"format": TIMES, "format_version": 1, "device": str(getattr(dev, "device_name", args.device)),
              "repeat": args.repeat, "kernels": {}}
    for path in sorted(directory.glob("*.json")):
        info = json.loads(path.read_text())
        timed = time_kernel(info, directory, dev, args.repeat)
        timed["file"] = path.name
        result["kernels"][info["kernel"]] = timed
        Path(args.out).write_text(json.dumps(result, indent=1))
        best = min((c for c in timed["candidates"] if c["ok"]), key=lambda c: c["us"], default=None)
        print(f"{info['kernel']}: {sum(c['ok'] for c in timed['candidates'])}/{len(timed['candidates'])} ok, "
              f"default {timed['candidates'][0]['us']} us, best {best and best['function']} {best and best['us']} us",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
