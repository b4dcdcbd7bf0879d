"""Compile a model with tvmfuse and compare every output with onnxruntime: the oracle of differential fuzzing.

Tolerance (float32): an output element passes when ``|got - want| <= atol * max(1, peak) + rtol * |want|``,
``peak`` the output's largest magnitude, ``atol = rtol = 1e-4`` by default. Why this is honest: the fuzz
graphs keep activations O(1) (weights scaled by ``1 / sqrt(fan_in)``), so the rounding error of a float32
sum of ``K`` O(1) terms is about ``sqrt(K) * 6e-8``; with ``K`` at most a few hundred per layer (16 channels
x 5 x 5) and up to a dozen layers, tvmfuse and onnxruntime (different summation orders, FMA contraction,
blocked layouts, batch-norm folded into the weights) differ by ~1e-6 of the output's scale. 1e-4 leaves two
orders of magnitude of room and still catches every indexing, padding or epilogue error, which move an
element by O(1) of the scale (a real difference of ``1e-4 * peak`` is a few ulps times ``K``, not a bug).
The reference runs with one intra-op thread and no graph optimizations (deterministic, each node as ONNX
defines it).

INT8 (:func:`check_quantized`): the quantized model is compared with the FP32 model on onnxruntime, the
largest absolute difference of any element divided by the FP32 output's range (max - min). The bound
(``INT8_BOUND``, 0.15) is stated where it is defined.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Callable, Sequence

import numpy as np
import onnx

RTOL = ATOL = 1e-4
HOST = "x86-host"
LAYOUTS = ("blocked", "nchw")
# INT8 vs FP32: the largest element difference as a fraction of the FP32 output's range. Each quantized
# tensor carries a rounding error of up to half a step, 1/510 of its calibrated range; a fuzz graph chains up
# to ~8 quantized layers whose errors add up (and grow through weights and activations), and outputs
# downstream of a sigmoid or a head concentrate the range. Measured over seeds 0-199 (minmax calibration,
# evaluated on a calibration batch): at most 0.101 (seed 148: a conv, then two ConvTransposes, which became
# INT8 convs when TransposeConvToConv took every groups-1 form; alone each quantizes exactly as the equivalent
# conv, 0.0055, and the three chained give 0.101 against 0.041 with the first only), next 0.031, median 0.006.
# 0.15 leaves 1.5x the largest; a wrong INT8 kernel (a shifted window, a lost zero point, one channel
# computed for all) is O(1): 0.82 for seed 9's depthwise bug.
INT8_BOUND = 0.15


@dataclasses.dataclass
class OutputCheck:
    """One output compared: the largest absolute error, that error over ``max(1, peak)``, and the worst
    ``|error| / allowed`` over the elements (above 1: mismatch)."""

    name: str
    max_abs: float
    max_rel: float
    worst: float
    message: str = ""

    @property
    def ok(self) -> bool:
        return not self.message and self.worst <= 1.0


@dataclasses.dataclass
class Result:
    """One model checked in one configuration (``layout``: ``blocked``, ``nchw`` or ``int8``).

    ``status`` is ``ok``, ``mismatch`` (an output beyond tolerance), or ``error`` (``stage`` says where:
    ``reference``, ``compile`` or ``run``; ``error`` is the exception's one-line message).
    """

    layout: str
    status: str
    outputs: list[OutputCheck] = dataclasses.field(default_factory=list)
    stage: str = ""
    error: str = ""
    seconds: float = 0.0
    info: dict = dataclasses.field(default_factory=dict)  # int8: the INT8 / FP32 partition counts

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def line(self) -> str:
        """One line: what failed, and how."""
        if self.status == "error":
            return f"{self.layout}: {self.stage} error: {self.error}"
        bad = [o for o in self.outputs if not o.ok]
        return f"{self.layout}: {self.status} " + "; ".join(
            f"{o.name} {o.message or f'max abs {o.max_abs:.3g}, rel {o.max_rel:.3g} ({o.worst:.1f}x the bound)'}"
            for o in (bad or self.outputs))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    text = str(exc).strip().splitlines()
    line = next((t.strip() for t in text if t.strip()), "")
    return f"{type(exc).__name__}: {line}"[:300]


def input_shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    from tvmfuse.frontend.load import graph_inputs

    return {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in graph_inputs(model)}


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard normal float32 inputs of the model's static shapes."""
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in input_shapes(model).items()}


def ort_outputs(model: onnx.ModelProto, inputs: dict, threads: int = 1) -> list[np.ndarray]:
    """onnxruntime's CPU outputs, ``threads`` intra-op threads, graph optimizations off."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def compare(name: str, got: np.ndarray, want: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> OutputCheck:
    """``got`` against ``want`` under the module's tolerance."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return OutputCheck(name, float("inf"), float("inf"), float("inf"), f"shape {got.shape} != {want.shape}")
    if not np.isfinite(got).all() and np.isfinite(want).all():
        return OutputCheck(name, float("inf"), float("inf"), float("inf"), "non-finite values")
    if got.size == 0:
        return OutputCheck(name, 0.0, 0.0, 0.0)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    scale = max(1.0, float(np.abs(want).max()))
    allowed = atol * scale + rtol * np.abs(want.astype(np.float64))
    return OutputCheck(name, float(err.max()), float(err.max() / scale), float((err / allowed).max()))


