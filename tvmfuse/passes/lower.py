"""LowerPartitions: replace each partition call by one ``call_tir`` to a fused TE kernel.

The kernel is interpreted from the partition body (``tvmfuse.schedules.computes.partition``), carries what schedules
and reports need (``tvmfuse.partition``, ``tvmfuse.family``, ``tvmfuse.layout``, ``tvmfuse.ops``), is marked
opaque so TVM's FuseOps leaves it whole. Scheduling comes later (``passes.schedule``), after tuning logs.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmfuse.schedules.computes.blocked import block_for, blocked_shape, channel_block, to_blocked, to_plain
from tvmfuse.schedules.computes.packing import KernelLayout
from tvmfuse.schedules import families
from tvmfuse.schedules.computes.partition import (anchor_call, blockable, data_param, group_input_block,
                                                  narrow_groups, out_block, param_index, partition_compute,
                                                  plain_output_block, winograd_pays)

from ..targets import TargetSpec
from .blocked_ops import BlockedOps, is_activation
from .channel_scale import with_prologue
from .layout import transform_call
from .partition import is_partition
from .utils import OPAQUE, add_kernel, const_array, users_of


def kernel_name(partition: str) -> str:
    return partition.replace(".", "_")


def make_kernel(fn: relax.Function, spec: TargetSpec | None, schedule: bool = True,
                blocks: dict | None = None) -> tuple[tvm.tirx.PrimFunc, KernelLayout]:
    """The fused PrimFunc for one partition function.

    The target's backend packs the weight, says the vector width, and marks the anchor block for its
    MetaSchedule template (the mark is part of the kernel's identity in tuning logs). With ``schedule`` the
    kernel also gets the backend's default schedule; LowerPartitions passes False and leaves scheduling to
    ``ScheduleKernels``, after tuning logs are applied. ``blocks`` (backends with a blocked layout) makes a
    blocked kernel: parameter index -> block of each activation passed NCHW[b]c (see
    :func:`tvmfuse.schedules.computes.partition.partition_compute`).

    Returns the kernel and how its parameters and output differ from ``fn``'s (packed weights, blocked
    activations).
    """
    backend = spec.backend() if spec is not None else None
    lanes = backend.vector_lanes() if backend is not None else None
    oc_block = backend.weight_block(fn) if backend is not None and blocks is None else None
    pc = partition_compute(fn, oc_block, lanes, blocks)
    func = pc.prim_func()
    if backend is not None:
        func = backend.annotate(func, pc.family)
        if schedule:
            func = backend.schedule(func.with_attr("tvmfuse.family", pc.family))
    name = str(fn.attrs["Composite"])
    anchor = anchor_call(fn)
    layout = pc.layout.describe(families.family_of(anchor).layout if anchor is not None else "NCHW")
    return func.with_attrs({"tvmfuse.partition": name, "tvmfuse.family": pc.family, "tvmfuse.layout": layout,
                            "tvmfuse.ops": ",".join(pc.ops), "op_pattern": OPAQUE}), pc.layout


def _pack_args(args: list, layout: KernelLayout) -> list:
    """Call arguments with the weights the kernel reads packed, packed in numpy at compile time.

    Every anchor pattern requires a constant weight and the partition keeps it a call argument
    (``bind_constants=False``), so the weight is always a constant here.
    """
    args = list(args)
    for index in layout.weights:
        args[index] = relax.const(layout.pack(index, const_array(args[index])))
    return args


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator, BlockedOps):
    """Partition calls -> ``call_tir``; on backends with a blocked layout, blockable partitions (see
    ``partition.blockable``) keep their activations NCHW[b]c between them, with a layout transform only where a
    plain tensor is needed: the NCHW value of every blocked output is bound to the original variable, read by
    whatever is not a blocked kernel, and removed as dead code when nothing is. The blocked forms of ops
    outside partitions come from :class:`.blocked_ops.BlockedOps`."""

    def __init__(self, mod: tvm.IRModule, spec: TargetSpec | None, record: dict | None, blocked: bool, make=None):
        super().__init__(mod)
        self.mod_, self.spec, self.record = mod, spec, record
        self.make = make or (lambda fn, spec, blocks: make_kernel(fn, spec, schedule=False, blocks=blocks))
        self.lanes = spec.backend().vector_lanes() if blocked and spec is not None else None
        self.blocked_of = {}  # plain NCHW var -> the NCHW[b]c var it was made from (or made into)
        self.blocked_parts = {}  # a plain channel split's tuple var -> the same split of the blocked tensor
        self.reblocked = {}  # (plain var, block) -> the var in that block, where blocked_of holds another
        self.scaled = {}  # plain var of a blocked x * [1, C, 1, 1] scale -> (x, scale), both plain
        self.users = {}  # var -> its readers in the function being lowered (see _fold_channel_scale)

    def _partition(self, call):
        if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.GlobalVar):
            fn = self.mod_[call.op]
            if is_partition(fn):
                return fn
        return None

    def _kernel(self, fn, args, blocks=None):
        kernel, layout = self.make(fn, self.spec, blocks)
        gv = add_kernel(self.builder_, kernel, kernel_name(str(fn.attrs["Composite"])))
        if self.record is not None:
            self.record[gv.name_hint] = (fn, layout)
        return gv, _pack_args(args, layout), layout

    def _transform(self, compute, arg, out_shape, key=None, **kernel):
        return transform_call(self.builder_, compute, arg, out_shape, key, **kernel)

    def _as_blocked(self, arg, block: int | None = None):
        """``arg`` (a plain NCHW activation) in NCHW[b]c, transformed once; None when it has no block.
        ``block``: the block a kernel needs (default: the activation's own, :func:`block_for`); a tensor
        already blocked otherwise (a channel concat of 8-channel parts read by a 16-channel kernel) is
        transformed from its plain value again."""
        have = self.blocked_of.get(arg)
        block = block or channel_block(int(arg.ty.shape[1]), self.lanes)
        if have is not None and (block is None or int(have.ty.shape[4]) == block):
            return have
        if block is None or (arg, block) in self.reblocked:
            return self.reblocked.get((arg, block))
        shape = blocked_shape(arg.ty.shape, block)
        var = self.builder_.emit(self._transform(lambda t: to_blocked(t, block), arg, shape, ("to_blocked", block)))
        if have is None:
            self.blocked_of[arg] = var
        else:
            self.reblocked[(arg, block)] = var
        return var

    def _blocked_args(self, fn, args):
        """(args, blocks): activations passed NCHW[b]c where the kernel benefits; a conv2d reads a plain
        input directly (the stem), depthwise inputs and residuals are blocked (transformed if they are not)."""
        anchor = anchor_call(fn)
        data = data_param(fn, anchor)
        # a depthwise or narrow-group conv reads its input blocked like its output (transformed if it is not)
        input_like_out = families.family_of(anchor).input_like_output or \
            narrow_groups(anchor, self.lanes) is not None
        block = out_block(anchor, self.lanes)  # a depthwise input's and a residual's too
        out_shape = [int(d) for d in anchor.ty.shape]
        args, blocks = list(args), {}
        for i, arg in enumerate(args):
            if not is_activation(arg):
                continue
            like_out = (i == data and input_like_out) or [int(d) for d in arg.ty.shape] == out_shape
            blocked = self.blocked_of.get(arg) if i == data and not input_like_out else \
                self._as_blocked(arg, block if like_out else None)
            if i == data and blocked is not None and not input_like_out and \
                    not group_input_block(anchor, int(blocked.ty.shape[4])):
                blocked = None  # a grouped conv whose groups the block would straddle reads the plain input
            if blocked is not None:
                args[i], blocks[i] = blocked, int(blocked.ty.shape[4])
        return args, blocks

    def _plain_output_args(self, fn, args) -> tuple[list, dict] | None:
        """``(args, blocks)`` for a conv that reads its already-blocked input in place and writes NCHW (its output
        channels have no block, :func:`~tvmfuse.schedules.computes.partition.plain_output_block`); None where the NCHW
        kernel reads a plain input (made by a ``to_plain`` when the input was blocked)."""
        anchor = anchor_call(fn)
        data = data_param(fn, anchor) if anchor is not None else None
        if data is None or param_index(fn, anchor.args[0]) != data or not isinstance(anchor.args[1], relax.Var) \
                or plain_output_block(anchor, self.lanes) is None:
            return None
        have = self.blocked_of.get(args[data])
        if have is None:
            return None
        return args[:data] + [have] + args[data + 1:], {data: int(have.ty.shape[4])}

    def _bind(self, var, value):
        """Bind ``value`` to the original variable: its readers, in this block or after it, stay valid."""
        self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(value)))

    def _bind_blocked(self, var, blocked, plain_shape):
        """``var`` computed blocked as ``blocked``: the original variable gets its NCHW value (dead code when
        nothing reads it plain) and blocked readers get ``blocked``."""
        channels = int(plain_shape[1])  # fewer than the blocks hold when the last one is padded
        self._bind(var, self._transform(lambda t: to_plain(t, channels), blocked, plain_shape, ("to_plain", channels)))
        self.blocked_of[var] = blocked

    def _fold_channel_scale(self, fn, args):
        """``(fn, args)`` of a conv2d partition whose data is a squeeze-and-excitation product read by nothing
        else, with the product moved into the kernel (``channel_scale.with_prologue``: ``x`` in the data's
        place, the scale appended, both blocked like the product was; the kernel scales its weight, see
        ``schedules/computes/channel_scale.py``); as given otherwise: Winograd kernels (weights transformed at compile
        time), and weights with more values per input channel than the map has pixels."""
        anchor = anchor_call(fn)
        index = param_index(fn, anchor.args[0])
        if index is None or not families.family_of(anchor).scales_weight or winograd_pays(anchor):
            return fn, args
        product = args[index]
        if product not in self.scaled or len(self.users.get(product, [])) != 1 \
                or len(users_of(fn)[fn.params[index]]) != 1:
            return fn, args  # the product read elsewhere too (outside the partition, or inside: a residual)
        base, scale = self.scaled[product]
        out_channels, _, kh, kw = (int(d) for d in anchor.args[1].ty.shape)
        if out_channels * kh * kw > int(base.ty.shape[2]) * int(base.ty.shape[3]):
            return fn, args  # scaling the weight would multiply more values than scaling the data does
        block = int(self.blocked_of[base].ty.shape[4])
        scale_block = self.blocked_of[scale].ty.shape[4] if scale in self.blocked_of else block_for(
            int(scale.ty.shape[1]), self.lanes)
        if scale_block is None or int(scale_block) != block:
            return fn, args
        return with_prologue(fn, index), args[:index] + [base] + args[index + 1:] + [scale]

    def visit_var_binding_(self, binding):
        if self.lanes is not None and self.blocked_op(binding):
            return None
        fn = self._partition(binding.value)
        if fn is None:
            return super().visit_var_binding_(binding)
        args = [self.visit_expr(a) for a in binding.value.args]
        if self.lanes is None or not blockable(fn, self.lanes):
            plain_out = self._plain_output_args(fn, args) if self.lanes is not None else None
            args, blocks = plain_out or (args, None)
            gv, args, _ = self._kernel(fn, args, blocks)
            return self._bind(binding.var, relax.call_tir(gv, args, fn.ret_ty))
        fn, args = self._fold_channel_scale(fn, args)
        args, blocks = self._blocked_args(fn, args)
        gv, args, layout = self._kernel(fn, args, blocks)
        shape = blocked_shape(fn.ret_ty.shape, layout.out_block)
        out = self.builder_.emit(relax.call_tir(gv, args, relax.TensorType(shape, fn.ret_ty.dtype)))
        self._bind_blocked(binding.var, out, fn.ret_ty.shape)


def LowerPartitions(spec: TargetSpec | None = None, record: dict | None = None,  # noqa: N802
                    blocked: bool = True, make=None) -> tvm.transform.Pass:
    """Lower every partition call to ``call_tir``; the partition functions are then dropped.

    ``record`` (optional dict) receives kernel name -> (the partition function it came from, its
    :class:`~tvmfuse.schedules.computes.packing.KernelLayout`). ``blocked`` (backends with a blocked layout):
    chain blockable partitions in NCHW[b]c; False keeps every kernel NCHW. ``make`` (optional): ``(fn, spec,
    blocks) -> (kernel, layout)`` in place of :func:`make_kernel` (unscheduled), e.g. through the kernel cache
    (:class:`tvmfuse.cache.lowered.LoweredKernels`).
    """

    @tvm.transform.module_pass(opt_level=0, name="LowerPartitions")
    def _lower(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        lower = _Lower(mod, spec, record, blocked, make)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and not is_partition(func):
                lower.users = users_of(func)
                lower.builder_.update_func(gv, lower.visit_expr(func))
        return relax.transform.DeadCodeElimination()(lower.builder_.get())

    return _lower
