"""The x86 rules as MetaSchedule templates.

A kernel to be tuned gets its anchor block annotated ``schedule_rule = "tvmfuse.x86.<family>"``
(:func:`annotate`); MetaSchedule's ``ApplyCustomRule`` then calls the function :func:`register` put under
``s_tir.meta_schedule.cpu.tvmfuse.x86.<family>``, which samples the rule's knobs (split
factors) with ``sample_categorical`` and applies the same rule the default path uses. The analytical default is the
first candidate, so an untuned kernel and a tuned one come from one piece of code.

Nothing is registered at import: TVM's global function table is only touched by :func:`register`.
"""

from __future__ import annotations

import dataclasses

import tvm
from tvm import s_tir, tirx

from ..computes.blocked import PLAIN_CROP
from ..common import annotate_child, block_names, dividing_vector
from . import RULES as X86_RULES
from . import (batch_matmul, conv2d, conv2d_nchwc, conv2d_winograd, dense, depthwise_conv2d, depthwise_nchwc,
               layer_norm, layer_norm_channels, rows, softmax)
from .. import families

PREFIX = "tvmfuse.x86."


def rule_name(family: str) -> str:
    return PREFIX + family


def marks(kernel: str) -> dict:
    """The annotations that mark a row kernel's output stage for its template (its legalization puts them
    there: a row kernel is not lowered by tvmfuse, so :func:`annotate` never sees it); {} without one."""
    return {"schedule_rule": rule_name(kernel)} if kernel in RULES else {}


def annotate(func: tirx.PrimFunc, family: str) -> tirx.PrimFunc | None:
    """Mark ``func``'s anchor block for the family's template; None when the family has no template."""
    module = RULES.get(family)
    if module is None:
        return None
    return annotate_child(func, module.ANCHOR, "schedule_rule", rule_name(family))


def _pick(sch: s_tir.Schedule, candidates: list[int], default: int):
    """A random variable over ``candidates`` (``default`` first: the decision of the first trace).

    The rule uses it directly as a split factor, so a new decision replays into a new schedule; reading
    it back as a Python int would freeze the factor into the trace and make every sample the same.
    """
    ordered = [default] + [c for c in candidates if c != default]
    return sch.sample_categorical(ordered, [1.0 / len(ordered)] * len(ordered), decision=0)


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _extents(sch, block) -> list[int]:
    return [int(sch.get(loop).extent) for loop in sch.get_loops(block)]


