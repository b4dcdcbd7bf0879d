"""FuseQDQ: the QDQ chains of a quantized ONNX model become INT8 kernels, with the model's own parameters.

A model quantized in QDQ format (ONNX Runtime's ``quantize_static(..., quant_format=QuantFormat.QDQ)``, or
QLinearConv / QLinearMatMul rewritten by :mod:`tvmfuse.frontend.qlinear`) imports as float ops between
``relax.dequantize`` and ``relax.quantize``. Each chain ::

    dequantize(x codes) -> conv2d | matmul      weight: [permute_dims] dequantize(int8 constant)
        [-> add bias]                           constant, or [reshape] dequantize(int32 constant)
        [-> add dequantize(residual codes)] [-> relu | clip] -> quantize(y)

becomes one ``call_tir`` to the INT8 kernel of :mod:`.int8_kernels` (conv2d, depthwise conv2d, dense) that
reads the codes of x and writes the codes of y. The model's weight codes, per-channel weight scales, int32
bias and activation scales and zero points are used as they are; nothing is calibrated. The epilogue order
is the kernel's (bias, residual, activation); an activation before the residual add stays float.

Where it runs: first thing in canonicalize, right after CanonicalizeClip (so relu6 is one ``relax.clip``)
and before FoldConstant, which would fold ``dequantize(weight constant)`` into a float constant and erase the
chain. The chains are walked by hand from each conv2d / matmul rather than matched with FuseOpsByPattern:
one walk covers the optional pieces (bias with or without reshape, Gemm's transposed weight, residual in
either operand order, activation) and names the reason whenever a candidate is refused.

Conventions (those of :mod:`tvmfuse.schedules.computes.int8`) and what stays float. A refused chain keeps today's
path, quantize / dequantize around float ops, which computes the model's own semantics, only slower; the
reason goes to the report.

- Activations: uint8 codes (ONNX Runtime's default) go straight in. int8 codes are shifted by +128 into
  uint8 with the zero point + 128 (exact: the same integers), and an int8 quantize is written by the
  kernel directly. Per-channel activation parameters stay float.
- Weights: int8, zero point 0, per tensor or per output channel. -128 is accepted: every kernel step is exact
  with it (VNNI sums u8 x s8 in int32; the AVX2 step widens to int16 before ``vpmaddwd``, pair sums reach
  2 * 255 * 128, far inside int32; depthwise multiplies in int32). uint8 weights, a zero point != 0, and
  scales along an axis other than the output channels stay float.
- Bias: the model's int32 codes are used when their scale is ``s_x * s_w[o]`` (ONNX Runtime's convention),
  otherwise the bias is re-quantized to that scale.
- Rounding: the kernels round half to even, as ONNX QuantizeLinear does. They requantize the exact int32 sum
  once with ``M = s_x * s_w / s_y`` computed in float32 in ONNX Runtime's order
  (:func:`.epilogues.model_multiplier`), so they match ONNX Runtime's QLinearConv / QLinearMatMul bit for
  bit (where its AVX2 kernel does not saturate); the float simulation sums dequantized products in float32
  instead, so it can differ from both by one code next to a rounding boundary.
- Every result inside a chain must be read only by the next op of the chain.

Elementwise ops after a chain's quantize that read nothing but its codes and constants, with quantize /
dequantize pairs between them (a hardswish or sigmoid spelt out by ONNX Runtime's quantizer), become a table
of output codes in the chain's kernel (:mod:`.qdq_tables`). A residual add of the chain's dequantized codes
and another tensor's, quantized again, goes into the kernel's epilogue, and a max-pool between two quantizes
of the same parameters pools the codes (:mod:`.qdq_after`). Other ops between chains (an average pool, an add
of two float results) keep their quantize / dequantize around float ops. ONNX Runtime fuses such ops into
QLinearAdd / QLinearGlobalAveragePool with fixed-point rounding of its own, so a whole QDQ model can end a code
or two away from ONNX Runtime's output.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import tvm
from tvm import relax

from tvmfuse.schedules import families
from tvmfuse.schedules.computes.int8 import Int8KernelError

from ...quant.params import QuantParams, QuantParamsError
from ...targets import TargetSpec
from .kernels import OutputTable, codes_blocked, make_int8_kernel, weight_packing
from .match import Int8Partition, QuantizedWeight, clip_bounds, per_channel, short_op_name
from .qdq_rewrite import SHIFT, Rewrite, choose_layouts
from .qdq_after import CodePool, added_after, ops_on_codes
from .qdq_graph import Graph, Refused, codes_of, ints, op_name, qparams
from .qdq_tables import output_table
from ..utils import called_ops, const_array

class QDQWarning(UserWarning):
    """Quantized conv2d / matmul chains of the model stay float (correct, slower); the message says why."""


@dataclasses.dataclass
class _Chain:
    """One matched chain: the INT8 kernel, its constants, and the tensors it reads."""

    end: relax.Var  # bound to the quantize the kernel replaces
    data: relax.Var  # codes of x
    data_dtype: str
    residual: relax.Var | None
    kernel: tvm.tirx.PrimFunc  # NCHW in and out; rebuilt for NCHW16c by the rewrite
    constants: list
    out_type: relax.TensorType
    name: str
    part: Int8Partition
    params: tuple  # (x, out, residual) QuantParams, as make_int8_kernel takes them
    table: OutputTable | None = None  # the elementwise run after the quantize, when the kernel writes its codes


def _weight(graph: Graph, expr, family: families.Family) -> QuantizedWeight:
    """The model's int8 weight, output channel first, and its scale per output channel."""
    call, transposed = graph.value(expr), False
    if family.matmul and op_name(call) == "relax.permute_dims":
        if call.attrs.axes is None or ints(call.attrs.axes) != [1, 0]:
            raise Refused("the weight's permute_dims is not a transpose")
        call, transposed = graph.value(call.args[0]), True
    codes = const_array(call.args[0]) if op_name(call) == "relax.dequantize" else None
    if codes is None:
        raise Refused("the weight is not a dequantized constant")
    scale, zero_point = const_array(call.args[1]), const_array(call.args[2])
    if scale is None or zero_point is None:
        raise Refused("the weight's scale or zero point is not a constant")
    if codes.dtype != np.int8:
        raise Refused(f"{codes.dtype} weight (the kernels take int8 weights)")
    if np.any(zero_point != 0):
        raise Refused("weight zero point is not 0 (the kernels take symmetric weights)")
    out_axis = 1 if family.matmul and not transposed else 0  # matmul's weight is [K, N]
    channels = codes.shape[out_axis]
    if scale.size == 1:
        scale = np.full(channels, float(scale.reshape(())), np.float32)
    elif int(call.attrs.axis) % codes.ndim != out_axis or scale.size != channels:
        raise Refused(f"weight scales along axis {int(call.attrs.axis)}, not per output channel")
    return QuantizedWeight(np.ascontiguousarray(np.moveaxis(codes, out_axis, 0)), scale.astype(np.float32))


