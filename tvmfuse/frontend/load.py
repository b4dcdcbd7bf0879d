"""Load an ONNX model from a path, a ModelProto or ``zoo:NAME``, and fix its input shapes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelLoadError, ShapeError, spelled
from ..tensors import TensorInfo
from . import skeleton


# Exporters often declare an output without a shape; the checker rejects that, shape inference does not care.
_BENIGN_CHECKER_ERROR = "Field 'shape' of 'type' is required but missing"


def load_model(model) -> tuple[onnx.ModelProto, str]:
    """Return ``(ModelProto, description)`` for a path, a ModelProto or ``"zoo:NAME"``.

    Raises
    ------
    ModelLoadError
        When the file is missing, cannot be parsed as ONNX, or holds no graph.
    """
    if isinstance(model, onnx.ModelProto):
        proto, source = onnx.ModelProto(), "<ModelProto>"
        proto.CopyFrom(model)
    elif isinstance(model, str) and model.startswith("zoo:"):
        from .. import zoo

        try:
            proto = zoo.get(model[len("zoo:"):])
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        source = model
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        source = str(path)
        if not path.exists():
            raise ModelLoadError(f"model file not found: {path}")
        if path.is_dir():
            raise ModelLoadError(f"model path is a directory, not an ONNX file: {path}")
        try:
            proto = onnx.load(str(path))
        except Exception:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeWarning, ...
            raise ModelLoadError(_unreadable(path)) from None
    else:
        raise ModelLoadError(f"model must be a path, an onnx.ModelProto or 'zoo:NAME', got {type(model).__name__}")
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.graph.node:
        if isinstance(model, (str, os.PathLike)) and not str(model).startswith("zoo:"):
            if Path(model).stat().st_size == 0:
                raise ModelLoadError(f"{source} is empty (0 bytes)")
            if proto.ir_version <= 0:
                raise ModelLoadError(_unreadable(Path(model)))
        raise ModelLoadError(f"{source} is not an ONNX model: it holds no graph")
    try:
        skeleton.check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0]
        if _BENIGN_CHECKER_ERROR not in first:
            raise ModelLoadError(f"{source} is not a valid ONNX model: {first}") from None
    except UnicodeDecodeError:  # the checker's message quotes a name or string that is not UTF-8 (corrupt file)
        raise ModelLoadError(f"{source} is not a valid ONNX model: it holds a name or string that is not "
                             "valid UTF-8") from None
    _check_initializers(proto, source)
    return proto, source


def _unreadable(path: Path) -> str:
    """Why ``path`` did not parse: a file that starts as an ONNX model does (field 1, the IR version, as a varint:
    byte 0x08) was cut short or damaged; anything else is some other kind of file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(64)
    if head[:1] == b"\x08":
        return f"{path}: truncated or corrupt ONNX file ({size:,} bytes)"
    text = head.decode("utf-8", errors="replace")
    kind = "a text file" if all(c.isprintable() or c in "\r\n\t" for c in text) else "binary data"
    return f"{path} is not an ONNX file ({kind}, {size:,} bytes)"


