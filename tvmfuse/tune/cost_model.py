"""The XGBoost cost model of offline tuning: it learns from every candidate a device timed, and ranks the
candidates of the next round.

A lent GPU times a round of candidates in minutes, and what a call may carry is capped (64 MiB), so the
candidates worth building are the ones likely to win. MetaSchedule's ``XGBModel`` (its per-store features of
the scheduled TIR, trained on each kernel's times relative to that kernel's fastest) is kept next to the
target's tuning logs (``tuning_logs/<target>/cost_model.tar``: the booster and every sample):

- :func:`learn` adds each timed kernel's correct candidates when their results are imported
  (``tvmfuse tune --import-results``) and retrains;
- :func:`rank` orders a kernel's candidates by predicted speed; ``--export-candidates DIR --max-candidates N``
  then builds the default and the N - 1 best predicted. Below :data:`MIN_SAMPLES` samples the predictions
  are noise (XGBoost on a dozen points), and every candidate is built.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

FILE = "cost_model.tar"
MIN_SAMPLES = 64


@contextlib.contextmanager
def _quiet():
    """XGBoost warns on every save and load that MetaSchedule's ``model.bin`` is written as UBJSON."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(UBJSON|Unknown file format).*", category=UserWarning)
        yield


def _xgb():
    from tvm.s_tir import meta_schedule as ms

    from ..tvmscript import light_tensor_intrin

    light_tensor_intrin("cuda")  # a TuneContext would import every target's intrinsics otherwise
    return ms.cost_model.XGBModel(num_warmup_samples=0, num_tuning_cores=1, verbose_eval=0)


def load(folder: Path):
    """The model kept in ``folder`` (a target's tuning logs), or a new empty one."""
    model = _xgb()
    path = Path(folder) / FILE
    if path.is_file():
        with _quiet():
            model.load(str(path))
    return model


def samples(model) -> int:
    return int(model.data_size)


def _context(mod, target):
    from tvm.s_tir import meta_schedule as ms

    return ms.TuneContext(mod=mod, target=target, num_threads=1)


def _candidates(mod, traces, args_info) -> list:
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    found = []
    for trace in traces:
        sch = s_tir.Schedule(mod)
        trace.apply_to_schedule(sch, remove_postproc=False)
        found.append(ms.MeasureCandidate(sch, args_info))
    return found


def learn(folder: Path, kernels: list) -> int:
    """Add ``kernels`` (``(mod, target, args_info, [(trace, us), ...])`` each: the correct candidates of one
    kernel and their device times) to the model in ``folder``, retrain, save; return its sample count."""
    from tvm.s_tir import meta_schedule as ms

    import numpy as np
    from tvm.s_tir.meta_schedule.utils import shash2hex

    model = load(folder)
    for mod, target, args_info, timed in kernels:
        group = model.data.get(shash2hex(mod))
        seconds = np.float32([us * 1e-6 for _, us in timed])  # (MetaSchedule keeps float32 times)
        if not timed or (group is not None and np.isin(seconds, np.float32(group.costs)).all()):
            continue  # nothing, or times this kernel already taught it (a results file imported again)
        context = _context(mod, target)
        results = [ms.runner.RunnerResult([us * 1e-6], None) for _, us in timed]
        model.update(context, _candidates(mod, [trace for trace, _ in timed], args_info), results)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{FILE}.{os.getpid()}.tmp"
    with _quiet():
        model.save(str(tmp))
    os.replace(tmp, folder / FILE)  # readers see the old model or the new one, never half of one
    return samples(model)


def rank(model, mod, target, args_info, traces) -> list[int] | None:
    """Indices of ``traces`` from the fastest predicted; None while the model has fewer than
    :data:`MIN_SAMPLES` samples."""
    if samples(model) < MIN_SAMPLES or model.booster is None:
        return None
    scores = model.predict(_context(mod, target), _candidates(mod, traces, args_info))
    return sorted(range(len(traces)), key=lambda i: -float(scores[i]))
