"""A slice of the differential fuzz for the GPU round: seeded random CNNs (``tvmfuse.fuzz.graphs``) compiled here
for CUDA in FP32 and fp16, their onnxruntime outputs computed here; there, each library is only loaded, run and
compared.

    python bench/device/fuzz_slice.py prepare .fuzz [--seeds 0-9] [--target cuda-sm90]   # here (nvcc)
    python3 bench/device/fuzz_slice.py check .fuzz OUT.json                              # on the GPU machine

``prepare`` writes ``<seed>_<precision>.so`` per case, ``<seed>.npz`` (inputs and onnxruntime's outputs) and
``cases.json`` (seeds, precisions, features of each graph, what failed to compile here). ``check`` writes one
row per case as it goes: FP32 under the fuzz oracle's tolerance (``tvmfuse.fuzz.check.compare``, 1e-4 of the
output's scale), fp16 by relative L2 error against ``comparison.correctness.FP16_REL``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

PRECISIONS = ("fp32", "fp16")


def seed_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def prepare(directory: Path, seeds: list[int], target: str) -> dict:
    import tvmfuse
    from tvmfuse.fuzz import check, graphs

    directory.mkdir(parents=True, exist_ok=True)
    cases = {"target": target, "precisions": list(PRECISIONS), "cases": []}
    for seed in seeds:
        model = graphs.random_cnn(seed)
        x = check.random_inputs(model, seed)
        want = check.ort_outputs(model, x)
        names = [o.name for o in model.graph.output]
        np.savez(directory / f"{seed}.npz", **{f"in:{k}": v for k, v in x.items()},
                 **{f"out:{n}": w for n, w in zip(names, want)})
        for precision in PRECISIONS:
            row = {"seed": seed, "precision": precision, "features": dict(graphs.features(model)), "outputs": names}
            start = time.perf_counter()
            try:
                cm = tvmfuse.compile(model, target=target, precision=precision)
                cm.export(directory / f"{seed}_{precision}.so")
                row["library"] = f"{seed}_{precision}.so"
                row["rules"] = sorted(set(v for k, v in cm.manifest()["scheduled_by"].items()
                                          if k.startswith("tvmfuse_")))
            except Exception as e:  # noqa: BLE001 - a graph tvmfuse cannot build here is a finding, recorded
                row["compile_error"] = check.one_line(e)
            row["compile_s"] = round(time.perf_counter() - start, 1)
            cases["cases"].append(row)
            (directory / "cases.json").write_text(json.dumps(cases, indent=1))
    return cases


def check_case(directory: Path, row: dict) -> dict:
    import tvmfuse
    from tvmfuse.comparison.correctness import FP16_REL
    from tvmfuse.fuzz.check import compare, one_line

    data = np.load(directory / f"{row['seed']}.npz")
    x = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
    want = [data[f"out:{n}"] for n in row["outputs"]]
    result = {"seed": row["seed"], "precision": row["precision"]}
    try:
        got = tvmfuse.load(directory / row["library"]).run(x)
    except Exception as e:  # noqa: BLE001 - a case that fails to load or run is reported, the slice goes on
        return {**result, "status": "error", "error": one_line(e)}
    if row["precision"] == "fp32":
        checks = [compare(n, g, w) for n, g, w in zip(row["outputs"], got, want)]
        result["worst"] = max(c.worst for c in checks)
        ok = all(c.ok for c in checks)
    else:
        errors = [float(np.linalg.norm(np.asarray(g, np.float64) - w) / (np.linalg.norm(w) or 1.0))
                  for g, w in zip(got, want)]
        result["relative_l2"] = max(errors)
        ok = max(errors) <= FP16_REL and all(np.isfinite(g).all() for g in got)
    return {**result, "status": "ok" if ok else "mismatch"}


def check_all(directory: Path, out: Path) -> dict:
    cases = json.loads((directory / "cases.json").read_text())
    report = {"target": cases["target"], "rows": []}
    for row in cases["cases"]:
        if "library" in row:
            report["rows"].append(check_case(directory, row))
        else:
            report["rows"].append({"seed": row["seed"], "precision": row["precision"], "status": "not built",
                                   "error": row["compile_error"]})
        out.write_text(json.dumps(report, indent=1))
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("directory", type=Path)
    a.add_argument("--seeds", default="0-9")
    a.add_argument("--target", default="cuda-sm90")
    b = sub.add_parser("check")
    b.add_argument("directory", type=Path)
    b.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if args.command == "prepare":
        cases = prepare(args.directory, seed_range(args.seeds), args.target)
        failed = [c for c in cases["cases"] if "compile_error" in c]
        print(f"{len(cases['cases'])} cases in {args.directory}, {len(failed)} not built")
        return 0
    report = check_all(args.directory, args.out)
    bad = [r for r in report["rows"] if r["status"] != "ok"]
    print(f"{len(report['rows'])} cases, {len(bad)} not ok: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
