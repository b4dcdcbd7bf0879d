"""CUDA device code reused kernel by kernel: a model with one changed layer runs nvcc's front end on that kernel.

TVM hands all of a module's kernels to nvcc as one source (``tvm_callback_cuda_compile``). nvcc's front end
(cicc: CUDA to PTX) is most of that run (YOLOv8n for sm_90: 10.7 of 12.1 s) and translates each
``__global__`` function on its own; ptxas (PTX to SASS) is the rest. So the source is split into its preamble
(includes, macros, helpers) and its kernels, and each kernel's PTX entry is stored under a key of the preamble,
its declaration and definition, the toolchain and the architecture. The kernels not found are translated to
PTX by nvcc with TVM's own options, split over the cores in a few sources of the preamble and some kernels
(cicc is single-threaded); then the module's PTX, every entry in the source's order, goes through ptxas and
fatbinary in one nvcc run. From PTX nvcc makes the very fatbin it makes from the source (tested byte for
byte), and the PTX is made of canonical entries (labels numbered as in a one-kernel source), so the same
kernels give the same binary whichever compile stored them.

Where the source or the PTX has another form than this expects (anything but kernels after the preamble,
module-scope PTX other than the dynamic shared memory's declaration, a kernel split in two entries) or the
build asks for what this does not do (NVRTC, NVSHMEM, a kernel dump or debug build), :func:`compile` returns
None and the caller compiles the source whole, as TVM does.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import tempfile

FORMAT = "cuda-ptx-1"
_KERNEL_LINE = 'extern "C" __global__ '
_NAME = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(')
_PTX_ENTRY = re.compile(r"^\.visible \.entry (\w+)\(")
_PTX_HEADER = (".version ", ".target ", ".address_size ")
_PTX_SHARED = re.compile(r"^\.extern \.shared [^;]*?(\w+)\[\];$")
_LABEL_INDEX = re.compile(r"(\$L__BB|__local_depot)(\d+)")
# Below this much source to translate, one nvcc run: a run's start and headers cost about 0.3 s
SPLIT_BYTES = 256 * 1024


def split_source(code: str):
    """``(preamble, [(name, declaration, definition)])`` of TVM's CUDA source, or None where it has another
    form: text other than the kernels' declarations and definitions after the preamble."""
    lines = code.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line.startswith(_KERNEL_LINE)), None)
    if first is None:
        return None
    declarations, kernels, current = {}, [], None
    for line in lines[first:]:
        if line.startswith(_KERNEL_LINE):
            head, name = line.rstrip(), _NAME.match(line)
            if name is None:
                return None
            if head.endswith(";") and current is None:
                declarations[name.group(1)] = line
                continue
            if not head.endswith("{"):
                return None
            current = [name.group(1), [line]]
            kernels.append(current)
        elif current is not None:
            current[1].append(line)
        elif line.strip():
            return None  # something between the declarations and the first definition
    out = []
    for name, body in kernels:
        text = "".join(body)
        if name not in declarations or not _one_body(text):
            return None
        out.append((name, declarations[name], text))
    if len({name for name, _, _ in out}) != len(out) or len(out) != len(declarations):
        return None
    return "".join(lines[:first]), out


def _one_body(text: str) -> bool:
    """Whether ``text`` is one function: its braces close for the first time at its end."""
    depth, end = 0, len(text.rstrip())
    for i, char in enumerate(text):
        if char in "{}":
            depth += 1 if char == "{" else -1
            if depth <= 0:
                return depth == 0 and i == end - 1
    return False


def split_ptx(ptx: str):
    """``(header lines, {name: shared declaration}, {entry name: text})`` of nvcc's PTX, or None where it holds
    module-scope code other than the dynamic shared memory's declaration (functions, globals, constants)."""
    header, shared, entries = [], {}, {}
    lines, i = ptx.splitlines(), 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("//"):
            continue
        if line.startswith(_PTX_HEADER):
            header.append(line)
            continue
        declared = _PTX_SHARED.match(line)
        if declared:
            shared[declared.group(1)] = line
            continue
        entry = _PTX_ENTRY.match(line)
        if entry is None:
            return None
        body, depth, opened = [lines[i - 1]], 0, False
        while i < len(lines):
            text = lines[i]
            body.append(text)
            i += 1
            code = text.split("//", 1)[0]
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if opened and depth == 0:
                break
        else:
            return None
        entries[entry.group(1)] = _canonical("\n".join(body))
    return header, shared, entries


def _canonical(entry: str) -> str:
    """The entry with its labels and local depot numbered 0 (they carry the function's index in its source)."""
    if len({m.group(2) for m in _LABEL_INDEX.finditer(entry)}) > 1:
        return entry
    return _LABEL_INDEX.sub(lambda m: m.group(1) + "0", entry)


def _gencode(arch: str) -> list[str] | None:
    """TVM's nvcc architecture options for a target's ``arch`` (``sm_90``), None for another form."""
    if not re.fullmatch(r"sm_\d+[a-z]?", arch):
        return None
    return ["-gencode", f"arch=compute_{arch[3:]},code=sm_{arch[3:]}"]