def _check_initializers(proto: onnx.ModelProto, source: str) -> None:
    """Every initializer must decode to an array of its declared type and shape (the checker does not look).

    A corrupt file can carry a data type number ONNX does not know, or dims that do not match the data;
    folding and the importer would then fail deep inside with a bare KeyError / ValueError.
    """
    for t in proto.graph.initializer:
        try:
            numpy_helper.to_array(t)
        except Exception as e:  # noqa: BLE001 - KeyError (unknown data type), ValueError (size), TypeError, ...
            raise ModelLoadError(f"{source} is not a valid ONNX model: initializer {t.name!r} cannot be read "
                                 f"({type(e).__name__}: {_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else ""


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs of the graph (initializers that are also listed as inputs are not inputs)."""
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def _np_dtype(value: onnx.ValueInfoProto) -> str:
    elem_type = value.type.tensor_type.elem_type
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):  # 0 (UNDEFINED) or a number ONNX does not know: a corrupt file
        raise ModelLoadError(f"graph input or output {value.name!r} has element type {elem_type}, which is not "
                             "a tensor type ONNX defines") from None


def _dims(value: onnx.ValueInfoProto) -> list[int | str | None]:
    """Static dims as ints; a dynamic one as its name, or None when unnamed.

    Exporters spell "dynamic" four ways: a ``dim_param`` name (``batch``, ``?``, ``DynamicDimension.0``),
    no value at all, and (Paddle, old converters) ``dim_value`` -1 or 0. A graph input of size 0 would be
    an empty image, which no CNN is compiled for, so 0 and -1 read as dynamic too.
    """
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return [None]
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
            else (d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else None)) for d in t.shape.dim]


def fix_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]] | None) -> list[TensorInfo]:
    """Write static shapes into the graph inputs (in place) and return the inputs' TensorInfo.

    Raises
    ------
    ShapeError
        When an input keeps a dynamic dimension, ``shapes`` names an unknown input, or a given shape
        contradicts a static dimension of the model.
    """
    shapes = dict(shapes or {})
    inputs = graph_inputs(model)
    names = [v.name for v in inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ShapeError(f"{spelled('shapes=', '--shape')} names unknown input(s) {unknown}; the model's inputs are "
                         f"{names}")
    infos = []
    for value in inputs:
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            raise ShapeError(f"input {value.name!r} is a{'n' if kind and kind[0] in 'aeiou' else ''} "
                             f"{(kind or 'untyped').replace('_type', '')} value; tvmfuse compiles tensor inputs only")
        dims = _dims(value)
        if value.name in shapes:
            given = [int(d) for d in shapes[value.name]]
            if any(d <= 0 for d in given):
                raise ShapeError(f"input {value.name!r}: shape {tuple(given)} must have positive dims")
            if dims != [None] and len(dims) != len(given):
                raise ShapeError(f"input {value.name!r} has rank {len(dims)} but shape {tuple(given)} was given")
            for i, (d, g) in enumerate(zip(dims, given)):
                if isinstance(d, int) and d != g:
                    raise ShapeError(f"input {value.name!r}: dim {i} is fixed to {d} in the model, "
                                     f"but shape {tuple(given)} was given")
            dims = given
        dynamic = [d if d is not None else "?" for d in dims if not isinstance(d, int)]  # names, "-1", "0", "?"
        if dynamic:
            raise ShapeError(f"input {value.name!r} has dynamic dims {dynamic} (shape {_show(dims)}); "
                             f"fix them with {_shape_hint(value.name, dims)}")
        shape_proto = value.type.tensor_type.shape
        shape_proto.ClearField("dim")
        for d in dims:
            shape_proto.dim.add().dim_value = int(d)
        infos.append(TensorInfo(value.name, tuple(int(d) for d in dims), _np_dtype(value)))
    return infos


def _shape_hint(name: str, dims: list) -> str:
    """How to fix ``name``'s dynamic dims, in the words of the interface, from the model's own dims: its fixed
    ones kept, a dynamic batch (the first dim) as 1, every other dynamic one by its name for the user to fill."""
    shown = [str(d) if isinstance(d, int) else "1" if i == 0 else (str(d).upper() if d and str(d) not in ("-1", "0",
             "?") else f"D{i}") for i, d in enumerate(dims)]
    to_fill = [s for i, s in enumerate(shown) if not isinstance(dims[i], int) and i > 0]
    also = f" ({', '.join(to_fill)}: the size{'s' if len(to_fill) > 1 else ''} you will run at)" if to_fill else ""
    if dims == [None]:  # no shape at all: the rank is unknown too
        return spelled(f"shapes={{'{name}': (...)}}", f"--shape {name}:D1,D2,...")
    return spelled(f"shapes={{'{name}': ({', '.join(shown)})}}", f"--shape {name}:{','.join(shown)}") + also


def _show(dims) -> str:
    return "(" + ", ".join(str(d) if d is not None else "?" for d in dims) + ")"


def output_infos(model: onnx.ModelProto) -> list[TensorInfo]:
    """Outputs with the static shapes shape inference finds (run it first); -1 marks an unknown dim."""
    infos = []
    for value in model.graph.output:
        dims = _dims(value)
        shape = tuple(d if isinstance(d, int) else -1 for d in dims) if dims != [None] else ()
        infos.append(TensorInfo(value.name, shape, _np_dtype(value)))
    return infos
