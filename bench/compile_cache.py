"""Compile times with the kernel cache: first compile, the same model again, kernels only, one layer changed.

    python bench/compile_cache.py                          # every zoo and corpus model
    python bench/compile_cache.py --models zoo:resnet50,ppocrv5_det --target x86-host
    python bench/compile_cache.py --before /tmp/before     # also the first compile of another checkout

Every figure is the wall time of one ``tvmfuse.compile`` call and the export of its library in a fresh
process (what ``tvmfuse compile -o`` costs; TVM imported before the clock starts), except ``again_in_process``
(the compile call alone): ``first`` without the cache; ``cold`` into an empty cache folder (building and storing);
``again``: the same model, a new process, the same folder (the whole build reused); ``again_in_process``:
``cold``'s process compiling it once more; ``kernels``: every kernel from the cache, import, passes and
link done (``whole=False``); ``one_layer``: the model with one activation changed (the first Relu becomes a
LeakyRelu, see ``_one_layer_changed``), compiled into the same folder. Outputs of ``again`` and
``one_layer`` are checked against builds without the cache. ``--before DIR``: a checkout of an older commit
(its ``schedules/`` linked as ``tvmfuse/schedules``) timed for ``first`` the same way. The packages are
byte-compiled first, as an installed wheel is (an editable install under ``PYTHONDONTWRITEBYTECODE`` would
compile every module's source in every child: 0.2 s each). The last line sums the table up against #53's bars
(:func:`summary`). Run it on a quiet machine; the JSON written names the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


_CHILD = r"""
import hashlib, json, re, sys, time
import numpy as np
import tvm, tvmfuse
from tvmfuse.runtime import random_inputs
args = json.loads(sys.argv[1])
kw = {k: args[k] for k in ("cache", "whole") if k in args}  # an older checkout has neither
def once():
    start = time.perf_counter()
    cm = tvmfuse.compile(args["model"], args["target"], shapes=args["shapes"], **kw)
    return cm, time.perf_counter() - start
cm, seconds = once()
start = time.perf_counter()
cm.export(args["export"])
out = {"seconds": seconds, "export_seconds": time.perf_counter() - start,
       "cache_info": getattr(cm, "cache_info", None)}
with open(args["export"], "rb") as f:
    out["library"] = hashlib.sha256(f.read()).hexdigest()
if args.get("again"):
    out["again_seconds"] = once()[1]
if args.get("save") and cm.target.backend().can_run():
    np.save(args["save"], cm.run(random_inputs(cm.inputs))[0])
elif args.get("save") and cm.executable is not None:  # a GPU target here, built: its device code is compared,
    # the names of the values it reads aside (a whole build from the cache is compared by its library's bytes)
    def device_source(mod):
        return "".join(i.inspect_source() if i.kind == "cuda" else device_source(i) for i in mod.imports)
    text = re.sub(r"\blv\w*_ptr\b", "lv_ptr", device_source(cm.executable.mod))
    out["device"] = hashlib.sha256(text.encode()).hexdigest()
