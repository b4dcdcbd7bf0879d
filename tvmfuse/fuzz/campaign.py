"""A fuzzing campaign: every check of one seed (:func:`check_seed`), over a range of seeds in one process or
several (:func:`run`). ``bench/fuzz.py`` is the command line around it."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator, Sequence

from . import check, graphs, int8, winograd

AVX2 = {"kind": "llvm", "mcpu": "haswell"}  # the INT8 kernels' exact AVX2 step, on any host that runs AVX2
# The kinds of graph a campaign draws: seed -> ONNX model
GRAPHS = {"cnn": graphs.random_cnn, "winograd": winograd.random_winograd}


@dataclasses.dataclass
class SeedReport:
    """What one seed checked: the FP32 graph in each layout, and with ``int8`` its quantized model and one
    random INT8 kernel case per INT8 target (``kernel_case`` names it)."""

    seed: int
    results: list[check.Result]
    kernel_case: int8.KernelCase | None = None

    @property
    def failures(self) -> list[check.Result]:
        return [r for r in self.results if not r.ok]

    @property
    def graph_failed(self) -> bool:
        """Whether the random graph (FP32 or quantized) failed, as opposed to the kernel case alone."""
        return any(not r.layout.startswith("int8 ") for r in self.failures)

    def to_json(self) -> dict:
        return {"seed": self.seed, "failures": [r.to_json() for r in self.failures],
                "results": [{"layout": r.layout, "status": r.status} for r in self.results],
                "kernel_case": dataclasses.asdict(self.kernel_case) if self.kernel_case else None}


def int8_targets(target=check.HOST) -> list:
    """``target``, and the AVX2 target when it is another kernel path this host can run (no VNNI there)."""
    from tvmfuse import targets

    chosen = [target]
    spec, avx2 = targets.resolve(target), targets.resolve(AVX2)
    if "avx512vnni" in spec.features() and avx2.backend().runs_on_this_cpu():
        chosen.append(AVX2)
    return chosen


def check_seed(seed: int, layouts: Sequence[str] = check.LAYOUTS, target=check.HOST, quantized: bool = False,
               rtol: float = check.RTOL, atol: float = check.ATOL, kind: str = "cnn") -> SeedReport:
    """Check the graph of ``seed`` (``kind`` of :data:`GRAPHS`) in each layout; with ``quantized``, also its INT8
    model and ``int8.random_case(seed)`` on each of :func:`int8_targets`."""
    model = GRAPHS[kind](seed)
    results = check.check_model(model, layouts, target, rtol=rtol, atol=atol) if layouts else []
    case = None
    if quantized:
        results.append(check.check_quantized(model, target))
        case = int8.random_case(seed)
        results += [int8.check_case(case, t) for t in int8_targets(target)]
    return SeedReport(seed, results, case)


def _check_seed_args(args) -> SeedReport:
    return check_seed(*args)


def run(seeds: Sequence[int], layouts: Sequence[str] = check.LAYOUTS, target=check.HOST, quantized: bool = False,
        jobs: int = 1, kind: str = "cnn") -> Iterator[SeedReport]:
    """:func:`check_seed` over ``seeds``, in order; ``jobs`` > 1 runs that many worker processes (spawned,
    one TVM thread each)."""
    if jobs <= 1:
        for seed in seeds:
            yield check_seed(seed, layouts, target, quantized, kind=kind)
        return
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    saved = os.environ.get("TVM_NUM_THREADS")
    os.environ["TVM_NUM_THREADS"] = "1"  # the workers share the cores: one TVM thread each, read at their start
    try:
        pool = ctx.Pool(jobs)
    finally:
        if saved is None:
            del os.environ["TVM_NUM_THREADS"]
        else:
            os.environ["TVM_NUM_THREADS"] = saved
    with pool:
        yield from pool.imap(_check_seed_args, [(s, tuple(layouts), target, quantized, check.RTOL, check.ATOL, kind)
                                                    for s in seeds])
