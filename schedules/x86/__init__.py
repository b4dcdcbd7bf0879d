"""The x86 backend (LLVM targets): AVX2 / AVX-512 schedules, VNNI for INT8, MetaSchedule templates.

Each kernel's rule module comes from the family registry (``families.Kernel.rules["x86"]``): a kernel
with a rule gets it; a fused partition whose rule does not fit (or that has none, grouped conv2d) gets
the generic fused schedule (:mod:`.fused`); a kernel of TVM's default path (an op outside every
partition) gets :mod:`.generic`. :class:`Backend` is what the rest of tvmfuse asks.
"""

from __future__ import annotations

import importlib

from tvm import s_tir, tirx

from tvmfuse import host, targets

from .. import families
from ..backend import Backend as _Base
from ..backend import kernel_of
from ..common import block_names, lanes
from . import concat, conv2d, dense, fused, generic, int8_table

NAME = "x86"
# kernel name (``tvmfuse.family``) -> its rule module, read from the registry.
RULES = {name: importlib.import_module(f"{__name__}.{k.rules[NAME]}")
         for name, k in families.KERNELS.items() if NAME in k.rules}


def weight_block(fn, vector_bits: int) -> int | None:
    """oc_block to pre-pack a partition's conv2d weight with, or a dense's column panel (None: keep as is)."""
    from ..computes.partition import anchor_call

    call = anchor_call(fn)
    family = families.family_of(call) if call is not None else None
    if family is families.DENSE:
        (m, k), n = (int(d) for d in call.args[0].ty.shape), int(call.ty.shape[-1])
        return dense.default_config(n, k, lanes(vector_bits), m).n_block
    if family is not families.CONV2D:
        return None
    out_channels, out_width = int(call.ty.shape[1]), int(call.ty.shape[3])
    weight = [int(d) for d in call.args[1].ty.shape]
    in_channels, kernel = weight[1], max(weight[2:])
    return conv2d.weight_block(out_channels, out_width, lanes(vector_bits), in_channels, kernel)


def _unmarked(func: tirx.PrimFunc) -> s_tir.Schedule:
    """A schedule of ``func`` with the blocks' ``schedule_rule`` marks removed (they only mean something to
    MetaSchedule); the removal is part of its trace."""
    sch = s_tir.Schedule(func)
    for name in block_names(sch):
        block = sch.get_sblock(name)
        if "schedule_rule" in sch.get(block).annotations:
            sch.unannotate(block, "schedule_rule")
    return sch


def _rule(sch: s_tir.Schedule, kernel: str, vector_bits: int, vnni: bool) -> bool:
    module = RULES.get(kernel)
    if module is None:
        return False
    if families.KERNELS[kernel].int8:
        return module.schedule(sch, vector_bits, vnni)
    return module.schedule(sch, lanes(vector_bits))


def _generic_fallback(kernel: str) -> bool:
    """Whether a kernel its rule does not fit gets the generic schedule: a row kernel (a softmax over another
    axis) or a fixed one (codes in NCHW); a partition's gets :mod:`.fused`."""
    return kernel in families.ROW_KERNELS or kernel in families.FIXED_KERNELS


def _ruled(func: tirx.PrimFunc, kernel: str, vector_bits: int, vnni: bool) -> s_tir.Schedule | None:
    """A fresh schedule of ``func`` with the kernel's rule applied; None when the rule does not fit."""
    sch = _unmarked(func)
    try:
        return sch if _rule(sch, kernel, vector_bits, vnni) else None
    except s_tir.ScheduleError:  # a row rule that fails part-way (the others check before they change)
        if _generic_fallback(kernel):
            return None
        raise


def scheduled(func: tirx.PrimFunc, kernel: str | None, vector_bits: int, vnni: bool = False, vbmi: bool = False):
    """The schedule compile gives ``func`` (its trace replays it), or None when it stays as lowered.

    ``kernel`` is the ``tvmfuse.family`` attribute (None: a kernel of TVM's default path). A kernel marked
    for a MetaSchedule template gets the template's default: the mark is dropped first. ``vbmi``: an INT8
    kernel's table lookups may use AVX512-VBMI (:mod:`.int8_table`).
    """
    if kernel is None:
        return concat.scheduled(func, lanes(vector_bits)) or generic.scheduled(func, lanes(vector_bits))
    sch = _ruled(func, kernel, vector_bits, vnni)
    if sch is not None:
        return int8_table.finish(sch, vbmi, lambda: _ruled(func, kernel, vector_bits, vnni),
                                 lambda: _ruled(int8_table.inline(func), kernel, vector_bits, vnni))
    if _generic_fallback(kernel):
        return generic.scheduled(_unmarked(func).mod["main"], lanes(vector_bits))
    sch = _unmarked(func)  # a fresh one: a rule that does not fit leaves nothing behind
    return sch if fused.schedule(sch, kernel) else None