print("RESULT " + json.dumps(out))
"""


WORK = Path(tempfile.gettempdir())  # where the children export (measure sets its own folder)


def _total(result: dict) -> float:
    """Seconds of compile and export: what ``tvmfuse compile -o`` costs."""
    return result["seconds"] + result["export_seconds"]


def _child(model, target, shapes, cache, env=None, **extra) -> dict:
    """One compile in a fresh process; ``cache`` False (off), a folder, or None (the argument left out)."""
    args = {"model": model, "target": target, "shapes": shapes, "export": str(WORK / "m.so"), **extra}
    if cache is not None:
        args["cache"] = cache
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True,
                          timeout=1800, env=env, cwd=tempfile.gettempdir())  # not a checkout: PYTHONPATH decides
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{model}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(lines[-1][len("RESULT "):])


def _graphs(graph):
    """``graph`` and every subgraph under it (an ``If``'s branches, a ``Loop``'s body), depth first."""
    from tvmfuse.frontend.graph import subgraphs

    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from _graphs(sub)


def _one_layer_changed(path_or_proto, dest: Path) -> Path:
    """The model with the activation of one layer in the middle changed (Relu -> LeakyRelu, Clip -> Relu,
    Sigmoid -> HardSigmoid, HardSwish -> Relu, Erf -> Tanh, Tanh -> Sigmoid, else an Add -> Sub: the first
    kind the model has). A model whose layers sit in the branches of an ``If`` (Silero VAD: one branch per
    sample rate, the taken one pinned) gets the change in the graph holding the most of that kind, in each
    branch of the same shape alike: whichever branch the pinned input keeps has one layer changed."""
    import onnx

    from tvmfuse.frontend.load import load_model

    proto, _ = load_model(path_or_proto)
    graphs = list(_graphs(proto.graph))
    for old, new in (("Relu", "LeakyRelu"), ("Clip", "Relu"), ("Sigmoid", "HardSigmoid"), ("HardSwish", "Relu"),
                     ("Erf", "Tanh"), ("Tanh", "Sigmoid"), ("Add", "Sub")):
        found = [[n for n in g.node if n.op_type == old] for g in graphs]
        most = max(len(nodes) for nodes in found)
        if not most:
            continue
        for nodes in found:
            if len(nodes) == most:  # the main graph alone, unless the kind lives in equal branches
                node = nodes[len(nodes) // 2]
                node.op_type = new
                del node.input[1:]  # Clip's bounds
        onnx.save(proto, dest)
        return dest
    raise RuntimeError("no activation or Add to change")


def _resolve(name: str):
    """(model argument, shapes) for a zoo name or a corpus model name."""
    if name.startswith("zoo:"):
        return name, None
    from tvmfuse import corpus

    entry = corpus.get(name)
    return str(corpus.prepared(entry)), {name: list(shape) for name, shape in entry.shapes.items()}


def measure(name: str, target: str, before: str | None, work: Path) -> dict:
    global WORK
    WORK = work

    model, shapes = _resolve(name)
    row: dict = {"model": name}
    if before:
        # no kernel cache: an older checkout takes no ``cache`` argument, and its default folder would hold its
        # own earlier builds on a second run of this bench
        env = dict(os.environ, PYTHONPATH=before, TVMFUSE_NO_CACHE="1")
        row["first_before"] = _total(_child(model, target, shapes, None, env=env))
    ref = work / "ref.npy"
    first = _child(model, target, shapes, False, save=str(ref))
    row["first"] = _total(first)
    cache = str(work / "cache")
    cold = _child(model, target, shapes, cache, again=True)
    row["cold"], row["again_in_process"] = _total(cold), cold["again_seconds"]
    got = work / "again.npy"
    again = _child(model, target, shapes, cache, save=str(got))
    row["again"], row["again_info"] = _total(again), again["cache_info"]
    row["identical"] = _same(ref, got, first, again)
    kernels = _child(model, target, shapes, cache, whole=False)
    row["kernels"], row["kernels_info"] = _total(kernels), kernels["cache_info"]
    changed = _one_layer_changed(model, work / "changed.onnx")
    changed_ref, changed_got = work / "changed_ref.npy", work / "changed_got.npy"
    if shapes is None:  # a built-in model saved to a file: its default shapes given explicitly
        from tvmfuse import zoo

        shapes = {k: list(v) for k, v in zoo.default_shapes(name[len("zoo:"):]).items()}
    plain = _child(str(changed), target, shapes, False, save=str(changed_ref))
    one = _child(str(changed), target, shapes, cache, save=str(changed_got))
    row["one_layer"], row["one_layer_info"] = _total(one), one["cache_info"]
    row["one_layer_identical"] = _same(changed_ref, changed_got, plain, one)
    return row


def _same(ref: Path, got: Path, plain: dict, cached: dict) -> bool:
    """Whether a build from the cache computes what the build without it does: the same outputs, or where
    the model cannot run here (a GPU target), the same library byte for byte or the same device code but for
    the names of the values a kernel reads: one from the cache names them after the model that stored it
    (``lv362`` for ``lv364``), and TVM orders a device kernel's parameters by name)."""
    import numpy as np

    if ref.exists() and got.exists():
        return bool(np.array_equal(np.load(ref), np.load(got)))
    return plain["library"] == cached["library"] or plain.get("device") == cached.get("device") is not None


