"""``tvmfuse cache info`` and ``tvmfuse cache clear``, and the cache flags of the building commands."""

from __future__ import annotations

import contextlib
import os
import time

from .store import DIR_ENV, OFF_ENV, Store, default_dir


def add_flags(p) -> None:
    """``--cache-dir`` / ``--no-cache`` on a command that builds (compile, quantize, tune, compare)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--cache-dir", metavar="DIR", help=f"kernel cache folder (default ${DIR_ENV} or "
                       "~/.cache/tvmfuse/kernels)")
    group.add_argument("--no-cache", action="store_true", help="build every kernel, reuse and store nothing")


@contextlib.contextmanager
def flags_applied(args):
    """The command's cache flags as the environment (so tuning workers and compare's arms follow them), put
    back after (a caller of ``tvmfuse.cli.main`` goes on in Python)."""
    saved = {k: os.environ.get(k) for k in (DIR_ENV, OFF_ENV)}
    if getattr(args, "cache_dir", None):  # a folder named on the command line turns the cache on
        os.environ[DIR_ENV] = str(args.cache_dir)
        os.environ.pop(OFF_ENV, None)
    if getattr(args, "no_cache", False):
        os.environ[OFF_ENV] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def describe(info: dict) -> str:
    """A compile's one line on what came from the cache (``CompiledModel.cache_info``)."""
    if info.get("model") == "hit":
        return f"kernel cache: the whole build reused ({info['kernels']} kernels)"
    if info.get("model") == "off":
        return "kernel cache: off"
    return f"kernel cache: {info['from_cache']} of {info['kernels']} kernels reused, {info['kernels'] - info['from_cache']} built"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_cache(args) -> int:
    store = Store(args.cache_dir or default_dir())
    if args.action == "clear":
        entries, size = store.clear()
        print(f"removed {entries} entries ({_human(size)}) from {store.root}")
        return 0
    entries = store.entries()
    size = sum(st.st_size for _, st in entries)
    print(f"folder   {store.root}")
    print(f"entries  {len(entries)} ({_human(size)} of {_human(store.limit)}; least recently used evicted past it)")
    runs = store.runs()[-args.runs:] if args.runs > 0 else []
    for kind, label in (("kernels", "kernels "), ("schedules", "schedules"), ("lowered", "lowered  ")):
        kept = [r for r in runs if r.get("kind") == kind]
        hits, total = sum(r["hits"] for r in kept), sum(r["hits"] + r["misses"] for r in kept)
        if total:
            print(f"{label} {hits} of {total} reused over the last {len(kept)} builds ({100 * hits / total:.0f}%)")
    models = [r for r in runs if r.get("kind") == "model"]
    if models:
        reused = sum(r["hits"] for r in models)
        print(f"models   {reused} of {len(models)} whole builds reused")
    if runs:
        print(f"last run {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(runs[-1]['time']))}")
    else:
        print("no builds recorded yet")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="the kernel cache: what it holds and how often it was hit, or clear it")
    p.add_argument("action", choices=["info", "clear"])
    p.add_argument("--cache-dir", metavar="DIR", help=f"the cache folder (default ${DIR_ENV} or "
                   "~/.cache/tvmfuse/kernels)")
    p.add_argument("--runs", type=int, default=50, help="info: how many recent builds the hit rate covers (default 50)")
    p.set_defaults(func=cmd_cache)
