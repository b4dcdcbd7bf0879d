"""Calibration data: read sample batches from an ``.npz`` file, a directory of ``.npy`` files or a directory of
images (:mod:`.images`, with a stated preprocessing), checked.

Layouts
-------
``DATA.npz``
    One array per model input, named after it. Axis 0 counts samples, each of the input's shape without
    its batch axis: for an input of shape ``(B, C, H, W)`` an array ``(N, C, H, W)`` holds N samples.
    An array of rank one more, ``(K, B, C, H, W)``, holds K whole batches.
``DATA/`` (a directory of ``.npy`` files)
    For a model with several inputs, files are named ``<input name>_<index>.npy``; the files of each input
    are taken in index order and every input must have the same indices. For a single-input model any
    ``*.npy`` file is taken, in natural name order (``x_2.npy`` before ``x_10.npy``). Each file holds
    one sample (the shape without the batch axis), or samples/batches as in an ``.npz`` array.
``DATA/`` (a directory of images: JPEG, PNG, ...)
    For a single-input model: one image is one sample, made by the ``preprocess`` given (:mod:`.images`).

The samples of each input, in order, are cut into batches of the model's batch size (axis 0 of its
shape); the sample count must be a multiple of it. Arrays must have the model's dtype, except that
float64 data for a float32 input is accepted and cast to float32 (numpy's default float is float64).
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import spelled
from ..tensors import TensorInfo, numpy_file_kind
from .images import PRESETS, Preprocess, image_files, load_images, preprocess_of
from .table import CalibrationError

_INDEXED = re.compile(r"^(?P<name>.+)_(?P<index>\d+)$")


class CalibrationDataError(CalibrationError):
    """Calibration data that cannot be read or does not fit the model's inputs."""


def _describe(inputs: Sequence[TensorInfo]) -> str:
    return ", ".join(_desc(i) for i in inputs)


def _checked_dtype(array: np.ndarray, info: TensorInfo, where: str) -> np.ndarray:
    want = np.dtype(info.dtype)
    if array.dtype == want:
        return array
    if array.dtype == np.float64 and want == np.float32:
        return array.astype(np.float32)
    raise CalibrationDataError(f"{where}: input {info.name!r} expects dtype {info.dtype}, got {array.dtype}"
                               + (" (only float64 -> float32 is converted)" if want.kind == "f" else ""))


def _samples(array: np.ndarray, info: TensorInfo, where: str) -> np.ndarray:
    """``array`` as a stack of samples (axis 0), each of the input's shape without its batch axis."""
    shape = tuple(info.shape)
    sample = shape[1:] if shape else ()
    if array.ndim == len(sample) and array.shape == sample:
        stacked = array[None]
    elif array.ndim == len(sample) + 1 and array.shape[1:] == sample:
        stacked = array
    elif shape and array.ndim == len(shape) + 1 and array.shape[1:] == shape:
        stacked = array.reshape((-1,) + sample)
    else:
        raise CalibrationDataError(
            f"{where}: input {_desc(info)} cannot take an array of shape {array.shape}; expected one sample "
            f"{_dims(sample)}, N samples {_dims(('N',) + sample)} or K batches {_dims(('K',) + shape)}")
    return _checked_dtype(stacked, info, where)


def _desc(info: TensorInfo) -> str:
    return f"{info.name!r} {tuple(info.shape)} {info.dtype}"


def _dims(dims: Sequence) -> str:
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def _reason(e: Exception) -> str:
    """One line for an exception numpy's readers raised on a damaged file.

    They raise whatever their parsers do: OSError, ValueError, EOFError (an empty file), zipfile.BadZipFile
    (bad CRC), SyntaxError or tokenize.TokenError (a garbled header), MemoryError (a header claiming a huge
    shape), ... so the callers catch Exception: every one of them means "this file cannot be read".
    """
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def _load_npy(path: Path) -> np.ndarray:
    if numpy_file_kind(path) is None:
        raise CalibrationDataError(f"{path}: not an .npy file (numpy.save writes one)")
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any reader error: see _reason
        raise CalibrationDataError(f"{path}: not a readable .npy array ({_reason(e)})") from None
    if not isinstance(array, np.ndarray):
        array.close()
        raise CalibrationDataError(f"{path}: holds an .npz archive, not a single .npy array")
    return array


