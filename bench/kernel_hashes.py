"""Structural hashes of every kernel a compile produces, to check that a refactor changed no kernel.

    python bench/kernel_hashes.py OUT.json            # in this checkout
    PYTHONPATH=/path/to/other/checkout python bench/kernel_hashes.py OTHER.json
    python bench/kernel_hashes.py --compare OUT.json OTHER.json

(For another checkout, link its ``schedules/`` as ``tvmfuse/schedules`` so that it, not the installed one,
is imported.) Configurations: the zoo's FP32 models for x86-avx512 (tuning logs applied), mobilenet_v2 NCHW
and for x86-host, and INT8 mobilenet_v2 / resnet18 (minmax on two seeded random batches).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

CONFIGS = [("mobilenet_v2", "x86-avx512", "blocked", False), ("resnet18", "x86-avx512", "blocked", False),
           ("resnet50", "x86-avx512", "blocked", False), ("efficientnet_lite0", "x86-avx512", "blocked", False),
           ("mobilenet_v2", "x86-avx512", "nchw", False), ("mobilenet_v2", "x86-host", "blocked", False),
           ("mobilenet_v2", "x86-avx512", "blocked", True), ("resnet18", "x86-avx512", "blocked", True)]


def hashes() -> dict:
    import tvm
    import tvm_ffi

    import tvmfuse

    out = {}
    for model, target, layout, int8 in CONFIGS:
        if int8:
            rng = np.random.default_rng(0)
            inputs = tvmfuse.compile(f"zoo:{model}", target=target, logs=False).inputs
            calib = [{i.name: rng.standard_normal(i.shape).astype("float32") for i in inputs} for _ in range(2)]
            cm = tvmfuse.quantize(f"zoo:{model}", calib=calib, method="minmax", target=target)
        else:
            cm = tvmfuse.compile(f"zoo:{model}", target=target, layout=layout)
        key = f"{model}-{'int8' if int8 else layout}-{target}"
        out[key] = {"kernels": {gv.name_hint: str(tvm_ffi.structural_hash(f)) for gv, f in cm.lowered.functions_items()
                                if isinstance(f, tvm.tirx.PrimFunc)},
                    "tuned": sorted((cm.tuning_logs or {}).get("applied", []))}
        print(key, len(out[key]["kernels"]), "kernels", file=sys.stderr)
    return out


def compare(a: dict, b: dict) -> int:
    bad = 0
    for key in sorted(set(a) | set(b)):
        ka, kb = a.get(key, {}).get("kernels", {}), b.get(key, {}).get("kernels", {})
        differ = sorted(n for n in set(ka) | set(kb) if ka.get(n) != kb.get(n))
        same_tuned = a.get(key, {}).get("tuned") == b.get(key, {}).get("tuned")
        print(f"{key}: {len(ka)} / {len(kb)} kernels, {len(differ)} differ{': ' + ', '.join(differ[:5]) if differ else ''}"
              f"{'' if same_tuned else ', tuned kernels differ'}")
        bad += bool(differ) or not same_tuned
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = p.parse_args(argv)
    if args.compare:
        return compare(*(json.load(open(path)) for path in args.compare))
    if not args.out:
        p.error("give OUT.json or --compare A B")
    with open(args.out, "w") as f:
        json.dump(hashes(), f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