def _bias(graph: Graph, expr, out_shape) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None:
    """(float bias per channel, int32 codes, their scale) of a bias operand; None when ``expr`` is none."""
    node, shape = graph.value(expr), None
    if op_name(node) == "relax.reshape":
        shape, node = ints(node.ty.shape), graph.value(node.args[0])
    codes = scale = None
    if op_name(node) == "relax.dequantize":
        codes, scale, zero_point = (const_array(a) for a in node.args)
        if codes is None or scale is None or zero_point is None:
            return None
        axis = int(node.attrs.axis) % max(codes.ndim, 1)
        broadcast = [1] * codes.ndim
        if scale.size > 1:
            broadcast[axis] = -1
        value = (codes.astype(np.float64) - zero_point.reshape(broadcast)) * scale.reshape(broadcast)
        if codes.dtype != np.int32 or np.any(zero_point != 0) or codes.ndim != 1:
            codes = None  # used through its float value only
    else:
        value = const_array(node)
        if value is None:
            return None
    bias = per_channel(value.reshape(shape) if shape is not None else value, out_shape)
    if bias is None:
        raise Refused(f"bias of shape {value.shape} is not one value per output channel")
    if codes is None or codes.size != bias.size:
        return bias, None, None
    return bias, codes, np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), codes.shape).copy()


def _check_anchor(anchor, family: families.Family) -> None:
    if family.matmul:
        if len(anchor.args[0].ty.shape) != 2 or len(anchor.args[1].ty.shape) != 2:
            raise Refused(f"matmul of a rank-{len(anchor.args[0].ty.shape)} input (the INT8 dense is 2-D)")
        return
    a = anchor.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NCHW", "OIHW", "NCHW"):
        raise Refused(f"conv2d layout {a.data_layout}/{a.kernel_layout} (the kernels take NCHW/OIHW)")


@dataclasses.dataclass
class _Epilogue:
    """What the walk from the anchor to the quantize found."""

    bias: tuple | None = None
    residual: tuple | None = None  # (codes var, QuantParams)
    clip: tuple | None = None
    ops: list = dataclasses.field(default_factory=list)
    stage: int = 0  # 1 after the bias, 2 after the residual, 3 after the activation: the kernel's order


