"""INT8 vs FP32 latency, tvmfuse, onnxruntime and OpenVINO, on zoo models at batch 1, in one run.

    python bench/int8.py [--models mobilenet_v2,efficientnet_lite0,resnet18,resnet50] [--target x86-host]
                         [--repeat 20] [--calib-batches 16] [--method minmax]
    python bench/int8.py --models ppocrv5_det,layout_cdla   # corpus models (fetched), at their table shape
    python bench/int8.py --models all --no-peers            # every zoo and corpus model, tvmfuse FP32 vs INT8
    python bench/int8.py --no-peers --other-bits            # 7- and 8-bit weights (a CPU without VNNI)
    python bench/int8.py --avx2                             # AVX2 code of tvmfuse and OpenVINO, on an AVX-512 host

Up to seven contenders per model, same thread count (TVM_NUM_THREADS, default 2), timed in alternating blocks
(common.interleaved_medians) on the same seeded input:

- tvmfuse FP32: ``tvmfuse.compile``;
- tvmfuse INT8: ``tvmfuse.quantize`` calibrated on a few seeded random batches (speed does not depend on the
  data; accuracy is bench/int8_accuracy.py's subject);
- onnxruntime FP32;
- onnxruntime INT8: ``quantize_static`` in QDQ format, per channel, u8 activations / s8 weights, on the
  model after onnxruntime's ``quant_pre_process`` (batch-norm folded), calibrated on the same batches;
- tvmfuse on that onnxruntime QDQ model (``FuseQDQ`` maps its chains to the INT8 kernels);
- with the ``bench`` extra: OpenVINO FP32, and OpenVINO INT8, the model quantized by NNCF (``nncf.quantize``,
  OpenVINO's own post-training quantizer) on the same calibration batches.

``--avx2`` measures what an AVX2-only CPU (a Zen 3) runs, on any newer x86 host: tvmfuse builds for ``znver3``
(``TVMFUSE_HOST_CPU``) and OpenVINO's oneDNN kernels are capped at AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``; the header
lists the ISAs of OpenVINO's conv and matmul primitives, to show the cap took). onnxruntime has no such cap (MLAS
picks its kernels from CPUID), so its timings are left out; tvmfuse on onnxruntime's QDQ model stays.

Prints a Markdown table: median ms per contender and the ratios tvmfuse INT8 / tvmfuse FP32, tvmfuse INT8 /
onnxruntime INT8 and tvmfuse(ORT QDQ) / onnxruntime INT8 (lower is better). The header names the SIMD the
INT8 kernels used: on a CPU without AVX512-VNNI they run the AVX2 step, not ``vpdpbusd``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (THREADS, inputs_for, interleaved_medians, named_model, openvino_isas, openvino_runner,  # noqa: E402
                    ort_session, table)

import onnx  # noqa: E402
import onnx.version_converter  # noqa: E402
import tvm  # noqa: E402

import tvmfuse  # noqa: E402
from tvmfuse import targets  # noqa: E402
from tvmfuse.errors import TvmfuseError  # noqa: E402

DEFAULT_MODELS = ["mobilenet_v2", "efficientnet_lite0", "resnet18", "resnet50"]


class _Batches:
    """onnxruntime's CalibrationDataReader protocol over a list of feed dicts."""

    def __init__(self, batches: list[dict]):
        self.batches, self.index = batches, 0

    def get_next(self):
        if self.index >= len(self.batches):
            return None
        self.index += 1
        return self.batches[self.index - 1]