def _outputs_checked(names: Sequence[str], got: list, want: list, **tol) -> tuple[str, list[OutputCheck]]:
    checks = [compare(n, g, w, **tol) for n, g, w in zip(names, got, want)]
    if len(got) != len(want):
        checks.append(OutputCheck("outputs", float("inf"), float("inf"), float("inf"),
                                  f"{len(got)} outputs, the reference has {len(want)}"))
    return ("ok" if all(c.ok for c in checks) else "mismatch"), checks


Reference = Callable[[onnx.ModelProto, dict], list]


def check_model(model: onnx.ModelProto, layouts: Sequence[str] = LAYOUTS, target=HOST, rtol: float = RTOL,
                atol: float = ATOL, seed: int = 0, reference: Reference | None = None) -> list[Result]:
    """Compile ``model`` once per layout for ``target``, run it on seeded random inputs, compare with onnxruntime.

    Parameters
    ----------
    model : onnx.ModelProto
        Static input shapes.
    layouts : sequence of str
        ``compile(layout=...)`` values to check.
    target : str, dict or TargetSpec
        A target this CPU can run.
    rtol, atol : float
        The tolerance of the module docstring.
    seed : int
        Seed of the inputs.
    reference : callable, optional
        ``(model, inputs) -> outputs``; :func:`ort_outputs` by default.

    Returns
    -------
    list of Result
        One per layout. Exceptions become ``error`` results with their one-line message; none propagates
        (a reference that fails marks every layout: the model, not tvmfuse, is at fault).
    """
    from tvmfuse import api

    inputs = random_inputs(model, seed)
    names = [o.name for o in model.graph.output]
    try:
        want = (reference or ort_outputs)(model, inputs)
    except Exception as exc:  # noqa: BLE001 - a bad model is reported, not raised
        return [Result(layout, "error", stage="reference", error=one_line(exc)) for layout in layouts]
    results = []
    for layout in layouts:
        start, stage = time.perf_counter(), "compile"
        try:
            cm = api.compile(model, target=target, layout=layout, logs=False)
            stage = "run"
            got = cm.run(inputs)
            status, checks = _outputs_checked(names, got, want, rtol=rtol, atol=atol)
            results.append(Result(layout, status, checks, seconds=time.perf_counter() - start))
        except Exception as exc:  # noqa: BLE001 - one failing graph must not end a campaign
            results.append(Result(layout, "error", stage=stage, error=one_line(exc),
                                  seconds=time.perf_counter() - start))
    return results


def calibration_batches(model: onnx.ModelProto, count: int = 4, seed: int = 0) -> list[dict]:
    return [random_inputs(model, seed + i) for i in range(count)]


def int8_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest absolute difference over the FP32 output's range (max - min)."""
    want = np.asarray(want, np.float64)
    span = float(want.max() - want.min()) if want.size else 0.0
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) if want.size else 0.0
    return err / span if span > 0 else (0.0 if err == 0 else float("inf"))


def check_quantized(model: onnx.ModelProto, target=HOST, bound: float = INT8_BOUND, batches: int = 4,
                    seed: int = 0, reference: Reference | None = None) -> Result:
    """``tvmfuse.quantize`` ``model`` (minmax over ``batches`` seeded random batches) and compare its outputs
    on the first batch with the FP32 model on onnxruntime: :func:`int8_error` of each output at most ``bound``.

    On a calibration batch, no activation leaves its calibrated range, so what remains is the rounding of
    the INT8 arithmetic itself (see ``INT8_BOUND``). Returns a :class:`Result` with layout ``int8`` whose
    outputs carry the error as ``max_rel`` and ``worst = error / bound``, and whose ``info`` counts the
    partitions that became INT8 kernels and those that stayed FP32 (grouped convs, sigmoid epilogues, ...).
    """
    from tvmfuse import api
    from tvmfuse.passes.int8.quantize import QuantizeWarning

    calib = calibration_batches(model, batches, seed)
    names = [o.name for o in model.graph.output]
    try:
        want = (reference or ort_outputs)(model, calib[0])
    except Exception as exc:  # noqa: BLE001
        return Result("int8", "error", stage="reference", error=one_line(exc))
    start, stage = time.perf_counter(), "compile"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QuantizeWarning)  # "nothing to quantize": counted in ``info``
            cm = api.quantize(model, calib=calib, method="minmax", target=target, logs=False)
        stage = "run"
        got = cm.run(calib[0])
    except Exception as exc:  # noqa: BLE001
        return Result("int8", "error", stage=stage, error=one_line(exc), seconds=time.perf_counter() - start)
    info = {k: cm.quantization[k] for k in ("int8_partitions", "fp32_partitions")}
    checks = []
    for name, g, w in zip(names, got, want):
        if np.shape(g) != np.shape(w):
            inf = float("inf")
            checks.append(OutputCheck(name, inf, inf, inf, f"shape {np.shape(g)} != {np.shape(w)}"))
            continue
        err = int8_error(g, w)
        checks.append(OutputCheck(name, float(np.abs(np.asarray(g) - w).max(initial=0)), err, err / bound))
    status = "ok" if all(c.ok for c in checks) and len(got) == len(want) else "mismatch"
    return Result("int8", status, checks, seconds=time.perf_counter() - start, info=info)
