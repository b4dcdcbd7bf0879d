"""``tvmfuse compile`` and ``quantize`` of a model the cache holds, answered without TVM (:mod:`.cache.hits`),
and the lines both commands print about what they wrote."""

from __future__ import annotations

import collections
import sys
import time

from .cache import hits, resolve
from .cache.cli import describe as describe_cache
from .cached_build import consts_digest, model_digest, quantize_digest


def _export(args, options: dict, start: float):
    """Export the build answering the request of ``args.model`` for ``args.target`` with ``options``
    (:func:`.cache.hits.request_key`) to ``args.output``; (path, record, state), or None when the cache holds
    none (nothing written)."""
    store = resolve(None)
    digest = model_digest(store, args.model, hand_on=True)
    request = digest and hits.request_key(digest, args.target, options)
    done = request and hits.export_answer(store, request, args.output)
    if not done:
        return None
    path, record, state = done
    if not args.quiet:
        print(f"[1/1] cached build {record['whole'][:12]} ({len(state['kernels'])} kernels, {store.root}) ... "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return done


def _hit(state: dict) -> dict:
    return {"model": "hit", "kernels": len(state["kernels"]), "from_cache": len(state["kernels"])}


def compile_recorded(args, logs, shapes, consts) -> bool:
    """``tvmfuse compile`` from the cache without TVM; False (nothing written) when the cache holds no answer."""
    start = time.perf_counter()
    options = hits.request_options(shapes, consts_digest(consts), args.layout, args.precision,
                                   not args.no_cuda_graph, logs)
    done = _export(args, options, start)
    if done is None:
        return False
    path, record, state = done
    report_compile(path, record["target_fields"]["target"]["name"], state["build_info"], state["scheduled_by"],
                   _hit(state), state["tuning_logs"])
    return True


def quantize_recorded(args, logs, shapes, consts, preprocess, percentile: float) -> bool:
    """``tvmfuse quantize`` from the cache without TVM, for a calibration source a whole build may be reused for
    (not when a new table is written); False (nothing written) otherwise."""
    start = time.perf_counter()
    source = quantize_digest(args.calib, args.table, preprocess)
    if source is None:
        return False
    layout = getattr(args, "layout", "blocked")  # what api.quantize builds when the command names none
    options = hits.quantize_options(hits.request_options(shapes, consts_digest(consts), layout, "int8",
                                                         not args.no_cuda_graph, logs),
                                    source, args.method, percentile, args.weight_bits)
    done = _export(args, options, start)
    if done is None:
        return False
    path, record, state = done
    report_quantize(path, record["target_fields"]["target"]["name"], state["quantization"], _hit(state))
    return True


def schedulers(scheduled_by: dict) -> str:
    """``{kernel: who}`` as one line, most kernels first: ``20 tvmfuse.cuda.conv2d, 10 ..., 1 dlight.Fallback``."""
    counts = collections.Counter(scheduled_by.values())
    return ", ".join(f"{n} {who}" for who, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def report_compile(path, target_name: str, build_info: dict, scheduled_by: dict, cache_info: dict, tuning_logs):
    print(f"wrote {path} and {path.with_suffix('.json').name} (target {target_name})")
    if "cuda_graph" in build_info:
        captured = build_info["cuda_graph"]
        print("kernel launches: " + ("captured in a CUDA graph on the first run, replayed after" if captured
                                      else "one by one on every run (no CUDA graph)"))
    print(f"kernels scheduled by: {schedulers(scheduled_by)}")
    print(describe_cache(cache_info))
    if tuning_logs:
        info, filled = tuning_logs, tuning_logs.get("filled_from")
        print(f"tuning logs {info['path']}: {len(info['applied'])} kernel(s) tuned, {info['records']} records read"
              + (f" ({filled['records']} from {filled['path']})" if filled else "")
              + (f", {info['skipped_lines']} bad line(s) skipped" if info["skipped_lines"] else ""))


def report_quantize(path, target_name: str, q: dict, cache_info: dict) -> None:
    print(f"wrote {path} and {path.with_suffix('.json').name} (target {target_name}): "
          f"{q['int8_partitions']} INT8 partition(s) ({q['weight_bits']}-bit weights), {q['fp32_partitions']} FP32, "
          f"{q['quantize_ops']} quantize / {q['dequantize_ops']} dequantize op(s)")
    print(describe_cache(cache_info))
