"""FuseQDQ's rewrite of ``main``: each matched chain becomes its INT8 kernel call, with the codes between
kernels NCHW16c where both ends have that form (as :mod:`.quantize` does for calibrated models).

A chain whose family has an NCHW16c kernel writes NCHW16c codes when another such chain reads them as its
data; the chain's original var (the model's ``quantize``) is then bound to their ``to_plain``, which dead-code
elimination drops unless an op outside the chains (a float residual add, a pool, a model output) reads it.
A kernel that repacks its input (conv2d) reads whatever layout its producer wrote; the others read NCHW16c,
transformed once where the producer is NCHW. A residual is read in its kernel's output layout. A max-pool of
codes (:mod:`.qdq_after`) pools NCHW16c codes where its input has them, and so do the means and channel
gates of codes.
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvmfuse.schedules.computes.int8 import BLOCK_O, BLOCKED_LAYOUT

from tvmfuse.schedules.computes import int8_concat, int8_se
from tvmfuse.schedules.computes.blocked import pool2d

from .qdq_after import CodeConcat, CodePool
from .kernels import blocked_kernel, data_layout, kernel_out_shape, make_int8_kernel, relayout
from ..layout import POOL_FAMILY, transform_call
from ..utils import add_kernel, emit_like

SHIFT = 128  # int8 code + 128 = the uint8 code of the same value, with zero point + 128


def choose_layouts(chains: dict, on_codes: dict | None = None) -> dict:
    """Chain end var -> its output layout: NCHW16c where a chain with an NCHW16c kernel reads it as data,
    directly or through ops on codes (``on_codes``: :func:`.qdq_after.ops_on_codes`'s, in binding order), or as
    the residual of a chain that writes NCHW16c."""
    on_codes = on_codes or {}
    blockable = {end for end, chain in chains.items() if blocked_kernel(chain.part)}
    read_blocked = {chain.data for end, chain in chains.items() if end in blockable}
    for end in reversed(list(on_codes)):  # an op's blocked reader wants the op's inputs blocked too
        if end in read_blocked and _blocked_inputs(on_codes[end]):
            read_blocked.update(on_codes[end].inputs)
    layouts = {end: BLOCKED_LAYOUT if end in blockable and end in read_blocked else "NCHW" for end in chains}
    changed = True
    while changed:  # a residual is read in its reader's output layout
        changed = False
        for end, chain in chains.items():
            r = chain.residual
            if layouts[end] != "NCHW" and r in blockable and layouts[r] == "NCHW":
                layouts[r], changed = BLOCKED_LAYOUT, True
    return layouts


def _blocked_inputs(found) -> bool:
    """Whether an op on codes can read NCHW16c: a concat only where every input fills whole blocks."""
    return not isinstance(found, CodeConcat) or all(int(p.ty.shape[1]) % BLOCK_O == 0 for p in found.parts)


@relax.expr_functor.mutator
class Rewrite(relax.PyExprMutator):
    """Binds each chain's quantize var to its kernel call (or to the ``to_plain`` of its NCHW16c codes); the
    float chain is left dead for DCE."""

    def __init__(self, mod: tvm.IRModule, chains: dict, layouts: dict | None, weights: str = "",
                 on_codes: dict | None = None):
        """``layouts``: :func:`choose_layouts`'s; None keeps every kernel NCHW. ``weights``: the target's weight
        packing (``make_int8_kernel``'s). ``on_codes``: the max-pools, means, gates and concats of codes
        (:func:`.qdq_after.ops_on_codes`), by the var of their quantize."""
        super().__init__(mod)
        self.chains, self.layouts, self.weights, self.on_codes = chains, layouts, weights, on_codes or {}
        self.blocked: dict = {}  # var -> its codes in NCHW16c
        self.shifted: dict = {}

    def visit_dataflow_block_(self, block):
        # Shifted and transformed codes are DataflowVars of the block they were emitted in.
        self.shifted = {}
        self.blocked = {k: v for k, v in self.blocked.items() if not isinstance(v, relax.DataflowVar)}
        return super().visit_dataflow_block_(block)

    def _codes(self, var, layout: str | None):
        """``var``'s codes in ``layout`` (None: NCHW16c where they exist, else NCHW)."""
        if layout is None:
            return self.blocked.get(var, self.visit_expr(var))
        if layout == "NCHW":
            return self.visit_expr(var)
        if var not in self.blocked:
            self.blocked[var] = emit_like(self.builder_, relayout(self.builder_, self.visit_expr(var), var.ty.shape,
                                                                  BLOCKED_LAYOUT), var, "_nchw16c")
        return self.blocked[var]

    def _uint8(self, codes, dtype: str):
        """``codes`` as uint8: themselves, or int8 codes + 128 (emitted once per block)."""
        if dtype == "uint8":
            return codes
        if codes not in self.shifted:
            wide = self.builder_.emit(relax.op.astype(codes, "int16"), codes.name + "_i16")
            up = self.builder_.emit(relax.op.add(wide, relax.const(SHIFT, "int16")), codes.name + "_shift")
            self.shifted[codes] = self.builder_.emit(relax.op.astype(up, "uint8"), codes.name + "_u8")
        return self.shifted[codes]

    def _pool(self, binding, found) -> None:
        """Bind the quantize var of a max-pool of codes to the pool of its input's codes: NCHW16c ones by the
        blocked pool kernel (its padding, the dtype's minimum, is the least code too), NCHW ones by the op."""
        pool, a = found.pool, found.pool.attrs
        codes = self._codes(found.data, None if self.layouts is not None else "NCHW")
        if len(codes.ty.shape) == 4:
            self._emit_codes(binding, relax.Call(pool.op, [codes], a), [int(d) for d in binding.var.ty.shape])
            return
        n, _, h, w = (int(d) for d in binding.var.ty.shape)
        out_shape = [n, int(codes.ty.shape[1]), h, w, int(codes.ty.shape[4])]
        self._emit_codes(binding, transform_call(self.builder_, lambda t: pool2d(
            t, "max", a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode), codes, out_shape,
            family=POOL_FAMILY, name="max_pool2d_codes"), out_shape)

    def _concat(self, binding, found) -> None:
        """Bind the quantize var of a channel concat of codes to the concat kernel on its inputs' codes: NCHW16c
        ones where every input fills whole blocks and the codes are blocked, else NCHW."""
        layout = BLOCKED_LAYOUT if self.layouts is not None and _blocked_inputs(found) else "NCHW"
        codes = [self._codes(part, layout) for part in found.parts]
        shapes = [[int(d) for d in c.ty.shape] for c in codes]
        params = [(int(p.zero_point), float(p.scale) / float(found.out.scale)) for p in found.params]
        kernel = int8_concat.concat_kernel(shapes, params, int(found.out.zero_point))
        out_shape = [shapes[0][0], sum(s[1] for s in shapes)] + shapes[0][2:]
        self._emit_codes(binding, relax.call_tir(add_kernel(self.builder_, kernel, "concat_codes"), codes,
                                                 relax.TensorType(out_shape, "uint8")), out_shape)

    def _emit_codes(self, binding, call, out_shape: list) -> None:
        """Bind ``binding.var`` to ``call``'s codes (of ``out_shape``): directly when NCHW; NCHW16c ones kept for
        the readers that take them, the var bound to their ``to_plain`` (dead-code elimination drops it where none
        reads it)."""
        if len(out_shape) == 4:
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(call)))
            return
        self.blocked[binding.var] = blocked = emit_like(self.builder_, call, binding.var, "_nchw16c")
        plain = relayout(self.builder_, blocked, binding.var.ty.shape, "NCHW")
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(plain)))

    def _squeeze(self, binding, found) -> None:
        """Bind the quantize var of a spatial mean or channel gate of codes to its kernel on the input's codes
        (:mod:`tvmfuse.schedules.computes.int8_se`), in their layout."""
        codes = self._codes(found.data, None if self.layouts is not None else "NCHW")
        shape = [int(d) for d in codes.ty.shape]
        x, out = found.params, found.out
        ratio = float(x.scale) / float(out.scale)
        if found.gate is None:
            kernel, name = int8_se.mean_kernel(shape, int(x.zero_point), ratio, int(out.zero_point)), "mean_codes"
            args, out_shape = [codes], shape[:2] + [1, 1] + shape[4:]
        else:
            kernel = int8_se.gate_kernel(shape, int(found.gate.ty.shape[1]), int(x.zero_point), ratio,
                                         int(out.zero_point))
            name, args, out_shape = "gate_codes", [codes, self.visit_expr(found.gate)], shape
        self._emit_codes(binding, relax.call_tir(add_kernel(self.builder_, kernel, name), args,
                                                 relax.TensorType(out_shape, "uint8")), out_shape)

    def visit_var_binding_(self, binding):
        chain = self.chains.get(binding.var)
        if chain is None and binding.var in self.on_codes:
            found = self.on_codes[binding.var]
            visit = {CodePool: self._pool, CodeConcat: self._concat}.get(type(found), self._squeeze)
            visit(binding, found)
            return
        if chain is None:
            super().visit_var_binding_(binding)
            return
        layout = (self.layouts or {}).get(binding.var, "NCHW")
        data = self._uint8(self._codes(chain.data, data_layout(chain.part, self.layouts is not None)), chain.data_dtype)
        kernel, constants, out_type = chain.kernel, chain.constants, chain.out_type
        if len(data.ty.shape) == 5 or layout != "NCHW":
            kernel, constants = make_int8_kernel(chain.part, [int(d) for d in data.ty.shape], *chain.params,
                                                 out_layout=layout, weights=self.weights, table=chain.table)
            out_type = relax.TensorType(kernel_out_shape(chain.part, layout), out_type.dtype)
        args = [data] + constants
        if chain.residual is not None:
            args.append(self._codes(chain.residual, layout))
        gv = add_kernel(self.builder_, kernel, chain.name)
        call = relax.call_tir(gv, args, out_type)
        if layout == "NCHW":
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(call)))
            return
        self.blocked[binding.var] = codes = emit_like(self.builder_, call, binding.var, "_nchw16c")
        plain = relayout(self.builder_, codes, chain.part.out_shape, "NCHW")
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(plain)))
