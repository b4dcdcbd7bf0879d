"""The kernel cache: built kernels (and whole builds) stored on disk and reused by later compiles.

``compile``/``quantize`` take ``cache``: None for the default (``$TVMFUSE_CACHE_DIR`` or
``~/.cache/tvmfuse/kernels``; off when ``$TVMFUSE_NO_CACHE`` is set), False for none, or a folder. The CLI's
``--cache-dir DIR`` and ``--no-cache`` set those variables for everything the command runs (tuning workers,
``compare``'s arms). :mod:`.kernels` builds and reuses kernel objects, :mod:`.models` whole builds,
:mod:`.store` keeps the entries; :mod:`.schedules` and :mod:`.lowered` the kernels' scheduled and lowered forms.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .lowered import LoweredKernels  # noqa: F401
from .store import DIR_ENV, OFF_ENV, CacheError, Store, default_dir  # noqa: F401

_STORES: dict[Path, Store] = {}
_LOCK = threading.Lock()


def disabled_by_env() -> bool:
    return os.environ.get(OFF_ENV, "").strip() not in ("", "0")


def resolve(cache=None) -> Store | None:
    """The store ``cache`` names (see the module doc; a Store is itself), or None when caching is off."""
    if isinstance(cache, Store):
        return cache
    if cache is False or (cache is None and disabled_by_env()):
        return None
    if cache is None or cache is True:
        root = default_dir()
    elif isinstance(cache, (str, os.PathLike)):
        root = Path(cache).expanduser()
    else:
        raise CacheError(f"cache must be None, True, False or a folder, got {type(cache).__name__}")
    root = root.absolute()
    with _LOCK:
        store = _STORES.get(root)
        if store is None or not root.is_dir():
            store = _STORES[root] = Store(root)
    return store