def _from_npz(path: Path, inputs: Sequence[TensorInfo]) -> dict[str, list[np.ndarray]]:
    if numpy_file_kind(path) is None:
        raise CalibrationDataError(f"{path}: not an .npz file (numpy.savez writes one: an array per input name)")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any reader error: see _reason
        raise CalibrationDataError(f"{path}: not a readable .npz archive ({_reason(e)})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise CalibrationDataError(f"{path}: holds a single array, not an .npz archive of named arrays "
                                   f"(save with numpy.savez(path, {inputs[0].name}=...))")
    with archive:
        names = list(archive.files)
        _check_names(names, inputs, path)
        arrays = {}
        for i in inputs:
            try:
                arrays[i.name] = archive[i.name]
            except Exception as e:  # noqa: BLE001 - any reader error: see _reason
                raise CalibrationDataError(f"{path}: cannot read array {i.name!r} ({_reason(e)})") from None
        return {i.name: [_samples(arrays[i.name], i, str(path))] for i in inputs}


def _check_names(names: Sequence[str], inputs: Sequence[TensorInfo], where) -> None:
    want = [i.name for i in inputs]
    unknown = sorted(set(names) - set(want))
    missing = [n for n in want if n not in names]
    if unknown or missing:
        what = ([f"unknown input name(s) {unknown}"] if unknown else []) + \
               ([f"no data for input(s) {missing}"] if missing else [])
        raise CalibrationDataError(f"{where}: {'; '.join(what)}; the model's inputs are {_describe(inputs)}")


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _directory_files(path: Path, inputs: Sequence[TensorInfo]) -> dict[str, list[Path]]:
    """Input name -> its .npy files in sample order (see the module docstring for the naming)."""
    files = sorted(path.glob("*.npy"), key=_natural_key)
    if not files:
        raise CalibrationDataError(f"{path}: empty calibration set (no .npy files in the directory)")
    if len(inputs) == 1:
        return {inputs[0].name: files}
    indexed: dict[str, dict[int, Path]] = {}
    for f in files:
        match = _INDEXED.match(f.stem)
        if not match:
            raise CalibrationDataError(f"{f}: for a model with several inputs, files must be named "
                                       f"<input name>_<index>.npy; the model's inputs are {_describe(inputs)}")
        per_input = indexed.setdefault(match["name"], {})
        index = int(match["index"])
        if index in per_input:
            raise CalibrationDataError(f"{f}: index {index} of input {match['name']!r} is also given by "
                                       f"{per_input[index].name}")
        per_input[index] = f
    _check_names(list(indexed), inputs, path)
    first = inputs[0].name
    for info in inputs[1:]:
        if set(indexed[info.name]) != set(indexed[first]):
            only = sorted(set(indexed[info.name]) ^ set(indexed[first]))
            raise CalibrationDataError(f"{path}: inputs {first!r} and {info.name!r} have files for different "
                                       f"indices (not in both: {only[:10]})")
    return {name: [per[i] for i in sorted(per)] for name, per in indexed.items()}


def _from_directory(path: Path, inputs: Sequence[TensorInfo]) -> dict[str, list[np.ndarray]]:
    files = _directory_files(path, inputs)
    return {i.name: [_samples(_load_npy(f), i, str(f)) for f in files[i.name]] for i in inputs}


def _from_images(path: Path, inputs: Sequence[TensorInfo], preprocess) -> dict[str, list[np.ndarray]]:
    if any(path.glob("*.npy")):
        raise CalibrationDataError(f"{path}: holds both .npy files and images; keep one kind in a folder")
    if len(inputs) != 1:
        raise CalibrationDataError(f"{path}: images calibrate a model with one input; this one has "
                                   f"{_describe(inputs)} (give an .npz or .npy files per input)")
    if preprocess is None:
        raise CalibrationDataError(f"{path}: images need their preprocessing, as the model was trained: " +
                                   spelled("preprocess=", "--preprocess ") + "|".join(PRESETS) + " or " +
                                   spelled("a Preprocess(mean=..., std=...)", "--mean and --std"))
    preprocess = preprocess if isinstance(preprocess, Preprocess) else preprocess_of(preprocess)
    return {inputs[0].name: [load_images(path, inputs[0], preprocess)]}


