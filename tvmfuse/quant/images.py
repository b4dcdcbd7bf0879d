"""Calibration data users have: a folder of images (JPEG, PNG, ...) turned into model inputs with a stated
preprocessing, and seeded random batches for a quick check (``random:N``).

The preprocessing is what the model was trained with, so tvmfuse never guesses it: a preset (``imagenet``,
``unit``, ``symmetric``, ``raw``) or its parts (``mean``, ``std``, ``layout``, ``bgr``). Each image is
read with Pillow, converted to RGB (grey for a one-channel input), resized to the input's height and width
(bilinear), scaled (``scale``: 1/255 maps 0..255 to 0..1), normalised per channel, ``(x - mean) / std``, put in
BGR order if asked and laid out NCHW or NHWC; one image is one sample.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np

from ..tensors import TensorInfo, random_inputs
from .table import CalibrationError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


@dataclasses.dataclass(frozen=True)
class Preprocess:
    """How an image becomes one sample of a model input.

    Attributes
    ----------
    scale : float
        Multiplies the 0..255 pixel values first (1/255: to 0..1).
    mean, std : tuple of float
        Per channel (one value: every channel), in the scaled units: ``(x * scale - mean) / std``.
    layout : str
        ``"NCHW"`` (channels first, PyTorch and PaddlePaddle exports) or ``"NHWC"`` (TensorFlow exports).
    bgr : bool
        Channels in BGR order (OpenCV-trained models) instead of RGB.

    Images are resized to the model input's height and width (``--shape`` / ``shapes=`` sets those of a model
    whose size is dynamic).
    """

    scale: float = 1 / 255
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    layout: str = "NCHW"
    bgr: bool = False


PRESETS = {
    "imagenet": Preprocess(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),  # torchvision's classifiers
    "unit": Preprocess(),  # 0..1
    "symmetric": Preprocess(mean=(0.5,), std=(0.5,)),  # -1..1 (PaddleOCR's recognizers, many GANs)
    "raw": Preprocess(scale=1.0),  # 0..255 as float
}


def preprocess_of(preset: str | Preprocess | None = None, *, mean=None, std=None, layout: str | None = None,
                  bgr: bool | None = None) -> Preprocess:
    """A :class:`Preprocess` from a preset name (or object) with any part replaced.

    Raises
    ------
    CalibrationError
        An unknown preset, neither a preset nor ``mean``/``std``, or a part of the wrong form.
    """
    if isinstance(preset, Preprocess):
        base = preset
    elif preset is None:
        if mean is None or std is None:
            raise CalibrationError("images need their preprocessing: a preset (" + ", ".join(PRESETS) +
                                   ") or both mean and std")
        base = PRESETS["unit"]
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise CalibrationError(f"unknown preprocessing preset {preset!r}; presets: {', '.join(PRESETS)}")
    changes = {}
    for name, value in (("mean", mean), ("std", std)):
        if value is not None:
            values = tuple(float(v) for v in ([value] if np.isscalar(value) else value))
            if not values or (name == "std" and any(v == 0 for v in values)):
                raise CalibrationError(f"{name} {value!r}: give one value or one per channel" +
                                       (", none of them 0" if name == "std" else ""))
            changes[name] = values
    if layout is not None:
        if layout.upper() not in ("NCHW", "NHWC"):
            raise CalibrationError(f"image layout {layout!r} is not NCHW or NHWC")
        changes["layout"] = layout.upper()
    if bgr is not None:
        changes["bgr"] = bool(bgr)
    return dataclasses.replace(base, **changes)


def image_files(folder: Path) -> list[Path]:
    """The image files of ``folder`` (by suffix), in name order."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def load_images(folder: Path, info: TensorInfo, preprocess: Preprocess) -> np.ndarray:
    """Every image of ``folder`` as one sample of input ``info``: an array (N, *sample shape).

    Raises
    ------
    CalibrationError
        Pillow missing, an input that is not an image batch (rank 4, float), channels that do not fit, an
        unreadable image (named).
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise CalibrationError("reading calibration images needs Pillow: pip install 'tvmfuse[images]'") from None
    if len(info.shape) != 4 or not info.dtype.startswith("float"):
        raise CalibrationError(f"{folder}: input {info.name!r} {tuple(info.shape)} {info.dtype} does not take "
                               "images (a float input of rank 4 does)")
    channels_first = preprocess.layout == "NCHW"
    channels, height, width = (info.shape[1:] if channels_first else (info.shape[3], *info.shape[1:3]))
    if channels not in (1, 3):
        raise CalibrationError(f"{folder}: input {info.name!r} has {channels} channels; images give 1 or 3 "
                               f"(is its layout {'NHWC' if channels_first else 'NCHW'}?)")
    mean, std = _per_channel(preprocess.mean, channels, "mean"), _per_channel(preprocess.std, channels, "std")
    samples = []
    for path in image_files(folder):
        try:
            with Image.open(path) as image:
                pixels = image.convert("RGB" if channels == 3 else "L").resize((width, height), Image.BILINEAR)
        except (OSError, UnidentifiedImageError, ValueError) as e:
            raise CalibrationError(f"{path}: cannot read as an image ({type(e).__name__}: {e})") from None
        x = np.asarray(pixels, dtype=np.float32).reshape(height, width, channels) * np.float32(preprocess.scale)
        x = (x - mean) / std
        if preprocess.bgr and channels == 3:
            x = x[..., ::-1]
        samples.append(x.transpose(2, 0, 1) if channels_first else x)
    if not samples:
        raise CalibrationError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)})")
    return np.ascontiguousarray(np.stack(samples), dtype=info.dtype)


def _per_channel(values: tuple, channels: int, name: str) -> np.ndarray:
    if len(values) not in (1, channels):
        raise CalibrationError(f"{name} has {len(values)} values for {channels} channels")
    return np.asarray(values * (channels if len(values) == 1 else 1), np.float32)


def random_batches(inputs: Sequence[TensorInfo], count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``count`` seeded batches of random inputs (``tensors.random_inputs``: what ``tvmfuse run`` feeds)."""
    return [random_inputs(inputs, seed + i) for i in range(count)]