def _read_add(graph: Graph, call, prev, found: _Epilogue, out_shape) -> None:
    other = call.args[1] if call.args[0].same_as(prev) else call.args[0]
    bias = _bias(graph, other, out_shape) if found.stage < 1 else None
    if bias is not None:
        found.bias, found.stage = bias, 1
        return
    if found.stage >= 2:
        raise Refused("an add after the residual add or the activation")
    if ints(other.ty.shape) != list(out_shape):
        raise Refused(f"residual operand of shape {ints(other.ty.shape)} for an output of shape {list(out_shape)}")
    found.residual, found.stage = codes_of(graph, other, "the residual operand"), 2


def _walk(graph: Graph, anchor_var, anchor_name: str) -> tuple[_Epilogue, relax.Var, object]:
    """Follow the anchor's result to its quantize; returns the epilogue, the quantize's var and call."""
    found, prev = _Epilogue(), anchor_var
    out_shape = ints(anchor_var.ty.shape)
    while True:
        var, call = graph.next_binding(prev, anchor_name)
        name = op_name(call)
        if name == "relax.quantize":
            if not call.args[0].same_as(prev):
                raise Refused(f"{prev.name} is a quantize parameter")
            return found, var, call
        found.ops.append(name.replace("relax.nn.", "").replace("relax.", "") or type(call).__name__)
        if name == "relax.add":
            _read_add(graph, call, prev, found, out_shape)
        elif name in ("relax.nn.relu", "relax.clip") and found.stage < 3:
            found.clip = (0.0, None) if name == "relax.nn.relu" else clip_bounds(call)
            found.stage = 3
        else:
            raise Refused(f"{found.ops[-1]} between {anchor_name} and its quantize has no INT8 kernel")
        prev = var


def _match(graph: Graph, anchor_var, anchor, weights: str = "", taken=()) -> _Chain:
    """The chain starting at ``anchor`` as an INT8 kernel (its weight packed as ``weights``, the target's
    ``weight_packing``), or Refused. A residual add after the chain's quantize goes into the kernel
    (:func:`.qdq_after.added_after`) unless its quantize is in ``taken`` (the other operand's chain has it)."""
    kind = short_op_name(anchor.op.name)
    family, why = families.int8_family(anchor)
    if family is None:
        raise Refused(why)
    _check_anchor(anchor, family)
    data, x = codes_of(graph, anchor.args[0], "the input")
    weight = _weight(graph, anchor.args[1], family)
    found, end, quantize = _walk(graph, anchor_var, kind)
    out = qparams(quantize, str(quantize.attrs.out_dtype), "the output quantize")
    added = added_after(graph, end, out, kind) if found.residual is None else None
    if added is not None and added.end in taken:
        added = None
    if added is not None:
        end, out, found.residual, found.ops = (added.end, qparams(added.quantize, str(added.quantize.attrs.out_dtype),
                                               "the sum's quantize"), added.residual, found.ops + added.ops)
    end, table = output_table(graph, end, out.dtype) or (end, None)
    bias, bias_codes, bias_scale = found.bias if found.bias is not None else (None, None, None)
    weight = dataclasses.replace(weight, bias_codes=bias_codes, bias_scale=bias_scale)
    out_shape = tuple(ints(end.ty.shape))
    conv = {}
    if not family.matmul:
        a = anchor.attrs
        conv = {"strides": ints(a.strides), "padding": ints(a.padding), "dilation": ints(a.dilation)}
    shape = [1] * weight.codes.ndim
    shape[0] = -1
    real = weight.codes.astype(np.float32) * weight.scale.reshape(shape)
    composite = "tvmfuse.qdq_" + "_".join([family.name] + found.ops + (["table"] if table else []))
    # data / residual: positions in the kernel call (data, weight, bias, multiplier[, residual]).
    part = Int8Partition(composite, family.name, 0, 4 if found.residual else None,
                         real.T if family.matmul else real, bias, found.clip, conv, out_shape,
                         [kind] + found.ops, weight, added=added.after if added is not None else None)
    if x.dtype == "int8":
        x = QuantParams(x.scale, x.zero_point + SHIFT, "uint8")
    residual, res = found.residual if found.residual is not None else (None, None)
    try:
        kernel, constants = make_int8_kernel(part, ints(data.ty.shape), x, out, res, weights=weights, table=table)
    except (Int8KernelError, QuantParamsError) as e:
        raise Refused(str(e)) from None
    return _Chain(end, data, str(data.ty.dtype), residual, kernel, constants,
                  relax.TensorType(list(out_shape), out.dtype), composite.replace("tvmfuse.", "tvmfuse_int8_"), part,
                  (x, out, res), table)


