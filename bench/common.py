"""Measurement helpers shared by the bench scripts: one run, same threads, medians, ratios."""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

THREADS = int(os.environ.get("TVM_NUM_THREADS", "2"))
# TVM's thread pool reads this at start-up: set it before tvm is imported so TVM and ORT use equal threads.
os.environ.setdefault("TVM_NUM_THREADS", str(THREADS))


def median_ms(fn, repeat: int, warmup: int) -> float:
    """Median wall time of ``fn()`` in ms after ``warmup`` calls (``tvmfuse compare``'s timer)."""
    from tvmfuse.comparison.contenders import median_call_us  # after TVM_NUM_THREADS is set

    return median_call_us(fn, repeat, warmup) / 1e3


def interleaved_medians(fns: dict, repeat: int, warmup: int = 3, rounds: int | None = None) -> dict[str, float]:
    """Median ms of each callable, timed in alternating blocks so load from other jobs hits all alike.

    Blocks (not single runs) alternate, with a pause between contenders: onnxruntime's and TVM's
    worker threads spin for a while after a run and would otherwise steal the cores from the next one.
    Blocks are short (``rounds`` defaults to one per 6 runs): this machine's speed drifts by up to 1.5x
    over tens of seconds, and 5 long blocks let a drift land on one contender (ratios moved by 0.2).
    The order rotates every round, so no contender always runs right after the same other one (what a
    runtime leaves behind, spinning threads or a cold cache, lands on each alike).
    """
    times = {name: [] for name in fns}
    rounds = rounds or max(5, repeat // 6)
    per_round = max(1, repeat // rounds)
    order = list(fns.items())
    for r in range(rounds):
        for name, fn in order[r % len(order):] + order[:r % len(order)]:
            time.sleep(0.2)
            for _ in range(warmup):
                fn()
            for _ in range(per_round):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def named_model(name: str):
    """``(ModelProto, shapes or None)`` for an ``.onnx`` path, a corpus name (fetched; its table's shape) or a
    zoo name (``zoo:NAME`` or ``NAME``; its declared shapes)."""
    import onnx

    from tvmfuse import corpus, zoo

    if name.endswith(".onnx"):
        return onnx.load(name), None
    if name in corpus.names():
        entry = corpus.get(name)
        return onnx.load(str(corpus.prepared(entry))), entry.shapes
    name = name.removeprefix("zoo:")
    return zoo.get(name), zoo.default_shapes(name)


def ort_session(model):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def compile_and_session(name: str, target: str, logs=None):
    """zoo model ``name`` compiled by tvmfuse, its onnxruntime session, seeded inputs, compile seconds.

    ``logs`` as for ``tvmfuse.compile``: None applies the shipped tuning logs, False none.
    """
    import tvmfuse
    from tvmfuse import zoo

    model = zoo.get(name)
    start = time.perf_counter()
    cm = tvmfuse.compile(model, target=target, logs=logs)
    compile_s = time.perf_counter() - start
    return model, cm, ort_session(model), inputs_for(cm.inputs), compile_s


def ours_vs_ort(cm, sess, x, repeat: int) -> dict[str, float]:
    """Median ms of ``cm.run`` and onnxruntime's ``run`` on the same numpy inputs, timed alternately."""
    return interleaved_medians({"tvmfuse": lambda: cm.run(x), "onnxruntime": lambda: sess.run(None, x)}, repeat)


def plain_tvm(model, target_spec):
    """What a user gets from TVM alone: from_onnx + tvm.compile with the default pipeline."""
    import tvm
    from tvm import relax

    from tvmfuse import frontend

    imported = frontend.import_model(model)
    ex = tvm.compile(imported.mod, target=target_spec.tvm_target())
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm, imported.inputs


def inputs_for(infos, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal floats, small non-negative integers (what ``tvmfuse run`` feeds)."""
    from tvmfuse.tensors import random_inputs

    return random_inputs(infos, seed)


def table(rows: list[dict], columns: list[str]) -> str:
    """A Markdown table of ``rows`` (dicts) in ``columns`` order."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def conv_layer(cin: int, cout: int, size: int, kernel: int, stride: int, pad: int, groups: int, rng):
    """A one-layer ONNX model ``x[1, cin, size, size] -> Conv(bias) -> Relu`` with ``rng``'s weights."""
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(rng.standard_normal((cout, cin // groups, kernel, kernel)).astype("float32"), "W"),
             numpy_helper.from_array(rng.standard_normal(cout).astype("float32"), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[kernel, kernel], strides=[stride] * 2,
                              pads=[pad] * 4, group=groups), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", 1, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def single_partition(model, spec):
    """The one partition function of a one-op ``model``, as tvmfuse partitions it for ``spec``."""
    import tvm

    from tvmfuse import frontend
    from tvmfuse.passes.partition import Partition, composites
    from tvmfuse.passes.pipeline import canonicalize_passes

    mod = frontend.import_model(model).mod
    with spec.tvm_target(), tvm.transform.PassContext(opt_level=3):
        mod = Partition()(tvm.transform.Sequential(canonicalize_passes())(mod))
    (fn,) = composites(mod).values()
    return fn


def machine() -> str:
    """The CPU, its family/model and the vector features that matter here (reports must name the machine);
    the same line ``tvmfuse compare`` reports (:func:`tvmfuse.comparison.environment.cpu_name`)."""
    from tvmfuse.comparison.environment import cpu_name

    return cpu_name()


def openvino_isas(request) -> set[str]:
    """The kinds of the conv and matmul primitives an OpenVINO request runs (``brgconv_avx2_1x1_I8``,
    ``jit_avx512_core_vnni_1x1_I8``, ...): which ISA oneDNN took."""
    kinds = set()
    for op in request.get_compiled_model().get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) in ("Convolution", "FullyConnected", "MatMul"):
            kinds.add(info["primitiveType"].astype(str))
    return kinds


def openvino_runner(model, shapes: dict, calib: list | None = None):
    """An OpenVINO CPU request for ``model`` at ``shapes``, float32, THREADS threads; None if not installed.

    With ``calib`` (feed dicts), the model is first quantized to INT8 by NNCF (``nncf.quantize``, OpenVINO's
    own post-training quantizer, default preset) on those batches; None if NNCF is not installed."""
    try:
        import openvino as ov
        if calib is not None:
            import nncf
    except ImportError:
        return None
    import tempfile
    from pathlib import Path

    import onnx

    core = ov.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = model
        if isinstance(model, onnx.ModelProto):
            path = str(Path(tmp) / "model.onnx")
            onnx.save(model, path)
        net = core.read_model(path)
        net.reshape({name: ov.PartialShape(list(s)) for name, s in shapes.items()})
        if calib is not None:
            net = nncf.quantize(net, nncf.Dataset(calib), subset_size=len(calib))
        compiled = core.compile_model(net, "CPU", {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY",
                                                   "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    return request