def check_batch(batch, inputs: Sequence[TensorInfo], where: str = "calibration batch") -> dict[str, np.ndarray]:
    """One in-memory batch checked like file data: the same names, shapes and dtypes (float64 -> float32).

    Raises
    ------
    CalibrationDataError
        Naming ``where`` and the input that does not fit.
    """
    if not hasattr(batch, "keys"):
        raise CalibrationDataError(f"{where}: a batch must be a dict of input name -> numpy array, got "
                                   f"{type(batch).__name__}")
    _check_names(list(batch.keys()), inputs, where)
    out = {}
    for info in inputs:
        array = np.asarray(batch[info.name])
        if array.shape != tuple(info.shape):
            raise CalibrationDataError(f"{where}: input {info.name!r} expects shape {tuple(info.shape)}, "
                                       f"got {array.shape}")
        out[info.name] = np.ascontiguousarray(_checked_dtype(array, info, where))
    return out


def _batch_size(info: TensorInfo) -> int:
    return int(info.shape[0]) if info.shape else 1


def load_calibration_data(path: str | os.PathLike, inputs: Sequence[TensorInfo],
                          preprocess=None) -> list[dict[str, np.ndarray]]:
    """Read calibration batches for a model whose inputs are ``inputs``.

    Parameters
    ----------
    path : str or os.PathLike
        An ``.npz`` file, a directory of ``.npy`` files or of images (layouts in the module docstring).
    inputs : list of TensorInfo
        The model's inputs (static shapes; axis 0 is the batch).
    preprocess : str, images.Preprocess or None
        For a directory of images: how an image becomes a sample (a preset name or a Preprocess).

    Returns
    -------
    list of dict
        One dict per batch: input name -> array of exactly the input's shape and dtype.

    Raises
    ------
    CalibrationDataError
        Naming the file and the input: a missing path, unknown or missing input names, a shape or dtype
        that does not fit, sample counts that differ between inputs or are not a multiple of the batch
        size, an empty set.
    """
    path = Path(path)
    inputs = list(inputs)
    if not inputs:
        raise CalibrationDataError(f"{path}: the model has no inputs to calibrate with")
    if not path.exists():
        raise CalibrationDataError(f"calibration data not found: {path}")
    if path.is_dir() and image_files(path):
        chunks = _from_images(path, inputs, preprocess)
    elif path.is_dir():
        chunks = _from_directory(path, inputs)
    elif path.suffix == ".npz" or zipfile.is_zipfile(path):
        chunks = _from_npz(path, inputs)
    else:
        raise CalibrationDataError(f"{path}: calibration data must be an .npz file or a directory of .npy files")
    samples = {name: np.concatenate(arrays) if len(arrays) > 1 else arrays[0] for name, arrays in chunks.items()}
    return _split_batches(samples, inputs, path)


def _split_batches(samples: dict[str, np.ndarray], inputs: Sequence[TensorInfo],
                   path: Path) -> list[dict[str, np.ndarray]]:
    counts = {}
    for info in inputs:
        total, size = samples[info.name].shape[0], _batch_size(info)
        if total == 0:
            raise CalibrationDataError(f"{path}: empty calibration set (0 samples for input {info.name!r})")
        if total % size:
            raise CalibrationDataError(f"{path}: input {info.name!r} has {total} samples, not a multiple of the "
                                       f"model's batch size {size} (shape {tuple(info.shape)})")
        counts[info.name] = total // size
    if len(set(counts.values())) > 1:
        raise CalibrationDataError(f"{path}: inputs give different numbers of batches {counts}")
    return [{i.name: np.ascontiguousarray(samples[i.name][b * _batch_size(i):(b + 1) * _batch_size(i)]
                                          .reshape(i.shape)) for i in inputs} for b in range(counts[inputs[0].name])]
