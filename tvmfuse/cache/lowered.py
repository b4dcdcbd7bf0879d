"""Lowered kernels reused: the fused PrimFunc a partition becomes (``passes.lower.make_kernel``) and how its
arguments are laid out.

Lowering interprets the partition's Relax body into TE computes and makes a PrimFunc of them in Python: 1-7 ms a
kernel, 0.1-0.5 s of a model whose kernels all come from the object cache (YOLOv8n: 0.48 s of the 3.2 s a
one-layer change cost). The result depends only on the partition function (its ops, attributes, shapes and
small constants: the weights are arguments), the target and the activation blocks asked for, so it is stored
under a key of those (the function's TVM JSON, which is a few KB where the kernel's is tens) and the versions
(tvmfuse's source digest among them). A stored entry is the kernel's JSON and its
:class:`~tvmfuse.schedules.computes.packing.KernelLayout`; one that does not parse is a miss.
"""

from __future__ import annotations

import hashlib
import json

from . import fingerprint
from .kernels import content
from .store import Store

FORMAT = "lowered-kernel-1"
CHAIN_FORMAT = "lowered-kernel-content-1"


def lowered_key(fn, target, blocks) -> str:
    """The key of partition function ``fn`` lowered for ``target`` with activation ``blocks``."""
    # None (an NCHW kernel) and {} (a blocked one with no blocked input) lower differently
    shown = "None" if blocks is None else repr(sorted(blocks.items()))
    material = "\n".join([FORMAT, fingerprint.versions(), str(target), shown, content(fn)])
    return hashlib.sha256(material.encode()).hexdigest()


def _layout_json(layout) -> dict:
    return {"weights": {str(k): list(v) for k, v in layout.weights.items()},
            "activations": {str(k): int(v) for k, v in layout.activations.items()},
            "out_block": layout.out_block, "plain_out": bool(layout.plain_out)}


def _layout(data: dict):
    from tvmfuse.schedules.computes.packing import KernelLayout

    weights = {int(k): (str(v[0]), *(int(b) for b in v[1:])) for k, v in data["weights"].items()}
    activations = {int(k): int(v) for k, v in data["activations"].items()}
    out_block = data["out_block"]
    return KernelLayout(weights, activations, None if out_block is None else int(out_block), bool(data["plain_out"]))


class LoweredKernels:
    """``make(fn, spec, blocks)`` as ``make_kernel(fn, spec, schedule=False, blocks=blocks)`` is, through ``store``;
    ``hits`` and ``misses`` count this compile's lookups. Without a store (the cache off) ``maker`` and ``keys``
    are None: lowering and keys as without this level."""

    def __init__(self, store: Store | None, target):
        self.store, self.target = store, target
        self.hits = self.misses = 0
        # each kernel made -> its key, which the later keys chain from
        self.keys: dict | None = {} if store is not None else None

    @property
    def maker(self):
        return self.make if self.store is not None else None

    def make(self, fn, spec, blocks=None):
        import tvm
        from tvm_ffi.serialization import from_json_graph_str  # see cache.schedules: load_json is slower

        from tvmfuse.passes.lower import make_kernel

        key = lowered_key(fn, self.target, blocks)
        data = self.store.get(key)
        if data is not None:
            try:
                entry = json.loads(data)
                found = from_json_graph_str(entry["func"]), _layout(entry["layout"])
            except Exception:  # noqa: BLE001 - any entry that does not parse (TVM's parser raises its own errors)
                found = None
            if found is not None:
                self.hits += 1
                self.keys[found[0]] = self._chain_key(found[0])
                return found
        self.misses += 1
        func, layout = make_kernel(fn, spec, schedule=False, blocks=blocks)
        self.store.put(key, json.dumps({"func": tvm.ir.save_json(func), "layout": _layout_json(layout)}).encode())
        self.keys[func] = self._chain_key(func)
        return func, layout

    def _chain_key(self, func) -> str:
        """The key the later keys chain from: of the kernel made, not of the partition it came from. Two
        partitions can make the same kernel (the module keeps the first: Relax's builder dedups), and which
        came first changes with the model: a key of the partition then missed for a kernel built before."""
        import tvm_ffi

        # TVM's 64-bit structural hash of the kernel (names aside): what MetaSchedule files workloads under too
        material = "\n".join([CHAIN_FORMAT, fingerprint.versions(), str(self.target),
                              str(tvm_ffi.structural_hash(func))])
        return hashlib.sha256(material.encode()).hexdigest()

    def log(self) -> None:
        if self.store is not None and (self.hits or self.misses):
            self.store.log_run("lowered", self.hits, self.misses)
