"""One step of a narrow-group conv on NCHW[b]c: ``b`` output channels in groups of ``g`` (``g < b``), each
reading only its own group's ``g`` input channels of the same pixel.

What every step computes (the description)::

    C[i] += A[i // g * g + k] * B[k, i]      for i < b, k < g
    A: (b,) the pixel's input block   B: (g, b) the packed weight of one tap   C: (b,) accumulators

The implementation loads the pixel's ``b`` channels as one vector and, for each ``k``, shuffles it so that
lane ``i`` holds channel ``i // g * g + k`` (the ``k``-th input of lane ``i``'s group): ``g`` shuffles and ``g``
FMAs per step. A gather (``g`` x ``b`` scalar loads, what TVM's vectorizer makes of that index) or merging
``b / g`` groups into one with zero weights (``b / g`` times the multiply-adds, ``RegroupConv``) is what it
replaces. LLVM picks the shuffle: ``vshufps`` when ``g`` divides a 128-bit lane (``g`` <= 4), a cross-lane
``vpermps`` / ``vpermpd`` otherwise.

ResNeXt's 3x3 convs (Zen 4, 2 threads, kernel alone): 128 channels in groups of 4 at 32x32, 53-76 us against
180-204 us with merged groups; 256 in groups of 8 at 16x16, 68-87 us against 121 us.
"""

from __future__ import annotations

import functools
import re

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ...computes.blocked import NARROW_GROUPS

F32, LOCAL = "float32", "local"  # names, not literals, in TVMScript signatures (linters read those as types)


def intrin_name(group: int, lanes: int) -> str:
    return f"tvmfuse_group_shuffle_{group}x{lanes}"


def _step(group: int, lanes: int):
    """``C + sum_k shuffle_k(A) * B[k]`` as one vector expression (built in Python: the shuffle indices are
    constants of each ``k``)."""

    def value(a_buf, b_buf, c_buf):
        ramp = tirx.Ramp(tirx.const(0, "int32"), 1, lanes)
        pixel = tirx.BufferLoad(a_buf, [ramp])
        acc = tirx.BufferLoad(c_buf, [ramp])
        for k in range(group):
            lanes_of_k = [tirx.const(i // group * group + k, "int32") for i in range(lanes)]
            acc = acc + tirx.Shuffle([pixel], lanes_of_k) * tirx.BufferLoad(b_buf, [tirx.const(k, "int32"), ramp])
        return acc

    return value


@functools.cache
def desc(group: int, lanes: int):
    @T.prim_func(s_tir=True)
    def group_shuffle_desc(
        A: T.Buffer((lanes,), F32, offset_factor=1),
        B: T.Buffer((group, lanes), F32, offset_factor=1),
        C: T.Buffer((lanes,), F32, offset_factor=1, scope=LOCAL),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:lanes], B[0:group, 0:lanes])
            T.writes(C[0:lanes])
            for k in T.serial(0, group):
                for i in T.serial(0, lanes):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + A[vi // group * group + vk] * B[vk, vi]

    return group_shuffle_desc


@functools.cache
def impl(group: int, lanes: int):
    step = _step(group, lanes)

    @T.prim_func(s_tir=True)
    def group_shuffle_impl(
        A: T.Buffer((lanes,), F32, offset_factor=1),
        B: T.Buffer((group, lanes), F32, offset_factor=1),
        C: T.Buffer((lanes,), F32, offset_factor=1, scope=LOCAL),
    ) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:lanes], B[0:group, 0:lanes])
            T.writes(C[0:lanes])
            C[T.ramp(0, 1, lanes)] = step(A, B, C)

    return group_shuffle_impl


def ensure(group: int, lanes: int) -> str:
    """Register the (group, lanes) step unless it is; return its name."""
    if group not in NARROW_GROUPS or lanes % group or group >= lanes:
        raise ValueError(f"a group-shuffle step needs groups of {' or '.join(map(str, NARROW_GROUPS))} channels, "
                         f"fewer than and dividing the {lanes} lanes, got {group}")
    name = intrin_name(group, lanes)
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, desc(group, lanes), impl(group, lanes))
    return name


def register_named(names) -> list[str]:
    """Register the steps among the intrinsic ``names`` (those tuning records tensorize with: decoding a record
    in another process needs its step registered); return them. A name of no step this module can make (a
    damaged record's) is left out: that record then fails to decode and is skipped like any other."""
    registered = []
    for name in sorted(names):
        found = re.fullmatch(r"tvmfuse_group_shuffle_(\d+)x(\d+)", name)
        try:
            registered += [ensure(int(found[1]), int(found[2]))] if found else []
        except ValueError:
            pass
    return registered
