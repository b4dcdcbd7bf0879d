"""QuantizeGraph: turn the partitions the INT8 kernels support into INT8 kernel calls, with quantize and
dequantize only at the borders of INT8 regions.

Runs on the partitioned module (after ``Partition``, before ``LowerPartitions``) with a calibration table
keyed like :func:`tvmfuse.quant.keys.observed_tensors`. A partition call becomes one ``call_tir`` to an
INT8 kernel (:mod:`.int8_kernels`) when its anchor and epilogue have one (conv2d with groups = 1, depthwise
conv2d, dense; bias, relu, clip, hardswish, residual add) and the table holds its input, output and residual tensors.
Everything else stays FP32 and is lowered as usual. An activation no INT8 epilogue applies (SiLU, GELU, ...)
is not in the partition to begin with (the INT8 pattern table, :func:`tvmfuse.patterns.table`): it reads the
INT8 kernel's float32 output.

Borders, with every activation uint8 and quantized per tensor:

- An INT8 partition reads uint8 codes: the uint8 output of the INT8 partition that produced the tensor, or
  one ``relax.quantize`` of a float tensor (shared by every INT8 consumer of that tensor). Residual operands
  are handled alike.
- Its output is uint8 when every consumer is an INT8 partition; float32 straight from the kernel's epilogue
  (dequantize fused) when none is; uint8 plus one ``relax.dequantize`` for the FP32 consumers when mixed.
  A model output counts as an FP32 consumer.
- A max-pool between INT8 partitions pools the uint8 codes (exact); squeeze-and-excitation's spatial mean
  and channel gate, and channel concats, inside an INT8 region run on codes too (``codes``: no float tensor).

Layout (``blocked``, the default): an INT8 kernel with an NCHW16c form writes its uint8 codes NCHW16c when
another such kernel, or an op on codes that keeps their layout (max-pool, mean, gate), reads them
(``_choose_layouts``); a reader that needs NCHW (the dequantize for FP32 consumers, a residual of an NCHW
output) gets one ``to_plain``, and a depthwise kernel
reading NCHW codes (a quantized input) one ``to_blocked``. A conv2d repacks its input anyway and reads
either layout. The integers are the NCHW build's, in another order.
"""

from __future__ import annotations

import dataclasses
import warnings

import tvm
from tvm import relax

from tvmfuse.schedules.computes import int8_concat, int8_se
from tvmfuse.schedules.computes.blocked import pool2d
from tvmfuse.schedules.computes.int8 import BLOCK_O, BLOCKED_LAYOUT, Int8KernelError

from ...quant.keys import observed_tensors
from ...quant.params import QuantParams, activation_params
from ...targets import TargetSpec
from .kernels import (OutputTable, blocked_kernel, check_weight_bits, codes_blocked, data_layout, int8_constants,
                      kernel_out_shape, make_int8_kernel, relayout, weight_packing)
from .match import Int8Partition, analyze
from .codes import float_read, ops_on_codes
from ..layout import POOL_FAMILY, transform_call
from .tables import Chain, find_chains, output_table
from ..partition import is_partition
from ..utils import add_kernel, bindings_of, emit_like, users_of


class QuantizeWarning(UserWarning):
    """Nothing in the model could be quantized: it compiles as FP32."""


@dataclasses.dataclass
class _Site:
    """One partition call of ``main``."""

    var: relax.Var  # the var the call's result is bound to
    call: relax.Call
    composite: str
    key: str  # the table key of the result
    part: Int8Partition | None = None
    reason: str | None = None
    out_dtype: str = "float32"  # of an INT8 site: "uint8" or "float32"
    dequantize: bool = False  # uint8 output that FP32 consumers also read
    out_layout: str = "NCHW"  # of an INT8 site's output: "NCHW" or int8.BLOCKED_LAYOUT (uint8 codes)
    chain: Chain | None = None  # elementwise ops after the site that its kernel applies as a table
    table: OutputTable | None = None

    @property
    def out_var(self):
        """The var whose codes the kernel writes: the partition's result, or the end of its chain."""
        return self.chain.end if self.chain is not None else self.var


def _key_of(keys: dict, var) -> str:
    """The table key of ``var``; a var calibration does not observe gets a key no table holds."""
    return keys.get(var, f"<{var.name}: not observed by calibration>")