def _dequantized(graph: Graph, expr) -> bool:
    value = graph.value(expr)
    if op_name(value) == "relax.permute_dims":
        value = graph.value(value.args[0])
    return op_name(value) == "relax.dequantize"


def _candidates(graph: Graph, func: relax.Function) -> list:
    """(var, call) of every conv2d / matmul reading a dequantized input or weight."""
    found = []
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if families.is_anchor(call) and any(_dequantized(graph, a) for a in call.args[:2]):
                found.append((binding.var, call))
    return found


def _transforms_left(mod: tvm.IRModule) -> int:
    """uint8 layout transforms ``main`` still calls after dead-code elimination."""
    calls = [b.value for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and b.value.op == tvm.ir.Op.get("relax.call_tir")]
    transform = families.LAYOUT_TRANSFORM.name
    return sum(str((mod[c.args[0]].attrs or {}).get("tvmfuse.family", "")) == transform for c in calls)


def FuseQDQ(spec: TargetSpec | None = None, report: dict | None = None,  # noqa: N802
            blocked: bool = True) -> tvm.transform.Pass:
    """The pass mapping QDQ chains of ``main`` to INT8 kernels.

    Parameters
    ----------
    spec : TargetSpec or None
        The compile target (None: a CPU target). The INT8 kernels are scheduled for CPU targets only; on other
        targets every chain stays float.
    report : dict, optional
        Receives ``int8_kernels`` (chains replaced) and ``kept_float``: one ``{"anchor", "op", "reason"}``
        per conv2d / matmul reading dequantized tensors that stays float; ``residual_adds``: the residual adds
        after a chain's quantize computed in its kernel, ``code_pools`` and ``code_squeezes``: the max-pools, and
        the spatial means, channel gates and concats computed on codes (:mod:`.qdq_after`); ``layout_transforms``: uint8
        NCHW <-> NCHW16c transforms left in the module.
    blocked : bool
        Codes NCHW16c between INT8 kernels that have that form (:mod:`.qdq_rewrite`); False: NCHW throughout.

    Warns
    -----
    QDQWarning
        When some of those stay float, naming the first few and why.
    """

    @tvm.transform.module_pass(opt_level=0, name="FuseQDQ")
    def _fuse(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        func = mod["main"]
        if "relax.dequantize" not in called_ops(mod):
            # a float model: no chain can start (the graph below costs 50 ms on MobileNetV2)
            if report is not None:
                report.update({"int8_kernels": 0, "kept_float": [], "code_pools": 0, "code_squeezes": 0,
                               "residual_adds": 0})
            return mod
        graph = Graph(func)
        chains, kept = {}, []
        int8_kernels = spec is None or spec.backend().int8_kernels
        weights = weight_packing(spec)
        for var, call in _candidates(graph, func):
            try:
                if not int8_kernels:
                    raise Refused(f"target {spec.name} has no INT8 kernels (backend {spec.backend_name})")
                chain = _match(graph, var, call, weights, taken=chains)
                chains[chain.end] = chain
            except Refused as e:
                kept.append({"anchor": var.name, "op": short_op_name(call.op.name), "reason": str(e)})
        on_codes = ops_on_codes(graph, func) if chains else {}
        if report is not None:
            pools = sum(isinstance(op, CodePool) for op in on_codes.values())
            report.update({"int8_kernels": len(chains), "kept_float": kept, "code_pools": pools,
                           "code_squeezes": len(on_codes) - pools,
                           "residual_adds": sum(chain.part.added is not None for chain in chains.values())})
        if kept:
            reasons = "; ".join(f"{k['op']} {k['anchor']}: {k['reason']}" for k in kept[:3])
            more = "; ..." if len(kept) > 3 else ""
            warnings.warn(f"FuseQDQ: {len(kept)} of {len(kept) + len(chains)} quantized conv2d/matmul stay float "
                          f"(simulated with quantize/dequantize, slower): {reasons}{more}", QDQWarning, stacklevel=2)
        if not chains:
            return mod
        layouts = choose_layouts(chains, on_codes) if codes_blocked(spec, blocked) else None
        rewrite = Rewrite(mod, chains, layouts, weights, on_codes)
        rewrite.builder_.update_func(mod.get_global_var("main"), rewrite.visit_expr(func))
        out = relax.transform.DeadCodeElimination()(rewrite.builder_.get())
        if report is not None:
            report["layout_transforms"] = _transforms_left(out)
        return out

    return _fuse
