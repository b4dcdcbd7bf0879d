"""Ops on uint8 codes between INT8 kernels: which max-pools, spatial means and channel gates of an INT8
region ``QuantizeGraph`` computes on codes instead of dequantizing around them.

Each finder returns ``{var: what it reads}`` for the ops it takes; ``QuantizeGraph`` then counts them as
INT8 readers (their producer writes codes) and emits them on codes in the codes' layout (the max-pool by the
blocked pool kernel, or the Relax op on NCHW codes; the mean and the gate by the kernels of
``schedules.int8_se``).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..utils import bindings_of, op_name


def _int8_vars(sites) -> tuple[set, list]:
    """The INT8 sites' result vars, and the vars whose codes they write (a tabled chain's end)."""
    return {s.var for s in sites if s.part is not None}, [s.out_var for s in sites if s.part is not None]


def uint8_pools(mod: tvm.IRModule, sites: list, users: dict, codes_readers: frozenset = frozenset()) -> dict:
    """Max-pools that pool uint8 codes instead: pool var -> the INT8 site it reads.

    Eligible when the pool reads an INT8 partition's output and either only INT8 partitions read the pool, or
    the pool shrinks the map (a stride above 1) and :func:`float_read` readers get the pooled codes
    dequantized. Max commutes with the monotonic quantization, and the code 0 the pool pads with is at most
    every real code, so pooling the codes is exact. It saves the float pass: the producer writes uint8
    instead of float32 and the pool reads a quarter of the bytes, with no quantize after it (or a dequantize
    of the smaller pooled map: a classifier's last conv, 2x2 max-pool and global mean). The pooled codes
    keep their input's quantization parameters. ``codes_readers``: ops on codes that count as INT8 readers
    (the concats of :func:`uint8_concats`).
    """
    int8, _ = _int8_vars(sites)
    int8 = int8 | set(codes_readers)
    pools = {}
    for binding in bindings_of(mod["main"]):
        value = binding.value
        if op_name(value) == "relax.nn.max_pool2d" and value.args[0] in int8:
            readers = users.get(binding.var, [])
            shrinks = any(int(s) > 1 for s in value.attrs.strides)
            if readers and (shrinks or all(r in int8 for r in readers)):
                pools[binding.var] = value.args[0]
    return pools


def float_read(var, users: dict, int8_vars: set) -> bool:
    """Whether anything but an INT8 site reads ``var`` (an FP32 op, or the function's result)."""
    return any(r is None or r not in int8_vars for r in users.get(var, []))


def uint8_means(mod: tvm.IRModule, sites: list, users: dict) -> dict:
    """Spatial means (``mean`` over H and W with ``keepdims``, squeeze-and-excitation's pooling) computed on
    uint8 codes: mean var -> the INT8 site output it reads.

    Eligible when the mean reads an INT8 site's NCHW output and only INT8 sites read the mean. The mean of
    the codes, requantized to the mean's own parameters, is the float path's ``quantize(mean(dequantize))``
    up to float rounding; it reads a quarter of the bytes, in whichever layout the codes are, and the
    producer writes no float tensor for it.
    """
    int8, outputs = _int8_vars(sites)
    means = {}
    for binding in bindings_of(mod["main"]):
        value = binding.value
        if op_name(value) != "relax.mean" or not value.attrs.keepdims or value.attrs.axis is None:
            continue
        x = value.args[0]
        shape = getattr(x.ty, "shape", None)
        if shape is None or len(shape) != 4 or sorted(int(a) % 4 for a in value.attrs.axis) != [2, 3]:
            continue
        readers = users.get(binding.var, [])
        if readers and all(r in int8 for r in readers) and any(x.same_as(v) for v in outputs):
            means[binding.var] = x
    return means


def channel_gate(gate, product) -> bool:
    """Whether ``gate`` is a float32 ``[N, C, 1, 1]`` tensor scaling the channels of ``product``."""
    shape, out = (getattr(getattr(e, "ty", None), "shape", None) for e in (gate, product))
    if shape is None or out is None or len(shape) != 4 or len(out) != 4 or str(gate.ty.dtype) != "float32":
        return False
    dims, out_dims = ([int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in list(e)] for e in (shape, out))
    return dims[2:] == [1, 1] and None not in out_dims and dims[:2] == out_dims[:2]


def uint8_gates(mod: tvm.IRModule, sites: list, users: dict) -> dict:
    """Channel gates (``x * gate``: squeeze-and-excitation's product) computed on uint8 codes: product var ->
    ``(x, gate)``.

    Eligible when ``x`` is an INT8 site's output of the product's shape, ``gate`` a float32 ``[N, C, 1, 1]``
    tensor (:func:`channel_gate`) and only INT8 sites read the product. One kernel maps the codes of ``x``
    to those of the product (``schedules.int8_se.gate_codes``), in their layout: ``x``'s producer writes no
    float tensor, and no float multiply and quantize run.
    """
    int8, outputs = _int8_vars(sites)
    gates = {}
    for binding in bindings_of(mod["main"]):
        value, product = binding.value, binding.var
        if op_name(value) != "relax.multiply":
            continue
        readers = users.get(product, [])
        if not readers or not all(r in int8 for r in readers):
            continue
        for x, gate in (tuple(value.args), tuple(reversed(value.args))):
            if any(x.same_as(v) for v in outputs) and channel_gate(gate, product) \
                    and [int(d) for d in x.ty.shape] == [int(d) for d in product.ty.shape]:
                gates[product] = (x, gate)
                break
    return gates


def _pool_candidates(mod: tvm.IRModule, int8: set) -> set:
    """Max-pools that read an INT8 site's output (what :func:`uint8_pools` may put on codes)."""
    return {b.var for b in bindings_of(mod["main"]) if op_name(b.value) == "relax.nn.max_pool2d"
            and b.value.args[0] in int8}


def uint8_concats(mod: tvm.IRModule, sites: list, users: dict) -> dict:
    """Channel concats of codes: concat var -> its inputs (vars).

    Eligible when the concat joins 4-D tensors along axis 1, each an INT8 site's output or a max-pool of one
    (which then pools codes: the concat reads it as an INT8 reader would), and only INT8 sites read it. One
    kernel requantizes each input's codes to the concat's parameters and writes the concat's codes
    (``schedules.int8_concat``): the producers write uint8 instead of float32, and no dequantize, float concat
    and quantize run (PP-HGNet's stem block, CSP and FPN concats of conv outputs).
    """
    int8, outputs = _int8_vars(sites)
    pooled = _pool_candidates(mod, int8)
    concats = {}
    for binding in bindings_of(mod["main"]):
        value = binding.value
        if op_name(value) != "relax.concat" or not isinstance(value.args[0], relax.Tuple):
            continue
        parts = list(value.args[0].fields)
        shape = getattr(binding.var.ty, "shape", None)
        if shape is None or len(shape) != 4 or int(value.attrs.axis) % 4 != 1:
            continue
        readers = users.get(binding.var, [])
        codes = all(isinstance(p, relax.Var) and (p in pooled or any(p.same_as(o) for o in outputs)) for p in parts)
        if codes and readers and all(r in int8 for r in readers):
            concats[binding.var] = parts
    return concats


def ops_on_codes(mod: tvm.IRModule, sites: list, users: dict) -> tuple[dict, dict, dict, dict]:
    """The max-pools, means, gates and concats ``QuantizeGraph`` computes on codes (the finders above); a concat
    keeps its place only where the pools it reads do."""
    concats = uint8_concats(mod, sites, users)
    pools = uint8_pools(mod, sites, users, frozenset(concats))
    produced = {s.out_var for s in sites if s.part is not None} | set(pools)
    concats = {v: parts for v, parts in concats.items() if all(p in produced for p in parts)}
    return pools, uint8_means(mod, sites, users), uint8_gates(mod, sites, users), concats
