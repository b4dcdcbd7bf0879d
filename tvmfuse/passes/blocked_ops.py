"""Ops outside partitions that LowerPartitions keeps in the blocked layout (NCHW[b]c).

A pooling, a global mean, a channel concat or split, an elementwise op, a depth-to-space, a channel shuffle or
a resize whose input is blocked is computed blocked, so the blocked kernels around it need no ``to_plain`` before it nor
``to_blocked`` after it. :class:`BlockedOps` is a mixin of ``lower._Lower``: it reads and extends the
lowering's maps (``blocked_of``, ``blocked_parts``, ``scaled``) and emits through its builder.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmfuse.schedules.computes.blocked import (CHANNEL_SHUFFLE, blocked_shape, channel_shuffle, depth_to_space, pool2d,
                                       spatial_mean)

from .channel_scale import channel_scale
from .conv_transpose import DEPTH_TO_SPACE_AXES
from .layout import POOL_FAMILY
from .utils import op_name

POOLS = {"relax.nn.max_pool2d": "max", "relax.nn.avg_pool2d": "avg"}
# Elementwise ops computed on NCHW[b]c as they are on NCHW (see BlockedOps._blocked_elementwise).
ELEMENTWISE = {"relax.add", "relax.multiply", "relax.subtract", "relax.divide", "relax.maximum", "relax.minimum",
               "relax.sigmoid", "relax.nn.relu", "relax.clip", "relax.tanh", "relax.nn.silu", "relax.nn.gelu",
               "relax.nn.gelu_tanh", "relax.erf", "relax.exp", "relax.nn.leakyrelu", "relax.sqrt", "relax.negative",
               "relax.abs"}


def is_activation(arg) -> bool:
    """A 4-D tensor variable (what the blocked layout applies to)."""
    return isinstance(arg, relax.Var) and len(getattr(arg.ty, "shape", None) or []) == 4


class BlockedOps:
    """The blocked forms of ops outside partitions (see the module docstring)."""

    def blocked_op(self, binding) -> bool:
        """Emit ``binding`` blocked when its op has a blocked form here and its input is blocked (True)."""
        return (self._blocked_pool(binding) or self._blocked_mean(binding) or self._blocked_concat(binding)
                or self._blocked_elementwise(binding) or self._blocked_depth_to_space(binding)
                or self._blocked_split(binding) or self._blocked_part(binding) or self._blocked_resize(binding)
                or self._blocked_channel_shuffle(binding))

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
        if any(not is_activation(p) or int(p.ty.shape[1]) % block for p in parts):
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
        if len(shape) != 4 or int(shape[1]) % block:
            return False  # a padded block (zeros in its padded lanes) meets the op on its plain value
        args = [self._channel_operand(a, block) for a in call.args]
        if any(a is None for a in args):
            return False
        out = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
        self._bind_blocked(binding.var, out, shape)
        scale = channel_scale(call, base)
        if scale is not None:
            self.scaled[binding.var] = (base, scale)
        return True

    def _blocked_depth_to_space(self, binding) -> bool:
        """The depth-to-space ``TransposeConvToConv`` writes after a phase conv (reshape to ``[N, groups, sh,
        sw, Cg, H, W]``, its transpose, reshape to NCHW) of a blocked activation whose blocks divide ``Cg``:
        computed blocked (:func:`depth_to_space`), so the upsampled map needs no ``to_plain`` before it nor
        ``to_blocked`` after it (True)."""
        call = binding.value
        found = self._grouped_transpose(call, list(DEPTH_TO_SPACE_AXES))
        if found is None:
            return False
        split, source = found
        blocked = self.blocked_of[source]
        _, groups, sh, sw, cg, _, _ = (int(d) for d in split.ty.shape)
        if cg % int(blocked.ty.shape[4]):
            return False
        out = self.builder_.emit_te(depth_to_space, blocked, groups, sh, sw, primfunc_name_hint="depth_to_space_nchwc")
        self._bind_blocked(binding.var, out, call.ty.shape)
        return True

    def _grouped_transpose(self, call, axes: list[int]):
        """``(the 5-D reshape, its input)`` when ``call`` is a reshape of ``permute_dims(axes)`` of a reshape of
        a blocked activation (the shape of a depth-to-space or a channel shuffle); None otherwise."""
        if op_name(call) != "relax.reshape" or not isinstance(call.args[0], relax.Var):
            return None
        moved = self.lookup_binding(call.args[0])
        if op_name(moved) != "relax.permute_dims" or not isinstance(moved.args[0], relax.Var) or \
                moved.attrs.axes is None or [int(a) for a in moved.attrs.axes] != axes:
            return None
        grouped = self.lookup_binding(moved.args[0])
        if op_name(grouped) != "relax.reshape" or grouped.args[0] not in self.blocked_of:
            return None
        return grouped, grouped.args[0]

    def _blocked_channel_shuffle(self, binding) -> bool:
        """ShuffleNet's channel shuffle (reshape to ``[N, g, C/g, H, W]``, swap the two channel axes, reshape
        back) of a blocked activation: computed blocked (:func:`channel_shuffle`), so the concat before it,
        the split after it and the convs reading the halves stay blocked (True). ShuffleNetV2's last stage
        (232 channels a branch, blocks of 8) took a ``to_plain`` before and a ``to_blocked`` after each of its
        four shuffles."""
        call = binding.value
        found = self._grouped_transpose(call, [0, 2, 1, 3, 4])
        if found is None or len(call.ty.shape) != 4:
            return False
        grouped, source = found
        n, groups, per_group, h, w = (int(d) for d in grouped.ty.shape)
        plain = [n, groups * per_group, h, w]
        if [int(d) for d in source.ty.shape] != plain or [int(d) for d in call.ty.shape] != plain or \
                plain[1] % int(self.blocked_of[source].ty.shape[4]):
            return False
        out = self.builder_.emit_te(channel_shuffle, self.blocked_of[source], groups,
                                    primfunc_name_hint=CHANNEL_SHUFFLE)
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