def _find_sites(mod: tvm.IRModule, table, keys: dict) -> list[_Site]:
    """Every partition call of ``main``, analysed: INT8 (``part``) or FP32 (``reason``)."""
    sites = []
    for binding in bindings_of(mod["main"]):
        call = binding.value
        if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.GlobalVar)
                and is_partition(mod[call.op])):
            continue
        fn = mod[call.op]
        site = _Site(binding.var, call, str(fn.attrs["Composite"]), _key_of(keys, binding.var))
        site.part, site.reason = analyze(fn, call.args)
        if site.part is not None:
            tensors = [call.args[site.part.data]] + ([call.args[site.part.residual]] if site.part.residual
                                                    is not None else [])
            missing = [_key_of(keys, v) for v in tensors + [binding.var] if _key_of(keys, v) not in table]
            if missing:
                site.part, site.reason = None, f"no calibration range for tensor {missing[0]!r}"
        sites.append(site)
    return sites


def _attach_tables(mod: tvm.IRModule, sites: list[_Site], users: dict, table, keys: dict) -> None:
    """Give an INT8 site the elementwise chain after it (:mod:`.tables`) when an INT8 site reads the
    chain's result and calibration observed both ends: its kernel then writes the result's codes."""
    int8 = {s.var: s for s in sites if s.part is not None}
    for start, chain in find_chains(mod["main"], set(int8), users).items():
        end_key = _key_of(keys, chain.end)
        if end_key not in table or not any(r in int8 for r in users.get(chain.end, [])):
            continue
        site = int8[start]
        codes = output_table(chain, activation_params(*table[site.key], dtype="uint8"),
                             activation_params(*table[end_key], dtype="uint8"))
        if codes is not None:
            site.chain, site.table = chain, codes


def _choose_outputs(sites: list[_Site], users: dict, int8_vars: set, gates: dict) -> None:
    """uint8 output for INT8 sites read by INT8 sites or by ops on codes (``int8_vars``: both; a gate's
    product reads the gate itself as float32), plus a dequantize if FP32 consumers read it too."""
    for site in sites:
        if site.part is None:
            continue
        readers = users.get(site.out_var, [])
        int8_readers = sum(1 for r in readers if r in int8_vars
                           and not (r in gates and gates[r][1].same_as(site.out_var)))
        site.out_dtype = "uint8" if int8_readers else "float32"
        site.dequantize = 0 < int8_readers < len(readers)


