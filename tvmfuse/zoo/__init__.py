"""Built-in ONNX models generated in code (random, seeded weights).

The architectures are real published ones (layer counts, channels, strides
and padding as released), so compiled code exercises realistic shapes without
shipping weight files. Where the full model would make tests slow, the input
is smaller or the width/depth is reduced; each function's docstring says so,
and also which exporter's ONNX spelling the model imitates (torch's legacy
exporter, the dynamo exporter at opset 18, or paddle2onnx with ``Constant``
weights and a ``-1`` batch dimension). This is a bottom-layer module: it
imports only onnx and numpy, never TVM or the rest of tvmfuse.

Models: ``convnext_tiny`` (shrunk), ``crnn`` (BiLSTM + BiGRU),
``deeplabv3_mobilenet_v2``, ``efficientnet_lite0``, ``mobilenet_v2``,
``mobilenet_v3_large``, ``resnet18``, ``resnet50``, ``resnext50_32x4d``,
``shufflenet_v2``, ``tiny_convnet``, ``unet`` and ``yolov8n``.

Examples
--------
>>> from tvmfuse import zoo
>>> zoo.names()  # doctest: +NORMALIZE_WHITESPACE
['convnext_tiny', 'crnn', 'deeplabv3_mobilenet_v2', 'efficientnet_lite0',
 'mobilenet_v2', 'mobilenet_v3_large', 'resnet18', 'resnet50',
 'resnext50_32x4d', 'shufflenet_v2', 'tiny_convnet', 'unet', 'yolov8n']
>>> model = zoo.get("tiny_convnet")
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import onnx

from .convnext import convnext_tiny
from .crnn import crnn
from .deeplab import deeplabv3_mobilenet_v2
from .efficientnet import efficientnet_lite0
from .mobilenet import mobilenet_v2
from .mobilenet_v3 import mobilenet_v3_large
from .resnet import resnet18, resnet50
from .resnext import resnext50_32x4d
from .shufflenet import shufflenet_v2
from .tiny import tiny_convnet
from .unet import unet
from .yolo import yolov8n

__all__ = ["LOOSER_BOUNDS", "REAL_EXPORTS", "default_shapes", "get", "names", "tolerance"]

_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    "convnext_tiny": convnext_tiny,
    "crnn": crnn,
    "deeplabv3_mobilenet_v2": deeplabv3_mobilenet_v2,
    "efficientnet_lite0": efficientnet_lite0,
    "mobilenet_v2": mobilenet_v2,
    "mobilenet_v3_large": mobilenet_v3_large,
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnext50_32x4d": resnext50_32x4d,
    "shufflenet_v2": shufflenet_v2,
    "tiny_convnet": tiny_convnet,
    "unet": unet,
    "yolov8n": yolov8n,
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
        calls and processes. Input ``input`` (float32 NCHW), output ``output``;
        a declared dimension of ``-1`` is a dynamic batch.

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


#: The models written the way real exporters write them (PyTorch legacy and dynamo, Paddle), sized for fast tests:
#: the zoo half of the real-model measurements (``bench/real_models.py``).
REAL_EXPORTS = ("yolov8n", "mobilenet_v3_large", "deeplabv3_mobilenet_v2", "unet", "shufflenet_v2",
                "resnext50_32x4d", "convnext_tiny", "crnn")

#: Zoo models whose outputs amplify float32 rounding: the rtol = atol bound they match onnxruntime within,
#: and why. Every other model matches within 1e-4.
LOOSER_BOUNDS: dict[str, tuple[float, str]] = {
    "yolov8n": (1e-3, "the DFL head multiplies box distances by the stride (up to 32), so 2e-5 of summation-order "
                      "noise in a softmax expectation becomes 7e-4 in pixels"),
}


def tolerance(name: str) -> float:
    """The rtol = atol bound zoo model ``name`` must match onnxruntime within."""
    return LOOSER_BOUNDS.get(name, (1e-4, ""))[0]


def default_shapes(name: str) -> dict[str, tuple[int, ...]]:
    """The declared input shapes of ``name``, a dynamic (``-1``) batch taken as 1.

    ``tvmfuse compile zoo:NAME`` uses these when no shape is given; a model file with a dynamic dim needs one.
    """
    return {v.name: tuple(d.dim_value if d.dim_value > 0 else 1 for d in v.type.tensor_type.shape.dim)
            for v in get(name).graph.input}
