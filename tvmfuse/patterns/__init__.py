"""The fusion pattern table: data in one place, in priority order.

Priority (earlier wins, as ``FuseOpsByPattern`` wants): per anchor family (depthwise conv2d, conv2d,
dense, batched matmul), the longest epilogue first: residual add + relu, residual add, then each activation
the family takes (followed by a constant scale and shift, then alone), then the anchor alone. The bias is
optional in every entry; residual entries come as two patterns (one per add operand order) under one name.
``tests/patterns/test_patterns.py`` pins this order.
"""

from __future__ import annotations

import functools

from tvm.relax.transform import FusionPattern

from tvmfuse.schedules.families import ACTIVATIONS, FAMILIES, PATTERN_FAMILIES

from .builders import AFFINE, make_fused_pattern
from .checks import check_fused

PREFIX = "tvmfuse"
# Activations whose INT8 epilogue also applies a scalar scale and shift after them (``int8_epilogue.HardSwish``'s
# scale and offset): PP-LCNetV3's hardswish + learnable affine block, whose affine otherwise ran as a table of
# output codes after the kernel, a byte load per output on CPUs without AVX512-VBMI.
INT8_AFFINE = ("hardswish",)


def _int8_activations() -> set:
    """The activations some family's INT8 kernel applies in its epilogue."""
    return {act for f in FAMILIES.values() if f.int8 is not None for act in f.int8.activations}


def _entries(family: str, int8: bool = False):
    """(residual, activation, affine) variants of one family, longest first: an activation followed by a
    constant scale and shift before the activation alone. ``int8``: only activations an INT8 kernel applies,
    followed by a scale and shift only where its epilogue takes one (:data:`INT8_AFFINE`)."""
    if FAMILIES[family].residual:
        yield True, "relu", False
        yield True, None, False
    allowed = _int8_activations() if int8 else ACTIVATIONS
    for act in ACTIVATIONS:
        if act not in allowed or act not in FAMILIES[family].activations:
            continue
        if not int8 or act in INT8_AFFINE:
            yield False, act, True
        yield False, act, False
    yield False, None, False


def entry_name(family: str, residual: bool, activation: str | None, affine: bool = False) -> str:
    return (f"{PREFIX}.{family}" + ("_add" if residual else "") + (f"_{activation}" if activation else "")
            + ("_" + AFFINE if affine else ""))


def table(rejections: dict | None = None, int8: bool = False, dtype: str = "float32") -> list[FusionPattern]:
    """The ordered pattern table. ``rejections`` (optional) collects why a match was refused. ``int8``: the
    table of a model being quantized, without the entries no INT8 kernel computes (an activation no INT8
    epilogue applies, such as SiLU, sigmoid or GELU; a scale and shift after any other activation than those
    of :data:`INT8_AFFINE`, or one that is not a single value): its partitions
    are the units calibration observes and the INT8 kernels replace. Such an activation then follows its
    INT8 conv as an elementwise kernel of its own, which TVM fuses with the quantize of its INT8 readers, so
    the conv is INT8 instead of the whole partition staying FP32 (YOLOv8n: 7 -> 64 INT8 partitions).
    ``dtype``: of the tensors the kernels compute on (``float16`` in an fp16 build)."""
    patterns = []
    for family in PATTERN_FAMILIES:
        for residual, act, affine in _entries(family, int8):
            check = functools.partial(check_fused, family=family, rejections=rejections, dtype=dtype,
                                      scalar_affine=int8)
            name = entry_name(family, residual, act, affine)
            # A residual entry is two patterns under one name, one per add operand order.
            for residual_first in ((False, True) if residual else (False,)):
                pattern, annotations = make_fused_pattern(family, residual, act, residual_first, affine)
                patterns.append(FusionPattern(name, pattern, annotations, check))
    return patterns


def names(int8: bool = False) -> list[str]:
    """Pattern names in priority order (``int8``: see :func:`table`)."""
    return [entry_name(f, *entry) for f in PATTERN_FAMILIES for entry in _entries(f, int8)]
