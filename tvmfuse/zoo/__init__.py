"""Built-in ONNX models generated in code (random, seeded weights).

The architectures are real published ones (layer counts, channels, strides
and padding as released), so compiled code exercises realistic shapes without
shipping weight files. This is a bottom-layer module: it imports only onnx
and numpy, never TVM or the rest of tvmfuse.

Examples
--------
>>> from tvmfuse import zoo
>>> zoo.names()
['efficientnet_lite0', 'mobilenet_v2', 'resnet18', 'resnet50', 'tiny_convnet']
>>> model = zoo.get("tiny_convnet")
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import onnx

from .efficientnet import efficientnet_lite0
from .mobilenet import mobilenet_v2
from .resnet import resnet18, resnet50
from .tiny import tiny_convnet

__all__ = ["get", "names"]

_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "efficientnet_lite0": efficientnet_lite0,
    "mobilenet_v2": mobilenet_v2,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "tiny_convnet": tiny_convnet,
}


def names() -> list[str]:
    """Names of the built-in models, sorted.

    Returns
    -------
    list of str
        Valid arguments for :func:`get`.
    """
    return sorted(_MODELS)


@functools.lru_cache(maxsize=None)
def _serialized(name: str) -> bytes:
    # Cache bytes, not the proto: a ModelProto is mutable and callers
    # (optimisers, quantisers) routinely edit models in place.
    return _MODELS[name]().SerializeToString()


def get(name: str) -> onnx.ModelProto:
    """Build (or fetch from cache) a built-in model.

    Parameters
    ----------
    name : str
        One of :func:`names`.

    Returns
    -------
    onnx.ModelProto
        A fresh copy each call; the serialized bytes are identical across
        calls and processes. Input ``input`` (float32 NCHW), output ``output``.

    Raises
    ------
    ValueError
        If ``name`` is not a known model; the message lists the known names.
    """
    if name not in _MODELS:
        raise ValueError(f"unknown zoo model {name!r}; known models: {', '.join(names())}")
    model = onnx.ModelProto()
    model.ParseFromString(_serialized(name))
    return model
