"""INT8 on AMX tiles against INT8 on VNNI: the same model and calibration built for both, outputs compared
element for element, then timed interleaved (#52's bar: AMX at most 0.6x the VNNI INT8 time on resnet50).

    python bench/amx_check.py [--models resnet50,mobilenet_v2] [--repeat 40]

The tile arm is ``x86-host`` on a CPU with ``amx-int8`` (a Sapphire Rapids or later Xeon: the lent GPU machine's
host, ``bench/device/round.sh``); the VNNI arm is ``x86-avx512``, which turns AMX off. Both quantize with one
calibration table, so their integers must be equal: every output is compared exactly. On a CPU without AMX both
arms run VNNI (the header says which), which checks the script, not the tiles. Exit status 1 when any output
differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import THREADS, inputs_for, interleaved_medians, named_model, table  # noqa: E402

import numpy as np  # noqa: E402

import tvmfuse  # noqa: E402
from tvmfuse import model_info, targets  # noqa: E402


def check(name: str, repeat: int, calib_batches: int = 4) -> dict:
    model, shapes = named_model(name)
    inputs = model_info.info(model, shapes).inputs  # the inputs' shapes without a build
    calib = [inputs_for(inputs, seed=100 + i) for i in range(calib_batches)]
    with tempfile.TemporaryDirectory() as tmp:
        table_path = Path(tmp) / "table.json"
        vnni = tvmfuse.quantize(model, calib=calib, method="minmax", target="x86-avx512", shapes=shapes,
                                table=table_path)
        tiles = tvmfuse.quantize(model, table=table_path, target="x86-host", shapes=shapes)
    x = inputs_for(inputs, seed=7)
    got, ref = tiles.run(x), vnni.run(x)
    differ = sum(int(np.count_nonzero(np.asarray(a) != np.asarray(b))) for a, b in zip(got, ref))
    ms = interleaved_medians({"vnni": lambda: vnni.run(x), "tiles": lambda: tiles.run(x)}, repeat)
    return {"model": name, "VNNI ms": f"{ms['vnni']:.2f}", "x86-host ms": f"{ms['tiles']:.2f}",
            "x86-host / VNNI": f"{ms['tiles'] / ms['vnni']:.2f}x", "outputs differing": differ,
            "ldtilecfg sites": tiles.kernel_source("asm").count("ldtilecfg")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,mobilenet_v2")
    p.add_argument("--repeat", type=int, default=40)
    args = p.parse_args(argv)
    host = targets.resolve("x86-host")
    amx = "amx-int8" in host.features()
    rows = [check(m, args.repeat) for m in args.models.split(",")]
    print(f"# INT8 on AMX tiles (x86-host, {host.config.get('mcpu')}: {'AMX' if amx else 'no AMX, VNNI'}) against "
          f"VNNI (x86-avx512): batch 1, {THREADS} threads, one calibration table")
    print(table(rows, list(rows[0])))
    return 1 if any(r["outputs differing"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
