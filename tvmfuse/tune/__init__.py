"""Auto-tuning: the tuning-log store (``database``, used by compile) and the MetaSchedule driver (``tuner``).

For scripts::

    from tvmfuse.tune import tune

    report = tune("model.onnx", trials=32, logs="my_logs")   # this machine; see tvmfuse.tune.tuner.tune
    print(report.table())
    tvmfuse.compile("model.onnx", logs="my_logs")             # applies what was tuned

``docs/examples/tune_two_models.py`` tunes two models into one log folder and compiles with it.
"""

__all__ = ["RPCSpec", "TuneReport", "TuningError", "tune"]


def __getattr__(name: str):
    # Imported on first use: compile reads the log store (``tvmfuse.tune.database``) without the tuner's imports.
    if name in ("tune", "TuneReport"):
        from . import tuner

        return getattr(tuner, name)
    if name in ("RPCSpec", "TuningError"):
        from . import measure

        return getattr(measure, name)
    raise AttributeError(f"module 'tvmfuse.tune' has no attribute {name!r}")