def _choose_layouts(sites: list[_Site], users: dict, keep_layout: dict) -> None:
    """NCHW16c uint8 output for the INT8 sites with an NCHW16c kernel that an INT8 site with one, or an op on
    codes that keeps their layout (``keep_layout``: max-pools, means, gates), reads: the codes stay blocked from kernel
    to kernel, and readers that need NCHW get one ``to_plain``."""
    blockable = {s.var for s in sites if s.part is not None and blocked_kernel(s.part)}
    readers_ok = blockable | set(keep_layout)
    for site in sites:
        if site.var in blockable and site.out_dtype == "uint8" and any(r in readers_ok
                                                                       for r in users.get(site.out_var, [])):
            site.out_layout = BLOCKED_LAYOUT


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    """Rewrites ``main``: INT8 sites become kernel calls, quantize/dequantize at the borders."""

    def __init__(self, mod: tvm.IRModule, sites: list[_Site], table, keys: dict, pools: dict, blocked: bool,
                 weights: str = "", means: dict | None = None, gates: dict | None = None,
                 dequantized: set | None = None, weight_bits: int | None = None, concats: dict | None = None):
        super().__init__(mod)
        self.weights, self.weight_bits = weights, weight_bits
        self.sites = {s.var: s for s in sites if s.part is not None}
        self.pools, self.dequantized = pools, dequantized or set()  # pools FP32 ops also read
        self.means, self.gates, self.concats = means or {}, gates or {}, concats or {}
        self.table, self.keys = table, keys
        self.inputs = set(mod["main"].params)
        self.codes: dict = {}  # original var -> {layout: its uint8 codes in that layout}
        self.blocked = blocked
        self.quantize_ops = self.dequantize_ops = self.layout_transforms = 0
        self.tabled = {v for site in sites if site.chain is not None for v in site.chain.vars}  # not emitted

    def qparams(self, var) -> QuantParams:
        var = self.pools.get(var, var)  # pooled codes keep their input's parameters
        return activation_params(*self.table[_key_of(self.keys, var)], dtype="uint8")

    def _emit_like(self, value, like, suffix: str = ""):
        return emit_like(self.builder_, value, like, suffix, self.inputs)

    def visit_dataflow_block_(self, block):
        # A DataflowVar dies with its block: forget the codes bound to one before the next block.
        self.codes = {k: kept for k, v in self.codes.items()
                      if (kept := {lay: c for lay, c in v.items() if not isinstance(c, relax.DataflowVar)})}
        return super().visit_dataflow_block_(block)

    def _codes_of(self, var, layout: str | None = "NCHW"):
        """The uint8 codes of ``var`` in ``layout`` (None: whichever exists, NCHW16c first): an INT8
        producer's output, or a quantize, converted to ``layout`` once if it is not in it."""
        if var not in self.codes:
            p = self.qparams(var)
            value = relax.op.quantize(self.visit_expr(var), relax.const(float(p.scale), "float32"),
                                      relax.const(int(p.zero_point), "int32"), axis=0, out_dtype="uint8")
            self.codes[var] = {"NCHW": self._emit_like(value, var, "_u8")}
            self.quantize_ops += 1
        have = self.codes[var]
        if layout is None:
            return have.get(BLOCKED_LAYOUT, have.get("NCHW"))
        if layout not in have:
            suffix = "_u8" if layout == "NCHW" else "_u8_nchw16c"
            have[layout] = self._emit_like(relayout(self.builder_, next(iter(have.values())), var.ty.shape, layout),
                                           var, suffix)
            self.layout_transforms += 1
        return have[layout]

    def _pool_codes(self, binding) -> None:
        """A max-pool of codes (:func:`.codes.uint8_pools`): NCHW16c codes pooled blocked by the blocked
        pool kernel (its padding, the dtype's minimum, is code 0 too), NCHW codes by the Relax op."""
        pool, var = binding.value, binding.var
        codes = self._codes_of(self.pools[var], None)
        a = pool.attrs
        if len(codes.ty.shape) == 5 and str(a.layout) == "NCHW" and str(a.out_layout) == "NCHW":
            n, _, h, w = (int(d) for d in var.ty.shape)  # padded channels: the codes' block count, not C // 16
            out_shape = [n, int(codes.ty.shape[1]), h, w, int(codes.ty.shape[4])]
            call = transform_call(self.builder_, lambda t: pool2d(t, "max", a.pool_size, a.strides, a.padding,
                                                                  a.dilation, a.ceil_mode),
                                  codes, out_shape, family=POOL_FAMILY, name="max_pool2d_codes")
            self.codes[var] = {BLOCKED_LAYOUT: self._emit_like(call, var, "_u8_nchw16c")}
        else:
            call = relax.Call(pool.op, [self._codes_of(self.pools[var])], pool.attrs)
            self.codes[var] = {"NCHW": self._emit_like(call, var, "_u8")}
        if var in self.dequantized:
            self._dequantize(var)

    def _dequantize(self, var) -> None:
        """Bind ``var`` (whose codes exist) to its float32 values, for the FP32 ops that read it."""
        codes, p = self._codes_of(var), self.qparams(var)
        value = relax.op.dequantize(codes, relax.const(float(p.scale), "float32"),
                                    relax.const(int(p.zero_point), "int32"), axis=0, out_dtype="float32")
        self.set_var_remap(var, self._emit_like(value, var))
        self.dequantize_ops += 1

    def _codes_kernel(self, var, kernel, name: str, inputs: list, shape: list) -> None:
        """Bind the codes of ``var`` to the call of ``kernel`` on ``inputs`` (codes first), in their layout."""
        gv = add_kernel(self.builder_, kernel, name)
        layout = BLOCKED_LAYOUT if len(shape) == 5 else "NCHW"
        call = relax.call_tir(gv, inputs, relax.TensorType(shape, "uint8"))
        self.codes[var] = {layout: self._emit_like(call, var, "_u8" if layout == "NCHW" else "_u8_nchw16c")}

    def _mean_codes(self, var) -> None:
        """The codes of a spatial mean (:func:`.codes.uint8_means`) from its input's codes."""
        x = self.means[var]
        codes = self._codes_of(x, None)
        px, pm = self.qparams(x), self.qparams(var)
        shape = [int(d) for d in codes.ty.shape]
        kernel = int8_se.mean_kernel(shape, int(px.zero_point), float(px.scale) / float(pm.scale), int(pm.zero_point))
        self._codes_kernel(var, kernel, "mean_codes", [codes], shape[:2] + [1, 1] + shape[4:])

    def _gate_codes(self, var) -> None:
        """The codes of a channel gate's product (:func:`.codes.uint8_gates`) from the codes of ``x`` and the gate."""
        x, gate = self.gates[var]
        codes = self._codes_of(x, None)
        px, pp = self.qparams(x), self.qparams(var)
        shape = [int(d) for d in codes.ty.shape]
        kernel = int8_se.gate_kernel(shape, int(gate.ty.shape[1]), int(px.zero_point),
                                     float(px.scale) / float(pp.scale), int(pp.zero_point))
        self._codes_kernel(var, kernel, "gate_codes", [codes, self.visit_expr(gate)], shape)

    def _concat_codes(self, var) -> None:
        """A channel concat's codes (:func:`.codes.uint8_concats`), NCHW16c where its inputs fill whole blocks."""
        parts, out = self.concats[var], self.qparams(var)
        whole = self.blocked and all(int(p.ty.shape[1]) % BLOCK_O == 0 for p in parts)
        codes = [self._codes_of(p, BLOCKED_LAYOUT if whole else "NCHW") for p in parts]
        params = [(int(q.zero_point), float(q.scale) / float(out.scale)) for q in map(self.qparams, parts)]
        shapes = [[int(d) for d in c.ty.shape] for c in codes]
        kernel, channels = int8_concat.concat_kernel(shapes, params, int(out.zero_point)), sum(s[1] for s in shapes)
        self._codes_kernel(var, kernel, "concat_codes", codes, [shapes[0][0], channels] + shapes[0][2:])

    def visit_var_binding_(self, binding):
        if binding.var in self.concats:
            self._concat_codes(binding.var)
            return
        if binding.var in self.pools:
            self._pool_codes(binding)
            return
        if binding.var in self.means:
            self._mean_codes(binding.var)
            return
        if binding.var in self.gates:
            self._gate_codes(binding.var)
            return
        if binding.var in self.tabled:
            return  # an op of a chain its INT8 kernel applies as a table
        site = self.sites.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        part, args = site.part, site.call.args
        out = self.qparams(site.var) if site.out_dtype == "uint8" else None
        res = self.qparams(args[part.residual]) if part.residual is not None else None
        data = self._codes_of(args[part.data], data_layout(part, self.blocked))
        kernel, constants = make_int8_kernel(part, data.ty.shape, self.qparams(args[part.data]), out, res,
                                             site.out_layout, self.weights, site.table, self.weight_bits)
        gv = add_kernel(self.builder_, kernel, site.composite.replace("tvmfuse.", "tvmfuse_int8_"))
        call_args = [data] + constants
        if part.residual is not None:
            call_args.append(self._codes_of(args[part.residual], site.out_layout))
        result = relax.call_tir(gv, call_args, relax.TensorType(kernel_out_shape(part, site.out_layout), site.out_dtype))
        if out is None:
            self.set_var_remap(binding.var, self._emit_like(result, binding.var))
            return
        suffix = "_u8" if site.out_layout == "NCHW" else "_u8_nchw16c"
        var = site.out_var
        self.codes[var] = {site.out_layout: self._emit_like(result, var, suffix)}
        if site.dequantize:
            self._dequantize(var)


