"""INT8 accuracy on real data: a small CNN trained here on scikit-learn's digits, FP32 vs INT8 per method.

    python bench/int8_accuracy.py [--target x86-host] [--calib-batches 5] [--seed 0]

The network (tests/helpers/digits_cnn.py: conv3x3(8)+relu -> conv3x3(16, stride 2)+relu -> flatten -> dense(10)) is
trained in numpy at start-up (seeded, a few seconds), exported to ONNX with batch 100, compiled by tvmfuse in
FP32, then quantized with each calibration method (calibration batches taken from the training set) and
evaluated on the held-out digits. The table lists FP32 accuracy, INT8 accuracy and the loss in points.
Accuracy needs to run the code, so the target must be one this CPU runs (x86-host by default).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
import time  # noqa: E402

from common import table  # noqa: E402

from helpers import digits_cnn  # noqa: E402

import tvmfuse  # noqa: E402

METHODS = ("minmax", "entropy", "percentile")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86-host", help="a target this CPU runs (default x86-host)")
    parser.add_argument("--calib-batches", type=int, default=5, help="calibration batches of 100 training "
                        "images (default 5)")
    parser.add_argument("--percentile", type=float, default=99.99, help="for the percentile method")
    parser.add_argument("--seed", type=int, default=0, help="data split and training seed")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    split = digits_cnn.load_split(args.seed)
    weights = digits_cnn.train(split.x_train, split.y_train, seed=args.seed)
    print(f"trained on {len(split.x_train)} digits in {time.perf_counter() - start:.1f} s; "
          f"{len(split.x_test)} held out", file=sys.stderr)
    model = digits_cnn.to_onnx(weights)
    calib = digits_cnn.batches(split.x_train)[:args.calib_batches]
    fp32 = digits_cnn.model_accuracy(tvmfuse.compile(model, target=args.target, logs=False),
                                     split.x_test, split.y_test)
    rows = []
    for method in METHODS:
        cm = tvmfuse.quantize(model, calib=calib, method=method, target=args.target, percentile=args.percentile,
                              logs=False)
        acc = digits_cnn.model_accuracy(cm, split.x_test, split.y_test)
        q = cm.quantization
        rows.append({"method": method, "FP32 acc %": f"{fp32:.2f}", "INT8 acc %": f"{acc:.2f}",
                     "loss (points)": f"{fp32 - acc:+.2f}",
                     "INT8 / FP32 partitions": f"{q['int8_partitions']} / {q['fp32_partitions']}"})
    print(f"digits CNN, target {args.target}, {len(calib)} calibration batches of {digits_cnn.BATCH}, "
          f"{len(split.x_test)} held-out images, seed {args.seed}")
    print(table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
