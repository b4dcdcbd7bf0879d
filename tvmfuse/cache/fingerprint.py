"""What a cache key must change with besides its content: the versions of the code that builds and runs it.

tvmfuse's own version string does not change with every edit of its source, and its source decides the
kernels (the schedules, the intrinsics it registers, the passes), so the key takes a digest of the installed
package's Python files: an edited or upgraded tvmfuse misses instead of loading code an older one built.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over the relative paths and contents of the ``.py`` files of tvmfuse and its schedules (a package
    of its own folder in a source checkout), computed once per process."""
    from .. import schedules

    h = hashlib.sha256()
    for root in sorted({Path(__file__).resolve().parents[1], Path(schedules.__file__).resolve().parent}):
        for path in sorted(root.rglob("*.py")):
            h.update(root.name.encode() + b"/" + path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def versions() -> str:
    """tvmfuse (version and source digest), TVM, tvm-ffi and LLVM, as one line."""
    import tvm
    import tvm_ffi
    from tvm.target import codegen

    from ..version import __version__

    return (f"tvmfuse {__version__} {source_digest()}; tvm {tvm.__version__}; tvm_ffi {tvm_ffi.__version__}; "
            f"llvm {codegen.llvm_version_major()}")