def supported(code: str) -> bool:
    """Whether a build of ``code`` may be made kernel by kernel: nvcc, no NVSHMEM, no dump or debug build."""
    import tvm

    from ..cuda_driver import compile_mode

    dump = "cuda.kernels_output_dir" in tvm.transform.PassContext.current().config
    return (compile_mode() == "nvcc" and "nvshmem" not in code and os.environ.get("TVM_KERNEL_DUMP") is None
            and os.environ.get("TVM_KERNEL_DEBUG", "0") != "1" and not dump)


def _groups(names: list, sizes: dict, parts: int) -> list[list]:
    """``names`` dealt into at most ``parts`` groups of about equal source size, largest first."""
    groups = [[] for _ in range(max(1, parts))]
    loads = [0] * len(groups)
    for name in sorted(names, key=lambda n: -sizes[n]):
        slot = loads.index(min(loads))
        groups[slot].append(name)
        loads[slot] += sizes[name]
    return [g for g in groups if g]


def _translate(preamble: str, kernels: list, order: dict, target):
    """PTX of the preamble and ``kernels`` ((name, declaration, definition), in source order), split; on a
    thread of its own, so under ``target`` again (TVM's nvcc reads the current target)."""
    from tvm.support import nvcc

    kernels = sorted(kernels, key=lambda k: order[k[0]])
    source = preamble + "".join(k[1] for k in kernels) + "".join(k[2] for k in kernels)
    with target:
        ptx = nvcc.compile_cuda(source, target_format="ptx", compiler="nvcc")
    return split_ptx(bytes(ptx).decode())


def _assemble(header: list, shared: dict, entries: list, arch_options: list) -> bytes:
    """The fatbin of the module made of ``entries`` (ptxas and fatbinary through nvcc, TVM's options)."""
    from tvm.support import nvcc

    text = "\n".join(header + list(shared.values()) + entries) + "\n"
    with tempfile.TemporaryDirectory(prefix="tvmfuse-ptx-") as folder:
        source, target = os.path.join(folder, "kernels.ptx"), os.path.join(folder, "kernels.fatbin")
        with open(source, "w") as f:
            f.write(text)
        cmd = ["nvcc", "--fatbin", "-O3", *arch_options,
               f"--ptxas-options={','.join(nvcc._ptxas_option_flags())}", "-o", target, source]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"ptxas failed on the kernels' PTX:\n{proc.stdout}{proc.stderr}")
        with open(target, "rb") as f:
            return f.read()


def compile(code: str, store, counts: dict, base_key: str, arch: str, cores: int) -> bytes | None:
    """The fatbin of TVM's CUDA source ``code``, its kernels' PTX taken from ``store`` where found and stored
    where made; None where the source or its PTX has another form (the caller compiles it whole).
    ``base_key``: what the keys share (format, versions, toolchain); ``counts`` gets the kernels found
    (``kernels_found``) and translated (``kernels_built``) by name."""
    import tvm

    target = tvm.target.Target.current(allow_none=True)
    arch_options = _gencode(arch)
    parts = split_source(code) if arch_options and target is not None and supported(code) else None
    if parts is None:
        return None
    preamble, kernels = parts
    keys = {name: hashlib.sha256("\n".join([FORMAT, base_key, arch, preamble, decl, body]).encode()).hexdigest()
            for name, decl, body in kernels}
    found, missing = {}, []
    for kernel in kernels:
        raw = store.get(keys[kernel[0]])
        entry = _parse_entry(raw)
        if entry is None:
            missing.append(kernel)
        else:
            found[kernel[0]] = entry
    if missing:
        order = {name: i for i, (name, _, _) in enumerate(kernels)}
        sizes = {name: len(body) for name, _, body in missing}
        total = sum(sizes.values())
        by_name = {k[0]: k for k in missing}
        groups = _groups(list(by_name), sizes, min(cores, -(-total // SPLIT_BYTES)))
        with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
            try:
                results = list(pool.map(lambda g: _translate(preamble, [by_name[n] for n in g], order, target),
                                        groups))
            except RuntimeError:  # a kernel that needs more than the preamble: nvcc on the whole says why
                return None
        for group, result in zip(groups, results):
            if result is None or set(result[2]) != set(group):
                return None  # module-scope PTX, or a kernel split in several entries
            header, shared, entries = result
            for name in group:
                needed = {k: v for k, v in shared.items() if k in entries[name]}
                found[name] = {"header": header, "shared": needed, "entry": entries[name]}
                store.put(keys[name], json.dumps(found[name], sort_keys=True).encode())
    headers = {json.dumps(e["header"]) for e in found.values()}
    shared: dict = {}
    for entry in found.values():
        for name, line in entry["shared"].items():
            if shared.setdefault(name, line) != line:
                return None  # one name declared two ways: leave it to nvcc
    if len(headers) != 1:
        return None
    try:
        binary = _assemble(json.loads(headers.pop()), shared, [found[n]["entry"] for n, _, _ in kernels],
                           arch_options)
    except RuntimeError:  # ptxas refused the module: nvcc on the whole source says why, or makes it
        return None
    built = {k[0] for k in missing}
    counts["kernels_found"] += [n for n, _, _ in kernels if n not in built]
    counts["kernels_built"] += sorted(built)
    return binary


def _parse_entry(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    ok = isinstance(entry, dict) and isinstance(entry.get("entry"), str) and isinstance(entry.get("header"), list)
    return entry if ok and isinstance(entry.get("shared"), dict) else None