def _conv2d_config(sch, block, lanes: int) -> conv2d.Config:
    _, oc, _, ow, ic, kh, kw = _extents(sch, block)
    base = conv2d.config_for(oc, ow, lanes, ic, max(kh, kw), conv2d._packed_block(sch.mod["main"]))
    budget = conv2d._accumulators(lanes) * (1 if base.kind == "oc" else 2)
    vectors = max(1, base.oc_block // lanes) if base.kind == "oc" else 1
    ow_block = _pick(sch, [d for d in _divisors(ow, 28) if d * vectors <= budget], base.ow_block)
    ic_unroll = _pick(sch, [u for u in (1, 2, 4, 8) if ic % u == 0], base.ic_unroll)
    return dataclasses.replace(base, ow_block=ow_block, ic_unroll=ic_unroll)


def _depthwise_config(sch, block, lanes: int) -> depthwise_conv2d.Config:
    _, _, _, ow, _, kernel = _extents(sch, block)
    base = depthwise_conv2d.default_config(ow, lanes, kernel, depthwise_conv2d.stride_of(sch, ow, kernel),
                                           depthwise_conv2d.is_phase_split(sch))
    # Only split factors can be knobs: where the padding is built is a branch, fixed per trace.
    return dataclasses.replace(base, ow_block=_pick(sch, _divisors(ow, 32), base.ow_block))


def _dense_config(sch, block, lanes: int) -> dense.Config:
    """Rows per register tile and K unrolling; the columns are fixed as the rule fixes them
    (:func:`dense.whole_panels` of the packed weight)."""
    m, n, k = _extents(sch, block)
    base = dense.default_config(n, k, lanes, m)
    n_block = dense.whole_panels(base.n_block, dense.packed_block(sch, block))
    vectors = -(-n_block // (dividing_vector(n_block, lanes) or n_block))
    budget = max(1, dense.accumulators(lanes) // vectors)
    m_block = _pick(sch, _divisors(m, budget), base.m_block)
    k_unroll = _pick(sch, [u for u in (1, 2, 4, 8) if k % u == 0], base.k_unroll)
    return dense.Config(n_block, k_unroll, m_block)


def _batch_matmul_config(sch, block, lanes: int) -> dense.Config:
    """Rows per register tile and K unrolling of one batch's product; its columns as the rule fixes them."""
    m, n, k = _extents(sch, block)[-3:]
    base = batch_matmul.default_config(n, k, lanes, m)
    vectors = -(-base.n_block // (dividing_vector(base.n_block, lanes) or base.n_block))
    budget = max(1, dense.accumulators(lanes) // vectors)
    m_block = _pick(sch, _divisors(m, budget), base.m_block)
    k_unroll = _pick(sch, [u for u in (1, 2, 4, 8) if k % u == 0], base.k_unroll)
    return dense.Config(base.n_block, k_unroll, m_block)


def _conv2d_nchwc_config(sch, block, lanes: int) -> conv2d_nchwc.Config:
    _, out_blocks, oh, ow, _, _, _, kw, in_block = _extents(sch, block)
    group = conv2d_nchwc.narrow_group(sch, block)
    if group:  # narrow groups: tiles whose width divides the row (no predicated tail to tensorize)
        base = conv2d_nchwc.narrow_config(ow, group)
        return dataclasses.replace(base, oc_vectors=_pick(sch, _divisors(out_blocks, 4), base.oc_vectors),
                                   ow_block=_pick(sch, _divisors(ow, 16), base.ow_block),
                                   row_block=_pick(sch, sorted(set(_divisors(oh, 4)) | {oh}), base.row_block))
    window = conv2d_nchwc.plain_window(in_block, kw)
    plain = PLAIN_CROP in block_names(sch)  # written NCHW: widths that divide the row (schedule_plain)
    base = conv2d_nchwc.default_config(out_blocks, ow, lanes, window, dividing=plain)
    # Channel vectors and row pixels are sampled independently; a pair past the register file spills and
    # simply measures slow.
    budget = conv2d_nchwc.accumulators(lanes, window)
    oc_vectors = _pick(sch, _divisors(out_blocks, 4), base.oc_vectors)
    widths = _divisors(ow, budget) if plain else list(range(1, min(ow, budget) + 1))  # a tail is predicated
    ow_block = _pick(sch, widths, base.ow_block)
    ic_unroll = _pick(sch, _divisors(in_block, 8), base.ic_unroll)
    # The parallel axis: rows spread one by one, a few at a time, or kept together (channel blocks only).
    row_block = _pick(sch, sorted(set(_divisors(oh, 4)) | {oh}), base.row_block)
    return conv2d_nchwc.Config(oc_vectors, ow_block, ic_unroll, row_block)


def _conv2d_winograd_config(sch, block, lanes: int) -> conv2d_winograd.Config:
    """Knobs of the products stage (the transforms have none); ``block`` is the output transform."""
    product = sch.get_sblock(conv2d_winograd.winograd.PRODUCT)
    out_blocks = _extents(sch, product)[2]
    base = conv2d_winograd.default_config(out_blocks, lanes)
    oc_vectors = _pick(sch, _divisors(out_blocks, 4), base.oc_vectors)
    tile_block = _pick(sch, list(range(1, conv2d_nchwc.accumulators(lanes) + 1)), base.tile_block)
    return conv2d_winograd.Config(oc_vectors, tile_block)


def _depthwise_nchwc_config(sch, block, lanes: int) -> depthwise_nchwc.Config:
    base = depthwise_nchwc.default_config(*depthwise_nchwc.widths(sch))
    ow = _extents(sch, block)[3]
    return dataclasses.replace(base, ow_block=_pick(sch, _divisors(ow, 16), base.ow_block))


def _row_config(sch, block, lanes: int) -> rows.Config:
    """Softmax and LayerNorm (``block``: the output stage): the row step, 1, 2 or 4 vectors (the reductions'
    independent accumulators)."""
    candidates = rows.steps(_extents(sch, block)[-1], lanes)
    return rows.Config(_pick(sch, candidates, candidates[0]) if len(candidates) > 1 else None)


def _channel_norm_config(sch, block, lanes: int) -> layer_norm_channels.Config:
    """LayerNorm over NCHW's channels (``block``: the output stage): the run of pixels per task, among the
    runs of the default's kind (parts of a row, or whole rows: a branch of the rule, fixed per trace)."""
    extents = _extents(sch, block)
    height, width = (extents[2], extents[3]) if len(extents) == 4 else (1, extents[-1])
    base = layer_norm_channels.default_config(height, width, lanes)
    if base is None:
        raise ValueError(f"{rule_name(families.CHANNEL_NORM_KERNEL.name)}: no run of pixels is a vector")
    candidates = layer_norm_channels.runs(height, width, lanes)["rows" if base.rows else "part"]
    factor = _pick(sch, candidates, base.factor) if len(candidates) > 1 else base.factor
    return layer_norm_channels.Config(base.rows, factor)


# rule module -> its template's knobs; every kernel whose x86 rule (in the registry) is one of these has a template
CONFIGS = {conv2d: _conv2d_config, depthwise_conv2d: _depthwise_config, dense: _dense_config,
           batch_matmul: _batch_matmul_config, conv2d_nchwc: _conv2d_nchwc_config,
           conv2d_winograd: _conv2d_winograd_config, depthwise_nchwc: _depthwise_nchwc_config,
           softmax: _row_config, layer_norm: _row_config, layer_norm_channels: _channel_norm_config}
# kernel -> the rule module its template applies
RULES = {kernel: module for kernel, module in X86_RULES.items() if module in CONFIGS}


def template(family: str, vector_lanes: int):
    """The MetaSchedule template function ``(sch, block) -> [sch]`` of one family."""

    def apply(sch: s_tir.Schedule, block) -> list:
        config = CONFIGS[RULES[family]](sch, block, vector_lanes)
        sch.unannotate(block, "schedule_rule")
        if not RULES[family].schedule(sch, vector_lanes, config):
            raise ValueError(f"{rule_name(family)}: the annotated block is not a {family} kernel")
        return [sch]

    return apply


def space_size(mod, vector_bits: int) -> int | None:
    """How many distinct schedules the template can give the kernel of ``mod`` (None: no template applies).

    The knobs are categorical, so the space is the product of their candidate counts; tuning past it only
    re-samples schedules already measured.
    """
    sch = s_tir.Schedule(mod)
    for name in block_names(sch):
        block = sch.get_sblock(name)
        rule = sch.get(block).annotations.get("schedule_rule")
        if rule is not None and str(rule).startswith(PREFIX) and str(rule)[len(PREFIX):] in RULES:
            (out,) = template(str(rule)[len(PREFIX):], vector_bits // 32)(sch, block)
            size = 1
            for inst in out.trace.insts:
                if inst.kind.name == "SampleCategorical":
                    size *= len(inst.attrs[0])
            return size
    return None


def register(vector_bits: int) -> list[str]:
    """Register every family's template for CPU targets with ``vector_bits``-wide vectors; return names."""
    names = []
    for family in RULES:
        name = f"s_tir.meta_schedule.cpu.{rule_name(family)}"
        tvm.register_global_func(name, template(family, vector_bits // 32), override=True)
        names.append(name)
    return names


def space_generator():
    """A design space of our templates only (the default CPU rules would re-tile the annotated kernels)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.space_generator.PostOrderApply(sch_rules=[ms.schedule_rule.ApplyCustomRule()], postprocs=[],
                                             mutator_probs={})
