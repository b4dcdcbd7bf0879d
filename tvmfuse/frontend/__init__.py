"""ONNX front end: load, validate, fix shapes, constant-fold and import into Relax."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import onnx

from .contrib import rewrite_contrib_ops
from .conv1d import conv1d_as_conv2d
from .einsum import rewrite_einsums
from .fold import fold_constants, fuse_pad_into_conv
from .importer import check_ops, to_relax
from ..tensors import TensorInfo
from .load import fix_input_shapes, graph_inputs, load_model, output_infos
from .normalize import normalize_nodes
from .pin import inline_ifs, pin_inputs
from .integer_kernels import rewrite_integer_kernels
from .integer_ops import rewrite_integer_ops
from .qlinear import rewrite_quantized_ops
from .qlinear_contrib import rewrite_qlinear_contrib_ops
from .rnn import rewrite_recurrent_ops

__all__ = ["ImportedModel", "TensorInfo", "check_ops", "fix_input_shapes", "fold_constants", "fuse_pad_into_conv", "graph_inputs",
           "import_model", "load_model", "output_infos", "prepare"]


@dataclasses.dataclass
class ImportedModel:
    """A model ready for the passes: the Relax module plus what the runtime needs to know."""

    mod: "object"  # tvm.IRModule
    onnx_model: onnx.ModelProto
    source: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    pinned: dict = dataclasses.field(default_factory=dict)  # input name -> {"shape", "dtype", "value"} (--const)


def prepare(model, shapes: Mapping[str, Sequence[int]] | None = None, fused_recurrence: bool = False,
            consts: Mapping[str, object] | None = None, int8_weights: str = ""):
    """Load, pin the inputs named in ``consts`` (:mod:`.pin`), fix shapes, constant-fold, inline the ``If``
    nodes whose condition folded, spell onnxruntime's float and quantized contrib ops (:mod:`.contrib`, :mod:`.qlinear_contrib`), unroll LSTM/GRU/RNN (``fused_recurrence``: one whole-sequence kernel per
    layer where the cell has one, for CPU targets), normalize, write an Einsum that is a matrix product as one
    (:mod:`.einsum`), make 1-D convs 2-D (:mod:`.conv1d`),
    express quantized ops with standard ones (a ``MatMulInteger`` with a constant weight becomes tvmfuse's INT8
    dense kernel on a target whose INT8 kernels take ``int8_weights``, :mod:`.integer_matmul`; other integer ops
    read as float become float ops), fold zero Pads into Convs.

    Returns ``(ModelProto, source, inputs, outputs, pinned)``, without TVM.
    """
    proto, source = load_model(model)
    if not shapes and source.startswith("zoo:"):
        from .. import zoo

        shapes = zoo.default_shapes(source[len("zoo:"):])
    pinned = pin_inputs(proto, consts)
    inputs = fix_input_shapes(proto, shapes)
    proto, _ = fold_constants(proto)
    inline_ifs(proto, fold_constants, source)
    proto, _ = rewrite_contrib_ops(proto)
    proto, _ = rewrite_qlinear_contrib_ops(proto)
    proto, _ = rewrite_recurrent_ops(proto, source, fused_recurrence)
    proto, _ = normalize_nodes(proto, source)
    proto, _ = rewrite_einsums(proto)
    proto, _ = conv1d_as_conv2d(proto)
    proto, _ = rewrite_integer_kernels(proto, int8_weights)
    proto, _ = rewrite_integer_ops(proto)
    proto, _ = rewrite_quantized_ops(proto, source)
    proto, _ = fuse_pad_into_conv(proto)
    return proto, source, inputs, output_infos(proto), pinned


def target_options(backend) -> dict:
    """:func:`import_model`'s keywords for a target's backend: its whole-sequence recurrent kernels and how its
    INT8 kernels take their weights (:mod:`.integer_matmul` packs a quantized model's MatMulInteger weights so)."""
    return {"fused_recurrence": backend.fused_recurrence, "int8_weights": backend.int8_weights}


def import_model(model, shapes: Mapping[str, Sequence[int]] | None = None,
                 fused_recurrence: bool = False, consts: Mapping[str, object] | None = None,
                 int8_weights: str = "") -> ImportedModel:
    """Load ``model`` (path, ModelProto or ``zoo:NAME``) and import it into Relax with static shapes
    (``fused_recurrence``, ``consts``, ``int8_weights``: see :func:`prepare`; :func:`target_options` gives the
    target backend's)."""
    proto, source, inputs, outputs, pinned = prepare(model, shapes, fused_recurrence, consts, int8_weights)
    mod = to_relax(proto, inputs, source)
    return ImportedModel(mod, proto, source, inputs, outputs, pinned)