def ort_qdq(model: onnx.ModelProto, batches: list[dict], workdir: Path) -> onnx.ModelProto:
    """``model`` as onnxruntime users quantize it: pre-processed, then ``quantize_static`` QDQ per channel."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    src, prepared, out = workdir / "fp32.onnx", workdir / "prepared.onnx", workdir / "qdq.onnx"
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:  # per-channel DequantizeLinear (its axis) needs opset 13; onnxruntime writes it regardless
        model = onnx.version_converter.convert_version(model, 13)
    onnx.save(model, src)
    quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
    quantize_static(str(prepared), str(out), _Batches(batches), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return onnx.load(out)


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


OPENVINO_ISAS: set[str] = set()  # the kinds of OpenVINO's INT8 conv and matmul primitives seen


def measure(name: str, target: str, repeat: int, calib_batches: int, method: str, peers: bool = True,
            other_bits: bool = False, ort: bool = True) -> dict:
    """Build the contenders of one model (only tvmfuse FP32 and INT8 when not ``peers``), time them alternately;
    with ``other_bits`` also tvmfuse INT8 with the other weight width than the target's default (8 bits where
    it quantizes to 7: a CPU without VNNI)."""
    model, shapes = named_model(name)
    fp32, fp32_s = _timed(lambda: tvmfuse.compile(model, target=target, shapes=shapes))
    batches = [inputs_for(fp32.inputs, seed=100 + i) for i in range(calib_batches)]
    int8, int8_s = _timed(lambda: tvmfuse.quantize(model, calib=batches, method=method, target=target, shapes=shapes))
    x = inputs_for(fp32.inputs)
    fns = {"tvmfuse FP32": lambda: fp32.run(x), "tvmfuse INT8": lambda: int8.run(x)}
    if other_bits:
        bits = 8 if int8.quantization["weight_bits"] == 7 else 7
        other = tvmfuse.quantize(model, calib=batches, method=method, target=target, shapes=shapes, weight_bits=bits)
        fns[f"tvmfuse INT8 {bits}-bit"] = lambda: other.run(x)
    imported, imported_s, qdq_kernels = None, float("nan"), "-"
    if peers:
        imported, imported_s = _add_peers(fns, name, model, shapes, batches, target, x, ort)
        qdq_report = imported.record.qdq if imported is not None else {}
        on_int8 = qdq_report.get("int8_kernels", 0)
        qdq_kernels = f"{on_int8}/{on_int8 + len(qdq_report.get('kept_float', []))}"
    ms = interleaved_medians(fns, repeat)
    quant = int8.quantization
    return {"model": name, "ms": ms, "compile s": (fp32_s, int8_s, imported_s), "bits": quant["weight_bits"],
            "int8 partitions": f"{quant['int8_partitions']}/{quant['int8_partitions'] + quant['fp32_partitions']}",
            "qdq kernels": qdq_kernels}


def _add_peers(fns: dict, name: str, model, shapes, batches: list, target: str, x: dict, ort: bool = True):
    """Add onnxruntime FP32 / QDQ INT8, tvmfuse on that QDQ model and OpenVINO FP32 / NNCF INT8 to ``fns``;
    returns tvmfuse's compile of the QDQ model (None when it does not compile) and its seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        qdq = ort_qdq(model, batches, Path(tmp))
    try:
        imported, imported_s = _timed(lambda: tvmfuse.compile(qdq, target=target, shapes=shapes))
    except TvmfuseError as e:  # e.g. onnxruntime wrote a per-channel DequantizeLinear into an opset-11 model
        print(f"{name}: tvmfuse does not compile onnxruntime's QDQ model: {e}", file=sys.stderr)
        imported, imported_s = None, float("nan")
    if ort:
        ort_fp32, ort_int8 = ort_session(model), ort_session(qdq)
        fns.update({"ORT FP32": lambda: ort_fp32.run(None, x), "ORT INT8": lambda: ort_int8.run(None, x)})
    if imported is not None:
        fns["tvmfuse(ORT QDQ)"] = lambda: imported.run(x)
    shapes = {k: v.shape for k, v in x.items()}
    ov_fp32, ov_int8 = openvino_runner(model, shapes), openvino_runner(model, shapes, calib=batches)
    if ov_fp32 is not None:
        fns["OV FP32"] = lambda: ov_fp32.infer(x)
    if ov_int8 is not None:
        fns["OV INT8"] = lambda: ov_int8.infer(x)
        OPENVINO_ISAS.update(openvino_isas(ov_int8))
    return imported, imported_s


