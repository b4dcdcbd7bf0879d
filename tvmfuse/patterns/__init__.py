"""The fusion pattern table: data in one place, in priority order.

Priority (earlier wins, as ``FuseOpsByPattern`` wants): per anchor family (depthwise conv2d, conv2d,
dense), the longest epilogue first: residual add + relu, residual add, then each activation, then the
anchor alone. The bias is optional in every entry; residual entries come as two patterns (one per add
operand order) under one name. ``tests/patterns/test_patterns.py`` pins this order.
"""

from __future__ import annotations

import functools

from tvm.relax.transform import FusionPattern

from tvmfuse.schedules.families import ACTIVATIONS, FAMILIES, PATTERN_FAMILIES

from .builders import make_fused_pattern
from .checks import check_fused

PREFIX = "tvmfuse"


def _entries(family: str):
    """(residual, activation) variants of one family, longest first."""
    if FAMILIES[family].residual:
        yield True, "relu"
        yield True, None
    for act in ACTIVATIONS:
        yield False, act
    yield False, None


def entry_name(family: str, residual: bool, activation: str | None) -> str:
    return f"{PREFIX}.{family}" + ("_add" if residual else "") + (f"_{activation}" if activation else "")


def table(rejections: dict | None = None) -> list[FusionPattern]:
    """The ordered pattern table. ``rejections`` (optional) collects why a match was refused."""
    patterns = []
    for family in PATTERN_FAMILIES:
        for residual, act in _entries(family):
            check = functools.partial(check_fused, family=family, rejections=rejections)
            # A residual entry is two patterns under one name, one per add operand order.
            for residual_first in ((False, True) if residual else (False,)):
                pattern, annotations = make_fused_pattern(family, residual, act, residual_first)
                patterns.append(FusionPattern(entry_name(family, residual, act), pattern, annotations, check))
    return patterns


def names() -> list[str]:
    """Pattern names in priority order."""
    return [entry_name(f, r, a) for f in PATTERN_FAMILIES for r, a in _entries(f)]