def _check_constants(sites: list[_Site], table, keys: dict) -> None:
    """Keep FP32 the INT8 sites whose kernel cannot take the calibrated parameters (and say why)."""
    for site in sites:
        if site.part is None:
            continue
        try:
            x = activation_params(*table[_key_of(keys, site.call.args[site.part.data])])
            int8_constants(site.part, x, activation_params(*table[site.key]))
        except Int8KernelError as e:
            site.part, site.reason = None, str(e)


def _summary(sites: list[_Site], quantize_ops: int, dequantize_ops: int, layout_transforms: int = 0) -> dict:
    int8_sites = [s for s in sites if s.part is not None]
    return {"int8_partitions": len(int8_sites), "fp32_partitions": len(sites) - len(int8_sites),
            "fp32_reasons": [{"partition": s.composite, "tensor": s.key, "reason": s.reason}
                             for s in sites if s.part is None],
            "uint8_outputs": sum(s.out_dtype == "uint8" for s in int8_sites),
            "float32_outputs": sum(s.out_dtype == "float32" for s in int8_sites),
            "blocked_outputs": sum(s.out_layout != "NCHW" for s in int8_sites),
            "quantize_ops": quantize_ops, "dequantize_ops": dequantize_ops, "layout_transforms": layout_transforms,
            "table_outputs": sum(s.table is not None for s in int8_sites)}