def schedule(func: tirx.PrimFunc, kernel: str | None, vector_bits: int, vnni: bool = False,
             vbmi: bool = False) -> tirx.PrimFunc:
    """The best schedule tvmfuse has for ``func`` (unscheduled when none fits); see :func:`scheduled`."""
    sch = scheduled(func, kernel, vector_bits, vnni, vbmi)
    return sch.mod["main"] if sch is not None else func


class Backend(_Base):
    """x86 for one LLVM target: vector width and VNNI from the target's CPU features."""

    name = NAME
    device = "cpu"
    int8_kernels = True
    int8_blocked = True
    applies_tuning_logs = True
    online_tuning = True
    fused_recurrence = True
    tensor_intrin = ("x86",)
    channel_layer_norm = True  # schedules/x86/layer_norm_channels.py

    def __init__(self, spec):
        super().__init__(spec)
        self.vector_bits = spec.vector_bits()
        features = spec.features()
        # AVX-VNNI: vpdpbusd on ymm for conv2d and dense; the depthwise taps as int16 pairs (the zmm VNNI
        # depthwise step transposes 64 bytes with vpermb)
        self.vnni = "avx512vnni" in features or "avxvnni" in features
        self.vbmi = "avx512vbmi" in features
        # AMX: conv2d on tiles (.int8_amx); depthwise and dense keep VNNI's steps (a dense row of batch 1
        # would fill one tile row of 16)
        self.int8_weights = ("amx" if {"amx-int8", "avx512vnni"} <= features
                             else "vnni" if "avx512vnni" in features else "avxvnni" if self.vnni
                             else "pairs" if self.vector_bits >= 256 else "")

    def int8_caution(self, weight_bits: int = 7) -> str:
        if self.vnni:
            return ""
        compare = (f"tvmfuse compare MODEL --targets {self.spec.name},{self.spec.name}:int8 before shipping the INT8 "
                   "library")
        if weight_bits == 8:
            # The int16-pair step: 64 products in 10 vector uops against an FMA's 8 in one. AVX2 code on a Zen 4,
            # INT8 / FP32 time: mobilenet_v2 1.04x, efficientnet_lite0 1.08x, resnet18 0.87x, resnet50 0.94x.
            return (f"target {self.spec.name} has no VNNI: with 8-bit weights tvmfuse's INT8 kernels run about as "
                    f"fast as its FP32 ones on such CPUs (7-bit weights, the default there, 1.2-1.6x faster); time "
                    f"both with {compare}")
        # Without VNNI the conv and dense kernels add u8 x s8 product pairs in int16 (vpmaddubsw), exact only
        # for 7-bit weights, which the quantizer then writes. AVX2 code on a Zen 4, INT8 / FP32 time:
        # mobilenet_v2 0.76x, efficientnet_lite0 0.84x, resnet18 0.61x, resnet50 0.62x.
        return (f"target {self.spec.name} has no VNNI: conv and dense weights are quantized to 7 bits ([-64, 64], "
                "what onnxruntime's reduce_range does for such CPUs), which keeps its INT8 kernels exact and about "
                f"1.2-1.6x faster than FP32 at some cost in accuracy (weight_bits=8 keeps 8); check both with {compare}")

    def why_not_runnable(self) -> str:
        missing = targets.missing_host_features(self.spec)
        return f"this CPU lacks {', '.join(missing)}" if missing else ""

    def build_warning(self) -> str:
        missing = targets.missing_host_features(self.spec)
        if not missing:
            return ""
        return (f"target {self.spec.name} uses CPU features this machine lacks ({', '.join(missing)}): the library "
                f"will not run here (target {targets.DEFAULT} builds for this machine)")

    def build_info(self, graph: bool = False) -> dict:
        """``denormals``: ``"flushed"``, every kernel runs with MXCSR's FTZ and DAZ bits set (:mod:`.denormals`)."""
        return {"denormals": "flushed"}

    def device_label(self) -> str:
        return f"cpu: {host.cpu_name()}"

    def vector_lanes(self) -> int:
        return lanes(self.vector_bits)

    def weight_block(self, fn) -> int | None:
        return weight_block(fn, self.vector_bits)

    def annotate(self, func, kernel: str):
        from . import templates

        return templates.annotate(func, kernel) or func

    def schedule(self, func):
        return schedule(func, kernel_of(func), self.vector_bits, self.vnni, self.vbmi)

    def default_trace(self, mod):
        sch = scheduled(mod["main"], kernel_of(mod["main"]), self.vector_bits, self.vnni, self.vbmi)
        return sch.trace if sch is not None else super().default_trace(mod)

    def legalize_passes(self, target) -> list:
        """TVM's generic CPU legalization, with Sigmoid, Erf, Tanh, GELU (both forms) and ``x ** 2`` computed as
        partition epilogues compute them (:mod:`..activations`: vectorizable polynomials where TVM's rules call
        libm's scalar ``expf`` / ``erff`` / ``tanhf`` / ``powf`` per element; ConvNeXt-T's GELUs outside its
        dense kernels took 4.4 ns per element with ``erff``, 0.57 ms for a 1024 x 128 map), Softmax by
        ``softmax.softmax`` (``fast_exp``, at most 4.1e-6 relative error over [-87, 88]; scheduled a row at a
        time by :mod:`.softmax`: TVM's took 0.5 GFLOP/s on PP-OCRv5 rec's 40 x 18,385 head, 2.8 ms) and
        LayerNorm over the last axis by :func:`..layer_norm.layer_norm` (a row at a time, :mod:`.layer_norm`):
        the row families of the registry (``families.ROW_FAMILIES``), their output stages marked for their
        MetaSchedule templates. A bilinear resize of plain NCHW runs in two passes (:mod:`..resize`: TVM's
        gathers four pixels per output)."""
        import functools

        from tvm import relax, topi
        from tvm.relax.backend.cpu_generic import pipeline as generic

        from ..computes import activations, resize
        from . import templates

        def unary(fn, name):
            return lambda bb, call: bb.call_te(fn, call.args[0], primfunc_name_hint=name)

        passes = generic.legalize_passes(target)
        assert isinstance(passes[0], type(relax.transform.LegalizeOps())), passes[0]
        custom = {"relax.sigmoid": lambda bb, call: bb.call_te(activations.fast_sigmoid, call.args[0]),
                  "relax.erf": lambda bb, call: bb.call_te(topi.fast_erf, call.args[0]),
                  "relax.tanh": unary(topi.fast_tanh, "tanh"),
                  "relax.nn.gelu": unary(activations.gelu, "gelu"),
                  "relax.nn.gelu_tanh": unary(activations.gelu_tanh, "gelu_tanh"),
                  "relax.power": activations.legalize_power,
                  "relax.image.resize2d": resize.legalize_resize2d}
        for row in families.ROW_FAMILIES.values():  # marked for their templates
            custom[row.op] = functools.partial(families.resolve(row.legalize),
                                               annotations={k.name: templates.marks(k.name) for k in row.kernels})
        return generic.library_dispatch_passes(target) + [
            relax.transform.LegalizeOps(customize_legalize_map=custom)] + passes[1:]

    @staticmethod
    def kernel_passes() -> list:
        """The steps of padded convs that read only padding are skipped (:mod:`..padding_taps`): DeepLab's
        dilated ASPP convs ran 2.2x faster (4.0 -> 1.8 ms on Zen 4). Kernels on AMX tiles ask Linux for the
        tile state first (:func:`.int8_amx.with_tile_state`)."""
        from ..padding_taps import SkipPaddingTaps
        from .int8_amx import GrantTileState
        from .intrin.table_vbmi import VectorTableLookups

        return [SkipPaddingTaps(), VectorTableLookups(), GrantTileState()]

    @staticmethod
    def tir_pipeline() -> str:
        """TVM's default with the register tiles on the stack, not in the runtime's workspace
        (:mod:`.stack_tiles`), and denormals flushed while a kernel runs (:mod:`.denormals`: on a Sapphire
        Rapids they made PaddleOCR's detectors 2.4-2.8x slower)."""
        from . import stack_tiles

        return stack_tiles.register()

    def relax_pipeline(self, target, scheduling: list):
        """TVM's generic CPU pipeline (legalize, fuse elementwise ops into producers, lower to VM code) with
        ``scheduling`` (its :meth:`kernel_passes` included) inserted after fusion."""
        import tvm
        from tvm.relax.backend.cpu_generic import pipeline as cpu

        @tvm.transform.module_pass(opt_level=0, name="tvmfuse.RelaxPipeline")
        def _pipeline(mod, _ctx):
            with target:
                passes = (self.legalize_passes(target) + scheduling + cpu.dataflow_lower_passes(target)
                          + cpu.finalize_passes(target))
                return tvm.transform.Sequential(passes)(mod)

        return _pipeline

    def register_record_intrinsics(self, names) -> list[str]:
        """The narrow-group shuffle steps (:mod:`.intrin.group_shuffle`) among them."""
        from .intrin import group_shuffle

        return group_shuffle.register_named(names)

    def register_templates(self) -> list[str]:
        from . import templates

        return templates.register(self.vector_bits)

    def space_size(self, mod) -> int | None:
        from . import templates

        return templates.space_size(mod, self.vector_bits)

    def space_generator(self):
        from . import templates

        return templates.space_generator()