SHARE_BAR = 0.30  # #53: one changed layer recompiles in at most 30% of the first compile
AGAIN_BAR = 1.0  # the same model again: at most 1.0 s (or 10% of the first, whichever is larger)


def summary(rows: list[dict]) -> str:
    """The table against #53's bars: one-layer shares within :data:`SHARE_BAR`, their median, the slowest
    second compile against :data:`AGAIN_BAR`, the slowest first compile, outputs identical, models failed."""
    import statistics

    done = [r for r in rows if "error" not in r]
    if not done:
        return f"no model measured ({len(rows)} failed)"
    shares = {r["model"]: r["one_layer"] / r["first"] for r in done}
    over_again = [r["model"] for r in done if r["again"] > max(AGAIN_BAR, 0.1 * r["first"])]
    slowest = max(done, key=lambda r: r["first"])
    over = f": {', '.join(over_again)}" if over_again else ""
    return (f"one layer within {SHARE_BAR:.0%} of the first compile: {sum(v <= SHARE_BAR for v in shares.values())} "
            f"of {len(done)} (median {statistics.median(shares.values()):.1%}); second compile at most "
            f"{max(r['again'] for r in done):.2f} s ({len(over_again)} over the bar{over}); "
            f"slowest first compile {slowest['first']:.2f} s ({slowest['model']}); outputs identical: "
            f"{sum(r['identical'] and r['one_layer_identical'] for r in done)} of {len(done)}"
            + (f"; {len(rows) - len(done)} failed" if len(rows) > len(done) else ""))


def _byte_compile(folders) -> None:
    """Write the ``.pyc`` files of the modules under ``folders`` (links followed)."""
    import compileall

    for folder in folders:
        if folder.exists():
            compileall.compile_dir(str(folder.resolve()), quiet=1)


def main() -> int:
    from tvmfuse import corpus, targets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated zoo:NAME or corpus names (default: every zoo and corpus "
                        "model)")
    parser.add_argument("--target", default="x86-host")
    parser.add_argument("--before", metavar="DIR", help="an older checkout to time the first compile of")
    parser.add_argument("--out", default="compile_cache.json")
    args = parser.parse_args()
    from tvmfuse import zoo

    names = args.models.split(",") if args.models else [f"zoo:{n}" for n in zoo.names()] + corpus.names()
    from tvmfuse import schedules

    before = [Path(args.before) / "tvmfuse", Path(args.before) / "tvmfuse" / "schedules"] if args.before else []
    _byte_compile([Path(zoo.__file__).parents[1], Path(schedules.__file__).parent] + before)
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix="tvmfuse-bench-cache-") as tmp:
            try:
                row = measure(name, args.target, args.before, Path(tmp))
            except RuntimeError as e:
                print(f"{name:22s} failed: {e}", flush=True)
                rows.append({"model": name, "error": str(e)})
                continue
        rows.append(row)
        print(f"{name:22s} first {row['first']:6.2f} s" + (f" (before {row['first_before']:6.2f})" if args.before
                                                                 else "")
              + f"  cold {row['cold']:6.2f}  again {row['again']:5.2f} / in process {row['again_in_process']:5.2f}"
              f"  kernels {row['kernels']:5.2f}  one layer {row['one_layer']:5.2f} "
              f"({row['one_layer_info']['from_cache']}/{row['one_layer_info']['kernels']} kernels reused)"
              f"  identical {row['identical'] and row['one_layer_identical']}", flush=True)
    print(summary(rows))
    from tvmfuse.comparison.environment import cpu_device

    Path(args.out).write_text(json.dumps({"cpu": cpu_device(), "target": args.target,
                                          "host_cpu": targets.host_mcpu(), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