def _row(r: dict) -> dict:
    ms = r["ms"]
    fp32, int8, ort_fp32, ort_int8, imported = (ms.get(k, float("nan")) for k in (
        "tvmfuse FP32", "tvmfuse INT8", "ORT FP32", "ORT INT8", "tvmfuse(ORT QDQ)"))
    other = {f"INT8 {k.split()[-1]}/FP32 tvmfuse": f"{v / fp32:.2f}x" for k, v in ms.items() if k.endswith("-bit")}
    return {"model": r["model"], "tvmfuse FP32 ms": f"{fp32:.2f}", f"tvmfuse INT8 ({r['bits']}-bit) ms": f"{int8:.2f}",
            "ORT FP32 ms": f"{ort_fp32:.2f}", "ORT INT8 ms": f"{ort_int8:.2f}",
            "tvmfuse(ORT QDQ) ms": f"{imported:.2f}", "INT8/FP32 tvmfuse": f"{int8 / fp32:.2f}x", **other,
            "tvmfuse INT8 / ORT INT8": f"{int8 / ort_int8:.2f}x",
            "tvmfuse(ORT QDQ) / ORT INT8": f"{imported / ort_int8:.2f}x",
            "ORT INT8/FP32": f"{ort_int8 / ort_fp32:.2f}x",
            **({"OV FP32 ms": f"{ms['OV FP32']:.2f}"} if "OV FP32" in ms else {}),
            **({"OV INT8 ms": f"{ms['OV INT8']:.2f}", "tvmfuse INT8 / OV INT8": f"{int8 / ms['OV INT8']:.2f}x"}
               if "OV INT8" in ms else {}),
            "INT8 partitions": r["int8 partitions"], "QDQ chains on INT8": r["qdq kernels"],
            "compile s (FP32/INT8/QDQ)": "/".join(f"{s:.0f}" for s in r["compile s"])}


def _simd(spec: targets.TargetSpec) -> str:
    feats = spec.features()
    if "amx-int8" in feats and spec.backend().int8_weights == "amx":
        return "AMX tiles (tdpbusd) for conv2d, AVX512-VNNI (vpdpbusd) for depthwise, dense and narrow convs"
    if "avx512vnni" in feats:
        return "AVX512-VNNI (vpdpbusd)"
    if "avx2" in feats:
        return "AVX2 (no VNNI on this target: 7-bit weights on vpmaddubsw, 8-bit ones on the int16-pair step)"
    return "no AVX2 (generic INT8 loops)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--target", default="x86-host", help="a target this CPU runs (default x86-host)")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--calib-batches", type=int, default=16)
    p.add_argument("--method", default="minmax", help="tvmfuse calibration method (minmax, entropy, percentile)")
    p.add_argument("--no-peers", action="store_true",
                   help="time tvmfuse FP32 and INT8 only (no onnxruntime or OpenVINO quantization): a sweep over "
                        "many models")
    p.add_argument("--avx2", action="store_true",
                   help="AVX2 code on this (newer) host: tvmfuse for znver3, OpenVINO capped at AVX2, no onnxruntime")
    p.add_argument("--other-bits", action="store_true",
                   help="also tvmfuse INT8 with the other weight width (8 bits where the target's default is 7: "
                        "a CPU without VNNI; 7 elsewhere)")
    args = p.parse_args(argv)
    if args.avx2:  # before any target resolves or OpenVINO loads its plugin
        os.environ[targets.HOST_CPU_ENV] = "znver3"
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    spec = targets.resolve(args.target)
    if args.models == "all":
        from tvmfuse import corpus, zoo

        args.models = ",".join(zoo.names() + corpus.names())
    rows, failed = [], []
    for m in args.models.split(","):
        print(f"{m} ...", file=sys.stderr, flush=True)
        try:
            rows.append(_row(measure(m, args.target, args.repeat, args.calib_batches, args.method, not args.no_peers,
                                     args.other_bits, ort=not args.avx2)))
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the sweep goes on
            failed.append(f"{m}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            print(f"{m} FAILED: {failed[-1]}", file=sys.stderr, flush=True)
    if args.no_peers or args.avx2:
        dropped = (lambda k: "ORT" in k or "OV " in k or k.startswith("QDQ")) if args.no_peers else (  # noqa: E731
            lambda k: k.startswith("ORT") or "/ ORT" in k)  # --avx2: onnxruntime ran uncapped, so not at all
        rows = [{k: v for k, v in r.items() if not dropped(k)} for r in rows]
    print(f"# INT8 bench: batch 1, {THREADS} threads, target {args.target} ({spec.config.get('mcpu')}), "
          f"INT8 on {_simd(spec)}; {platform.processor() or platform.machine()}, tvmfuse {tvmfuse.__version__}, "
          f"TVM {tvm.__version__}, onnxruntime {_ort_version()}"
          + (f"; OpenVINO INT8 primitives: {', '.join(sorted(OPENVINO_ISAS))}" if OPENVINO_ISAS else ""))
    if rows:
        print(table(rows, list(rows[0])))
    for f in failed:
        print(f"- failed: {f}")
    return 1 if failed else 0


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    sys.exit(main())
