"""ONNX -> Relax: check every op is supported (naming the node when not), then run TVM's importer."""

from __future__ import annotations

import collections
import warnings
from unittest import mock

import onnx

from ..errors import TvmfuseError, UnsupportedOpError
from ..tensors import TensorInfo
from .qlinear import REWRITTEN_OP_TYPES
from . import clip, integer_conv, integer_matmul, rnn_fused
from .rnn import REWRITTEN_OP_TYPES as RECURRENT_OP_TYPES


def supported_op_types() -> frozenset[str]:
    """ONNX op types (default domain) the import path handles: TVM's converters and the ops qlinear rewrites."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return frozenset(_get_convert_map()) | REWRITTEN_OP_TYPES | RECURRENT_OP_TYPES


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def check_ops(model: onnx.ModelProto, source: str) -> None:
    """Raise UnsupportedOpError naming each unsupported op type and its first nodes."""
    supported = supported_op_types()
    bad: dict[str, list[str]] = collections.defaultdict(list)
    for i, node in enumerate(model.graph.node):
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if (node.domain, node.op_type) in _OWN_OPS:
            continue  # written by tvmfuse's own rewrites, converted in to_relax
        if node.domain not in ("", "ai.onnx") or node.op_type not in supported:
            bad[op].append(node.name or f"#{i}")
        elif node.op_type == "BatchNormalization" and _attr(node, "training_mode", 0):
            # TVM would compute the batch statistics' outputs wrongly; an inference compiler must refuse.
            bad["BatchNormalization(training_mode=1)"].append(node.name or f"#{i}")
    if bad:
        parts = [f"{op} (node{'s' if len(nodes) > 1 else ''} {', '.join(repr(n) for n in nodes[:3])}"
                 f"{', ...' if len(nodes) > 3 else ''})" for op, nodes in bad.items()]
        raise UnsupportedOpError(f"{source}: unsupported ONNX op{'s' if len(bad) > 1 else ''}: {'; '.join(parts)}")


# tvmfuse's own nodes, which only exist between prepare and the import: (domain, op type) -> converter factory
_OWN_OPS = {(rnn_fused.DOMAIN, rnn_fused.OP_TYPE): rnn_fused.converter,
            (integer_matmul.DOMAIN, integer_matmul.OP_TYPE): integer_matmul.converter,
            (integer_matmul.DOMAIN, integer_conv.OP_TYPE): integer_conv.converter}


def to_relax(model: onnx.ModelProto, inputs: list[TensorInfo], source: str):
    """Import the (shape-fixed, folded) model into a Relax IRModule. tvmfuse's own nodes (the whole-sequence
    recurrent layers of :mod:`.rnn_fused`, :mod:`.integer_matmul`'s) are converted by converters added to TVM's
    table for the call."""
    from tvm.relax.frontend.onnx import from_onnx, onnx_frontend

    check_ops(model, source)
    # The importer has no hook for extra ops and rebuilds its table per node: it gets one table, with tvmfuse's
    # own nodes' converters where the model has them and Clip's (see .clip).
    own = {op: make() for (domain, op), make in _OWN_OPS.items() if any((n.domain, n.op_type) == (domain, op)
                                                                          for n in model.graph.node)}
    table = {**onnx_frontend._get_convert_map(), "Clip": clip.converter(), **own}  # noqa: SLF001
    extra = mock.patch.object(onnx_frontend, "_get_convert_map", lambda: table)
    # TVM's importer runs onnx.checker on the model again and only warns on what it finds: the model was
    # checked when it was loaded (frontend.load), and the check serializes the whole proto (ResNet-50's import:
    # 0.80 -> 0.65 s on Zen 4), so the importer's call is skipped.
    skip_check = mock.patch.object(onnx.checker, "check_model", lambda *_a, **_k: None)
    try:
        with warnings.catch_warnings(), extra, skip_check:
            # The importer warns about every value_info without a shape; the shapes are fixed by now.
            warnings.simplefilter("ignore", UserWarning)
            return from_onnx(model, shape_dict={i.name: list(i.shape) for i in inputs},
                             dtype_dict={i.name: i.dtype for i in inputs})
    except TvmfuseError:
        raise
    except Exception as e:  # noqa: BLE001 - the importer raises bare errors; name the model and the cause
        msg = str(e).strip().splitlines()
        raise UnsupportedOpError(f"{source}: import failed: {type(e).__name__}: {msg[-1] if msg else ''}") from e
