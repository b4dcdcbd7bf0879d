"""Build a lowered Relax module's kernels one object file each, reusing those the store already holds.

TVM builds every PrimFunc of a module into one LLVM module; here each kernel is built alone (on the CPU
targets: ``tirx.build`` of a one-function module, its machine code emitted to an object file) and the
objects are linked into the VM executable as static libraries, as TVM links external code. An object is
stored under a key of everything that decides its machine code: the scheduled kernel itself (its serialized
TIR, the name included, which the object's symbol is), the target with its CPU and features, the pass
context's options, and the versions of tvmfuse (its source digest), TVM, tvm-ffi and LLVM. A kernel whose key
is stored is not built again; the others are built on a thread per core (TVM's build releases the GIL).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import fingerprint
from .store import Store

FORMAT = "kernel-object-1"


@dataclass
class KernelStats:
    """What a build found: kernels in all, and how many came from the store."""

    kernels: int = 0
    from_cache: int = 0

    @property
    def built(self) -> int:
        return self.kernels - self.from_cache

    def to_json(self) -> dict:
        return {"kernels": self.kernels, "from_cache": self.from_cache}


def cacheable(target) -> bool:
    """Whether kernels for ``target`` are built one object each (the CPU targets: LLVM objects)."""
    return str(target.kind.name) == "llvm"


_VARS = frozenset({"ir.Var", "relax.expr.Var", "relax.expr.DataflowVar"})
_BLOCK = "s_tir.SBlock"  # the type key of a TIR block in TVM 0.27
# A Relax value's number in a block name TVM's legalization gave (``lv1335_red``): it moves with every layer
# before the kernel, like the variable names
_VALUE_NUMBER = re.compile(r"(?<![A-Za-z0-9])lv\d+")


def unnamed_json(node, block_numbers: bool = False) -> str:
    """``node``'s TVM JSON without its variables' names. Relax names number the graph's values (``lv24``), and
    TVM's fusion names a kernel's parameters after them: a changed layer renamed every value after it. The
    variables stay told apart by their place in the graph; attributes (a kernel's ``global_symbol``) stay.
    ``block_numbers``: blocks' names lose those value numbers too (``lv1335_red`` -> ``lv_red``), for keys
    where a block's name cannot change the code: a kernel already scheduled, or one no tuning record is filed
    for (a record's trace finds its blocks by name; tvmfuse's rules and dlight find theirs by names that carry
    no value number, or by structure)."""
    import tvm

    graph = json.loads(tvm.ir.save_json(node))
    nodes = graph["nodes"]

    def string(index):
        ok = isinstance(index, int) and 0 <= index < len(nodes) and nodes[index].get("type") == "ffi.String"
        return nodes[index] if ok else None

    for item in nodes:
        data = item.get("data")
        if not isinstance(data, dict):
            continue
        if item.get("type") in _VARS:
            name = string(data.get("name"))
            if name is not None:
                name["data"] = ""  # the name's own node (a string node may be shared: blank, not removed)
            data["name"] = None
        elif block_numbers and item.get("type") == _BLOCK:
            name = string(data.get("name_hint"))
            if name is not None and isinstance(name["data"], str):
                name["data"] = _VALUE_NUMBER.sub("lv", name["data"])
    return json.dumps(graph, sort_keys=True)


def content(node, block_numbers: bool = False) -> str:
    """What a key holds of ``node``: :func:`unnamed_json`, with TVM's structural hash, which also ignores names
    and tells apart whatever a blanked name shared a string node with."""
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(node)}\n{unnamed_json(node, block_numbers)}"


def kernel_key(func, target, context: str, *extra: str, fmt: str = FORMAT, block_numbers: bool = True) -> str:
    """The key of what ``func`` becomes for ``target`` under pass options ``context`` (:func:`pass_options`):
    ``fmt`` names the kind of entry, ``extra`` adds what else decides it (a scheduled kernel's tuning records).
    Variable names are left out (:func:`unnamed_json`): they change no instruction, only the parameter names an
    argument check's message quotes, so an entry keyed by another model's names may quote those; so are the
    value numbers in block names where ``block_numbers`` (an object's key: ``func`` is scheduled)."""
    material = "\n".join([fmt, fingerprint.versions(), str(target), context, *extra, content(func, block_numbers)])
    return hashlib.sha256(material.encode()).hexdigest()


def derived_key(known: dict | None, func, *extra: str, fmt: str = FORMAT) -> str | None:
    """A key chained from the key of what ``func`` was made from (``known[func]``: the lowered kernel's for its
    schedule, the schedule's for its object), without serializing ``func``; None when ``func`` is not the very
    object that key was recorded for (a pass made another since: its own key is computed from its JSON)."""
    source = known.get(func) if known else None
    if source is None:
        return None
    material = "\n".join([fmt, "derived", fingerprint.versions(), *extra, source])
    return hashlib.sha256(material.encode()).hexdigest()


def _scheduled_forms(known: dict | None, kernels: list) -> dict:
    """Kernel -> the key of its schedule, for the kernels the scheduling left as they are but for the symbol the
    build names them by (``global_symbol``, added after it): the same body, and equal without that attribute."""
    if not known:
        return {}
    import tvm_ffi

    by_body = {f.body: (f, key) for f, key in known.items()}
    out = {}
    for _, f in kernels:
        source = by_body.get(f.body)
        if source is not None and tvm_ffi.structural_equal(f.without_attr("global_symbol"),
                                                           source[0].without_attr("global_symbol")):
            out[f] = source[1]
    return out


def pass_options() -> str:
    """The pass context's options, which the TIR pipeline reads (opt level, config, passes on or off)."""
    import tvm

    ctx = tvm.transform.PassContext.current()
    config = sorted((str(k), str(v)) for k, v in ctx.config.items())
    return repr((int(ctx.opt_level), config, sorted(map(str, ctx.required_pass)), sorted(map(str, ctx.disabled_pass))))


def _object_path(index: int, workdir: Path) -> Path:
    """Kernel ``index``'s object file: named by its position, not its symbol, which fusion can make longer
    than a file name may be (an unrolled LSTM's 40 ``expand_dims`` in one name: ENAMETOOLONG)."""
    return workdir / f"kernel{index}.o"


def _build_one(gv, func, target, workdir: Path, index: int = 0, pipeline: str = "default") -> bytes:
    """Build one kernel to its object file in ``workdir`` (:func:`_object_path`) with the TIR ``pipeline``
    (the backend's ``tir_pipeline``); return the file's bytes."""
    import tvm

    with target:
        lib = tvm.tirx.build(tvm.IRModule({gv: func}), target=target, pipeline=pipeline)
    path = _object_path(index, workdir)
    lib.write_to_file(str(path))
    return path.read_bytes()


def _threads() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def build_executable(lowered, target, store: Store | None, known: dict | None = None, pipeline: str = "default"):
    """The VM executable of ``lowered`` (after the Relax pipeline) and its :class:`KernelStats`; must run
    inside the target and pass context of the build. ``store`` None builds every kernel (nothing stored).
    ``known``: scheduled kernel -> its schedule key (:func:`derived_key`). ``pipeline``: the TIR pipeline's
    name (the backend's ``tir_pipeline``), part of every object's key."""
    import tvm
    from tvm import relax
    from tvm.relax import vm_build

    attrs = dict(lowered.attrs) if lowered.attrs else {}
    ext_libs = list(attrs.get("external_mods", []))
    params = dict(attrs.get("const_name_to_constant", {}))
    kernels = [(gv, f) for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    context = pass_options() + pipeline
    keys: list[str] = []  # no store: nothing to look up or keep
    objects: list[bytes | None] = [None] * len(kernels)
    if store is not None:
        scheduled = _scheduled_forms(known, kernels)
        keys = [derived_key(scheduled, f, str(target), context, gv.name_hint) or kernel_key(f, target, context)
                for gv, f in kernels]
        objects = [store.get(k) for k in keys]
    stats = KernelStats(len(kernels), sum(o is not None for o in objects))
    with tempfile.TemporaryDirectory(prefix="tvmfuse-kernels-") as tmp:
        workdir = Path(tmp)
        todo = [i for i, o in enumerate(objects) if o is None]
        ctx = tvm.transform.PassContext.current()

        def build(i):
            with ctx:  # a worker thread starts outside the caller's pass context
                return _build_one(kernels[i][0], kernels[i][1], target, workdir, i, pipeline)

        with ThreadPoolExecutor(min(_threads(), max(1, len(todo)))) as pool:
            # the kernels build (TVM releases the GIL) while this thread writes the cached objects and makes the
            # VM's bytecode (0.02-0.14 s): a changed layer's one kernel took 0.1 s of LLVM after them
            futures = [pool.submit(build, i) for i in todo]
            for i, data in enumerate(objects):
                if data is not None:  # from the cache: not on disk yet
                    _object_path(i, workdir).write_bytes(data)
            builder = relax.ExecBuilder()
            vm_build._vmcodegen(builder, lowered, "bytecode")
            for i, future in zip(todo, futures):
                objects[i] = future.result()
                if store is not None:
                    store.put(keys[i], objects[i])
        libs = [tvm.runtime.load_static_library(str(_object_path(i, workdir)), [gv.name_hint])  # read into memory
                for i, (gv, _) in enumerate(kernels)]
        executable = vm_build._vmlink(builder, target, None, ext_libs=libs + ext_libs, params=params)
    if store is not None:
        store.log_run("kernels", stats.from_cache, stats.built)
        store.evict()
    return executable, stats


def runnable(mod, target, store: Store | None, pipeline: str = "default"):
    """``mod`` (one scheduled PrimFunc) built into a runnable module in this process, its object reused from
    ``store`` or stored there (tuning's validation builds each task's default schedule again every round)."""
    import tvm
    from tvm.support import cc

    (gv, func), = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    key = kernel_key(func, target, pass_options() + pipeline)
    data = store.get(key) if store is not None else None
    with tempfile.TemporaryDirectory(prefix="tvmfuse-kernel-") as tmp:
        workdir = Path(tmp)
        obj, lib = _object_path(0, workdir), workdir / "kernel.so"
        if data is None:
            data = _build_one(gv, func, target, workdir, pipeline=pipeline)
            if store is not None:
                store.put(key, data)
        else:
            obj.write_bytes(data)
        cc.create_shared(str(lib), [str(obj)])
        return tvm.runtime.load_module(str(lib))
