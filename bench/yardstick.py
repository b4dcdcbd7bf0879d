"""Batch-1 latency of tvmfuse, plain TVM and onnxruntime FP32 on the zoo models, measured in one run.

    python bench/yardstick.py [--models mobilenet_v2,resnet50] [--target x86-host] [--repeat 20]

Prints a Markdown table: median latency per runtime and the ratios to onnxruntime (lower is better).
All three use the same number of threads (TVM_NUM_THREADS, default 2).
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import THREADS, compile_and_session, median_ms, ours_vs_ort, plain_tvm, table  # noqa: E402

import tvm  # noqa: E402

import tvmfuse  # noqa: E402
from tvmfuse import targets, zoo  # noqa: E402

DEFAULT_MODELS = ["mobilenet_v2", "resnet18", "resnet50", "efficientnet_lite0"]


def measure(name: str, target: str, repeat: int) -> dict:
    """tvmfuse vs onnxruntime, timed alternately."""
    _, cm, sess, x, compile_s = compile_and_session(name, target)
    ms = ours_vs_ort(cm, sess, x, repeat)
    return {"model": name, "onnxruntime ms": ms["onnxruntime"], "tvmfuse ms": ms["tvmfuse"],
            "tvmfuse compile s": compile_s, "x": x, "tuned": len((cm.tuning_logs or {}).get("applied", []))}


def measure_plain(name: str, target: str, x: dict, repeat: int) -> float:
    """Plain TVM's median ms. Run after every tvmfuse/onnxruntime measurement: its seconds-long
    single-threaded runs slowed the next model's measurements by up to 1.4x when interleaved."""
    vm, infos = plain_tvm(zoo.get(name), targets.resolve(target))
    args = [tvm.runtime.tensor(x[i.name]) for i in infos]
    return median_ms(lambda: vm["main"](*args), repeat, warmup=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--target", default="x86-host")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--plain-repeat", type=int, default=3, help="plain TVM is slow: fewer repeats")
    args = p.parse_args(argv)
    names = args.models.split(",")
    measured = [measure(m, args.target, args.repeat) for m in names]
    rows = []
    for name, r in zip(names, measured):
        plain_ms = measure_plain(name, args.target, r["x"], args.plain_repeat)
        ours, ort = r["tvmfuse ms"], r["onnxruntime ms"]
        rows.append({"model": name, "onnxruntime ms": f"{ort:.2f}", "tvmfuse ms": f"{ours:.2f}",
                     "plain TVM ms": f"{plain_ms:.1f}", "tvmfuse / ORT": f"{ours / ort:.2f}x",
                     "plain TVM / ORT": f"{plain_ms / ort:.1f}x", "tvmfuse compile s": f"{r['tvmfuse compile s']:.1f}",
                     "kernels from tuning logs": r["tuned"]})
    spec = targets.resolve(args.target)
    print(f"# yardstick: batch 1, {THREADS} threads, target {args.target} ({spec.config.get('mcpu')}), "
          f"{platform.processor() or platform.machine()}, tvmfuse {tvmfuse.__version__}, TVM {tvm.__version__}")
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