def _why_nothing(sites: list[_Site]) -> str:
    if not sites:
        return "the model has no conv2d, depthwise conv2d or dense partition"
    reasons = "; ".join(f"{s.composite} -> {s.key}: {s.reason}" for s in sites[:5])
    return f"none of its {len(sites)} partition(s) has an INT8 kernel ({reasons}" + \
        ("; ..." if len(sites) > 5 else "") + ")"


def QuantizeGraph(table, spec: TargetSpec | None, report: dict | None = None,  # noqa: N802
                  blocked: bool = True, weight_bits: int | None = None) -> tvm.transform.Pass:
    """The quantization pass over a partitioned module.

    Parameters
    ----------
    table : CalibrationTable
        Calibrated ranges keyed like :func:`tvmfuse.quant.keys.observed_tensors` on this module.
    spec : TargetSpec or None
        The target (None: a CPU target). ``ScheduleKernels`` schedules the INT8 kernels for CPU targets after
        fusion; on other targets every partition stays FP32.
    report : dict, optional
        Receives ``int8_partitions``, ``fp32_partitions``, ``fp32_reasons`` (partition, tensor, reason),
        ``uint8_outputs`` / ``float32_outputs`` (INT8 partitions by output dtype), ``quantize_ops`` and
        ``dequantize_ops`` (inserted), ``uint8_pools`` / ``uint8_means`` / ``uint8_gates`` / ``uint8_concats``
        (max-pools, spatial means, channel gates and channel concats computed on codes), ``blocked_outputs``
        (INT8 partitions writing NCHW16c codes) and ``layout_transforms`` (uint8 NCHW <-> NCHW16c inserted).
    blocked : bool
        Keep uint8 activations NCHW16c between the INT8 kernels that have that form (default); False: every
        INT8 kernel reads and writes NCHW (the same integers, in another order).
    weight_bits : int, optional
        7 or 8: the conv and dense weights' codes ([-64, 64] or [-127, 127]); None: 7 where the target has no
        VNNI (its kernels then add product pairs in int16: ``kernels.weight_limit``), else 8.

    Warns
    -----
    QuantizeWarning
        When no partition can be quantized, naming why; the module is then returned unchanged (FP32).
    """

    check_weight_bits(weight_bits)

    @tvm.transform.module_pass(opt_level=0, name="QuantizeGraph")
    def _quantize(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        keys = {var: key for key, var in observed_tensors(mod)}
        sites = _find_sites(mod, table, keys)
        blocked_codes = codes_blocked(spec, blocked)
        if spec is not None and not spec.backend().int8_kernels:
            for site in sites:
                site.part, site.reason = None, f"target {spec.name} has no INT8 kernels (backend {spec.backend_name})"
        _check_constants(sites, table, keys)
        users = users_of(mod["main"])
        _attach_tables(mod, sites, users, table, keys)
        pools, means, gates, concats = ops_on_codes(mod, sites, users)
        codes_ops = pools | means | gates | concats
        int8_vars = {s.var for s in sites if s.part is not None} | set(codes_ops)  # what reads codes
        _choose_outputs(sites, users, int8_vars, gates)
        if blocked_codes:
            _choose_layouts(sites, users, codes_ops)
        if not any(s.part is not None for s in sites):
            if report is not None:
                report.update(_summary(sites, 0, 0))
            warnings.warn(f"QuantizeGraph: nothing to quantize, the model stays FP32: {_why_nothing(sites)}",
                          QuantizeWarning, stacklevel=2)
            return mod
        dequantized = {p for p in pools if float_read(p, users, int8_vars)}
        rewrite = _Rewrite(mod, sites, table, keys, pools, blocked_codes, weight_packing(spec), means, gates, dequantized,
                           weight_bits, concats)
        gv = mod.get_global_var("main")
        rewrite.builder_.update_func(gv, rewrite.visit_expr(mod["main"]))
        if report is not None:
            report.update(_summary(sites, rewrite.quantize_ops, rewrite.dequantize_ops, rewrite.layout_transforms),
                          uint8_pools=len(pools), uint8_means=len(means), uint8_gates=len(gates),
                          uint8_concats=len(concats))
        return relax.transform.DeadCodeElimination()(rewrite.builder_.get())

    return _quantize
