"""LowerPartitions: replace each partition call by one ``call_tir`` to a fused TE kernel.

The kernel is interpreted from the partition body (``tvmfuse.schedules.compute``), carries what schedules
and reports need (``tvmfuse.partition``, ``tvmfuse.family``, ``tvmfuse.layout``, ``tvmfuse.ops``), is marked
opaque so TVM's FuseOps leaves it whole. Scheduling comes later (``passes.schedule``), after tuning logs.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmfuse.schedules.blocked import (KernelLayout, block_for, blocked_shape, depth_to_space, pool2d, spatial_mean,
                                       to_blocked, to_plain)
from tvmfuse.schedules import families
from tvmfuse.schedules.compute import (anchor_call, blockable, data_param, group_input_block, narrow_groups,
                                       param_index, partition_compute, winograd_pays)

from ..targets import TargetSpec
from .channel_scale import channel_scale, with_prologue
from .conv_transpose import DEPTH_TO_SPACE_AXES
from .layout import POOL_FAMILY, transform_call
from .partition import is_partition
from .utils import OPAQUE, const_array, op_name, users_of


POOLS = {"relax.nn.max_pool2d": "max", "relax.nn.avg_pool2d": "avg"}
# Elementwise ops computed on NCHW[b]c as they are on NCHW (see _Lower._blocked_elementwise).
ELEMENTWISE = {"relax.add", "relax.multiply", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum",
               "relax.sigmoid", "relax.nn.relu", "relax.clip", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
               "relax.nn.gelu_tanh", "relax.erf", "relax.exp", "relax.nn.leakyrelu", "relax.sqrt", "relax.negative",
               "relax.abs"}


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
    :func:`tvmfuse.schedules.compute.partition_compute`).

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
    layout = pc.layout.describe("NC" if pc.family == "dense" else "NCHW")
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


def _is_activation(arg) -> bool:
    return isinstance(arg, relax.Var) and len(getattr(arg.ty, "shape", None) or []) == 4


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator):
    """Partition calls -> ``call_tir``; on backends with a blocked layout, blockable partitions (see ``compute.blockable``) keep their
    activations NCHW[b]c between them, with a layout transform only where a plain tensor is needed: the
    NCHW value of every blocked output is bound to the original variable, read by whatever is not a blocked
    kernel, and removed as dead code when nothing is."""

    def __init__(self, mod: tvm.IRModule, spec: TargetSpec | None, record: dict | None, blocked: bool):
        super().__init__(mod)
        self.mod_, self.spec, self.record = mod, spec, record
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
        kernel, layout = make_kernel(fn, self.spec, schedule=False, blocks=blocks)
        gv = self.builder_.add_func(kernel, kernel_name(str(fn.attrs["Composite"])))
        if self.record is not None:
            self.record[gv.name_hint] = (fn, layout)
        return gv, _pack_args(args, layout), layout

    def _transform(self, compute, arg, out_shape, **kernel):
        return transform_call(self.builder_, compute, arg, out_shape, **kernel)

    def _as_blocked(self, arg, block: int | None = None):
        """``arg`` (a plain NCHW activation) in NCHW[b]c, transformed once; None when it has no block.
        ``block``: the block a kernel needs (default: the activation's own, :func:`block_for`); a tensor
        already blocked otherwise (a channel concat of 8-channel parts read by a 16-channel kernel) is
        transformed from its plain value again."""
        have = self.blocked_of.get(arg)
        block = block or block_for(int(arg.ty.shape[1]), self.lanes)
        if have is not None and (block is None or int(have.ty.shape[4]) == block):
            return have
        if block is None or (arg, block) in self.reblocked:
            return self.reblocked.get((arg, block))
        shape = blocked_shape(arg.ty.shape, block)
        var = self.builder_.emit(self._transform(lambda t: to_blocked(t, block), arg, shape))
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
        input_like_out = families.family_of(anchor).name == "depthwise_conv2d" or \
            narrow_groups(anchor, self.lanes) is not None
        out_block = block_for(int(anchor.ty.shape[1]), self.lanes)  # a depthwise input's and a residual's too
        out_shape = [int(d) for d in anchor.ty.shape]
        args, blocks = list(args), {}
        for i, arg in enumerate(args):
            if not _is_activation(arg):
                continue
            like_out = (i == data and input_like_out) or [int(d) for d in arg.ty.shape] == out_shape
            blocked = self.blocked_of.get(arg) if i == data and not input_like_out else \
                self._as_blocked(arg, out_block if like_out else None)
            if i == data and blocked is not None and not input_like_out and \
                    not group_input_block(anchor, int(blocked.ty.shape[4])):
                blocked = None  # a grouped conv whose groups the block would straddle reads the plain input
            if blocked is not None:
                args[i], blocks[i] = blocked, int(blocked.ty.shape[4])
        return args, blocks

    def _bind(self, var, value):
        """Bind ``value`` to the original variable: its readers, in this block or after it, stay valid."""
        self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(value)))

    def _bind_blocked(self, var, blocked, plain_shape):
        """``var`` computed blocked as ``blocked``: the original variable gets its NCHW value (dead code when
        nothing reads it plain) and blocked readers get ``blocked``."""
        self._bind(var, self._transform(to_plain, blocked, plain_shape))
        self.blocked_of[var] = blocked

    def _blocked_pool(self, binding) -> bool:
        """A max/average pooling of a blocked activation, pooled blocked (True); False leaves the binding
        to TVM's NCHW op on the plain value."""
        call = binding.value
        pool_type = POOLS.get(op_name(call))
        blocked = self.blocked_of.get(call.args[0]) if pool_type else None
        a = call.attrs if blocked is not None else None
        if a is None or str(a.layout) != "NCHW" or str(a.out_layout) != "NCHW":
            return False
        divisor = {"count_include_pad": bool(a.count_include_pad)} if pool_type == "avg" else {}
        out = self.builder_.emit(self._transform(
            lambda t: pool2d(t, pool_type, a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode, **divisor),
            blocked, blocked_shape(call.ty.shape, int(blocked.ty.shape[4])), family=POOL_FAMILY,
            name=f"{pool_type}_pool2d_nchwc"))
        self._bind_blocked(binding.var, out, call.ty.shape)
        return True

    def _blocked_mean(self, binding) -> bool:
        """A mean over H and W (global average pooling) of a blocked activation: read blocked, written NCHW."""
        call = binding.value
        if op_name(call) != "relax.mean" or call.args[0] not in self.blocked_of:
            return False
        axes = sorted(int(a) % 4 for a in call.attrs.axis) if call.attrs.axis is not None else None
        if axes != [2, 3]:
            return False
        self._bind(binding.var, self._transform(lambda t: spatial_mean(t, call.ty.shape),
                                                self.blocked_of[call.args[0]], call.ty.shape,
                                                family=POOL_FAMILY, name="mean_nchwc"))
        return True

    def _blocked_concat(self, binding) -> bool:
        """A channel concat of activations of which at least one is blocked: concatenated blocked, the others
        transformed to the same block (True). NCHW[b]c of a channel concat is the concat of the parts' channel
        blocks when every part has whole blocks, so a blocked consumer reads it without a round trip through
        NCHW (PP-OCRv6's stem: a max-pool and a conv, both blocked, met in a plain concat)."""
        call = binding.value
        if op_name(call) != "relax.concat" or len(call.ty.shape) != 4:
            return False
        parts = list(call.args[0].fields) if isinstance(call.args[0], relax.Tuple) else None
        if not parts or int(call.attrs.axis) % 4 != 1 or not any(p in self.blocked_of for p in parts):
            return False
        block = int(next(self.blocked_of[p] for p in parts if p in self.blocked_of).ty.shape[4])
        if any(not _is_activation(p) or int(p.ty.shape[1]) % block for p in parts):
            return False
        blocked = [self.blocked_of[p] if p in self.blocked_of else self._as_blocked(p) for p in parts]
        if any(b is None or int(b.ty.shape[4]) != block for b in blocked):
            return False
        out = self.builder_.emit(relax.op.concat(blocked, axis=1))
        self._bind_blocked(binding.var, out, call.ty.shape)
        return True

    def _channel_operand(self, arg, block: int):
        """An elementwise operand beside a blocked activation, in the blocked layout: the activation's own
        blocked value, a per-channel ``[1, C, 1, 1]`` tensor reshaped to ``[1, C/b, 1, 1, b]`` (channel
        ``c = co * b + ci`` either way), a one-element tensor or a non-tensor as it is; None otherwise."""
        if arg in self.blocked_of:
            blocked = self.blocked_of[arg]  # the activation, or a blocked [1, C, 1, 1] broadcast over it
            return blocked if int(blocked.ty.shape[4]) == block else None
        shape = getattr(arg.ty, "shape", None) if isinstance(arg, (relax.Var, tvm.ir.expr.Constant)) else None
        if shape is None:
            return arg if not isinstance(arg.ty, relax.TensorType) else None
        dims = [int(d) for d in shape]
        if all(d == 1 for d in dims):
            return arg
        if len(dims) in (3, 4) and dims[-2:] == [1, 1] and dims[-3] % block == 0 and all(d == 1 for d in dims[:-3]):
            return relax.op.reshape(arg, [1, dims[-3] // block, 1, 1, block])
        return None

    def _blocked_elementwise(self, binding) -> bool:
        """An elementwise op (:data:`ELEMENTWISE`) of a blocked activation, computed blocked (True): the
        squeeze-and-excitation product ``x * scale``, a residual add outside a partition, an activation
        after a concat. TVM fuses the chain into one kernel either way; blocked, it needs no ``to_plain``
        before it nor ``to_blocked`` after it when its consumer is a blocked kernel."""
        call = binding.value
        if op_name(call) not in ELEMENTWISE:
            return False
        shape = getattr(call.ty, "shape", None)
        if shape is None:
            return False
        base = next((a for a in call.args if a in self.blocked_of
                     and [int(d) for d in a.ty.shape] == [int(d) for d in shape]), None)
        if base is None:
            return False
        block = int(self.blocked_of[base].ty.shape[4])
        args = [self._channel_operand(a, block) for a in call.args]
        if any(a is None for a in args):
            return False
        out = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
        self._bind_blocked(binding.var, out, shape)
        scale = channel_scale(call, base)
        if scale is not None:
            self.scaled[binding.var] = (base, scale)
        return True

    def _fold_channel_scale(self, fn, args):
        """``(fn, args)`` of a conv2d partition whose data is a squeeze-and-excitation product read by nothing
        else, with the product moved into the kernel (``channel_scale.with_prologue``: ``x`` in the data's
        place, the scale appended, both blocked like the product was; the kernel scales its weight, see
        ``schedules/channel_scale.py``); as given otherwise: Winograd kernels (weights transformed at compile
        time), and weights with more values per input channel than the map has pixels."""
        anchor = anchor_call(fn)
        index = param_index(fn, anchor.args[0])
        if index is None or families.family_of(anchor).name != "conv2d" or winograd_pays(anchor, self.lanes):
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

    def _blocked_depth_to_space(self, binding) -> bool:
        """The depth-to-space ``TransposeConvToConv`` writes after a phase conv (reshape to ``[N, groups, sh,
        sw, Cg, H, W]``, its transpose, reshape to NCHW) of a blocked activation whose blocks divide ``Cg``:
        computed blocked (:func:`depth_to_space`), so the upsampled map needs no ``to_plain`` before it nor
        ``to_blocked`` after it (True)."""
        call = binding.value
        if op_name(call) != "relax.reshape" or not isinstance(call.args[0], relax.Var):
            return False
        moved = self.lookup_binding(call.args[0])
        if op_name(moved) != "relax.permute_dims" or not isinstance(moved.args[0], relax.Var) or \
                [int(a) for a in moved.attrs.axes] != list(DEPTH_TO_SPACE_AXES):
            return False
        split = self.lookup_binding(moved.args[0])
        if op_name(split) != "relax.reshape" or split.args[0] not in self.blocked_of:
            return False
        blocked = self.blocked_of[split.args[0]]
        _, groups, sh, sw, cg, _, _ = (int(d) for d in split.ty.shape)
        if cg % int(blocked.ty.shape[4]):
            return False
        out = self.builder_.emit_te(depth_to_space, blocked, groups, sh, sw, primfunc_name_hint="depth_to_space_nchwc")
        self._bind_blocked(binding.var, out, call.ty.shape)
        return True

    def _blocked_split(self, binding) -> bool:
        """A channel split of a blocked activation at block boundaries (YOLOv8's C2f: a conv's output halved):
        split blocked too. The plain split stays bound to the original variable (dead code when nothing reads
        it); each part read by a ``TupleGetItem`` is blocked (:meth:`_blocked_part`), so the concat and convs
        after it need neither a ``to_plain`` before the split nor a ``to_blocked`` after it (True)."""
        call = binding.value
        if op_name(call) != "relax.split" or call.args[0] not in self.blocked_of or len(call.args[0].ty.shape) != 4 \
                or int(call.attrs.axis) % 4 != 1:
            return False
        blocked = self.blocked_of[call.args[0]]
        block, channels = int(blocked.ty.shape[4]), int(call.args[0].ty.shape[1])
        sections = call.attrs.indices_or_sections
        if isinstance(sections, (int, tvm.tirx.IntImm)):
            cuts = [channels // int(sections) * k for k in range(1, int(sections))]
        else:
            cuts = [int(i) for i in sections]
        if any(c % block for c in cuts) or channels % block:
            return False
        parts = self.builder_.emit(relax.op.split(blocked, [c // block for c in cuts], axis=1))
        self._bind(binding.var, call)
        self.blocked_parts[binding.var] = parts
        return True

    def _blocked_resize(self, binding) -> bool:
        """A resize (``R.image.resize2d``, NCHW) of a blocked activation: the same resize in the blocked layout
        (TVM's ``NCHW[b]c`` layout of the op; every method works per channel), so the upsampling of a detector's
        neck needs no ``to_plain`` before it nor ``to_blocked`` after it (True)."""
        call = binding.value
        if op_name(call) != "relax.image.resize2d" or call.args[0] not in self.blocked_of \
                or str(call.attrs.layout) != "NCHW":
            return False
        blocked = self.blocked_of[call.args[0]]
        a = call.attrs
        out = self.builder_.emit(relax.op.image.resize2d(
            blocked, call.args[1], [float(v) for v in a.roi], f"NCHW{int(blocked.ty.shape[4])}c", str(a.method),
            str(a.coordinate_transformation_mode), str(a.rounding_method), float(a.cubic_alpha),
            int(a.cubic_exclude), float(a.extrapolation_value), a.out_dtype))
        self._bind_blocked(binding.var, out, call.ty.shape)
        return True

    def _blocked_part(self, binding) -> bool:
        """``TupleGetItem`` of a split computed blocked: the part's blocked value beside its plain one (True)."""
        get = binding.value
        if not isinstance(get, relax.TupleGetItem) or get.tuple_value not in self.blocked_parts:
            return False
        part = self.builder_.emit(relax.TupleGetItem(self.blocked_parts[get.tuple_value], get.index))
        self._bind(binding.var, get)
        self.blocked_of[binding.var] = part
        return True

    def visit_var_binding_(self, binding):
        if self.lanes is not None and (self._blocked_pool(binding) or self._blocked_mean(binding)
                                       or self._blocked_concat(binding) or self._blocked_elementwise(binding)
                                       or self._blocked_depth_to_space(binding) or self._blocked_split(binding)
                                       or self._blocked_part(binding) or self._blocked_resize(binding)):
            return None
        fn = self._partition(binding.value)
        if fn is None:
            return super().visit_var_binding_(binding)
        args = [self.visit_expr(a) for a in binding.value.args]
        if self.lanes is None or not blockable(fn, self.lanes):
            gv, args, _ = self._kernel(fn, args)
            return self._bind(binding.var, relax.call_tir(gv, args, fn.ret_ty))
        fn, args = self._fold_channel_scale(fn, args)
        args, blocks = self._blocked_args(fn, args)
        gv, args, layout = self._kernel(fn, args, blocks)
        shape = blocked_shape(fn.ret_ty.shape, layout.out_block)
        out = self.builder_.emit(relax.call_tir(gv, args, relax.TensorType(shape, fn.ret_ty.dtype)))
        self._bind_blocked(binding.var, out, fn.ret_ty.shape)


def LowerPartitions(spec: TargetSpec | None = None, record: dict | None = None,  # noqa: N802
                    blocked: bool = True) -> tvm.transform.Pass:
    """Lower every partition call to ``call_tir``; the partition functions are then dropped.

    ``record`` (optional dict) receives kernel name -> (the partition function it came from, its
    :class:`~tvmfuse.schedules.blocked.KernelLayout`). ``blocked`` (backends with a blocked layout):
    chain blockable partitions in NCHW[b]c; False keeps every kernel NCHW.
    """

    @tvm.transform.module_pass(opt_level=0, name="LowerPartitions")
    def _lower(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        lower = _Lower(mod, spec, record, blocked)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function) and not is_partition(func):
                lower.users = users_of(func)
                lower.builder_.update_func(gv, lower.visit_expr(func))
        return relax.transform.DeadCodeElimination()(lower.builder_.get())

    return _lower
