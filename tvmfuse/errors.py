"""Exceptions raised by tvmfuse.

Every error a user can cause (bad file, unsupported op, wrong input) is a :class:`TvmfuseError`, so the CLI
can print one line and exit with status 2, while bugs in tvmfuse itself still surface as tracebacks.
"""


import contextvars

# The interface a call came through: "python" (keyword arguments) or "cli" (flags). The CLI sets it, so that a
# message names what the user typed (``--shape x:...`` in a shell, ``shapes={...}`` in Python).
INTERFACE = contextvars.ContextVar("tvmfuse_interface", default="python")


def spelled(python: str, cli: str) -> str:
    """``cli`` when the call came through the command line, else ``python``."""
    return cli if INTERFACE.get() == "cli" else python


class TvmfuseError(Exception):
    """Base class of the errors caused by bad input, not by a bug in tvmfuse."""


class ModelLoadError(TvmfuseError):
    """The model file is missing, unreadable or not ONNX."""


class UnsupportedOpError(TvmfuseError):
    """The model holds an operator tvmfuse cannot import."""


class ShapeError(TvmfuseError):
    """A model input has dynamic dimensions and no static shape was given, or the shape given is invalid."""


class InputError(TvmfuseError, ValueError):
    """Inputs passed to ``run`` do not match the model's inputs (name, shape or dtype)."""


class TargetError(TvmfuseError):
    """An unknown target name, or a target this machine cannot run."""
