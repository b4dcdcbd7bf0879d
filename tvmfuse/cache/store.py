"""A content-addressed store of built code on disk: one file per entry, private to the user.

An entry is ``<root>/<key[:2]>/<key>`` holding a header line (magic, payload size, payload sha256) and the
payload. Writes go to a temporary file in the same folder and are renamed into place, so a reader sees a
whole entry or none, whatever else compiles at the same time or is killed half-way. They are not synced to
the disk: what a crash of the machine leaves of an entry fails its checksum. A read checks size and
checksum; an entry that fails either is deleted and reported as a miss with one warning line (never loaded).
The store holds code that tvmfuse loads and runs, so its folder is created 0700 and a folder or entry other
users can write is refused. Least recently used entries (by modification time, refreshed on every hit) are
evicted when the total size passes the limit. That total is kept in a small file between scans of the folder
(:meth:`Store.evict`): a scan stats every entry, 0.28 s for a cache of 28,000 entries (3.3 GB), and every build
evicts.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
try:
    import fcntl
except ImportError:  # not a POSIX system: the usage file is updated unlocked (a lost update waits for the next scan)
    fcntl = None
import warnings
from pathlib import Path

from ..errors import TvmfuseError

MAGIC = b"tvmfuse-cache-1"
DIR_ENV, OFF_ENV, SIZE_ENV = "TVMFUSE_CACHE_DIR", "TVMFUSE_NO_CACHE", "TVMFUSE_CACHE_SIZE_MB"
DEFAULT_LIMIT_MB = 4096
RUNS_FILE = "runs.jsonl"  # one line per build: what it found in the store (for `tvmfuse cache info`)
RUNS_KEPT = 200
USAGE_FILE = "usage.json"  # the entries' total size at the last scan plus what builds wrote since, and its time
_BUFFERS = (bytes, bytearray, memoryview)  # a part put as it is; any other is a LibraryFile
SCAN_EVERY = 3600  # seconds: the folder is scanned at least this often (and temporary files of dead writers go)


class CacheError(TvmfuseError):
    """The cache folder cannot be used safely (owned by another user, writable by others, not a folder)."""


def default_dir() -> Path:
    """``$TVMFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvmfuse/kernels`` (``~/.cache/tvmfuse/kernels``)."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tvmfuse" / "kernels"


def _unsafe(st: os.stat_result) -> str:
    """Why a file or folder with this status must not be trusted ('' when it can)."""
    if st.st_uid != os.getuid():
        return f"owned by user id {st.st_uid}, not by this user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


class Store:
    """The entries under ``root`` (created 0700 when missing)."""

    def __init__(self, root: str | os.PathLike, limit_mb: int | None = None):
        self.root = Path(root).expanduser()
        if limit_mb is None:
            raw = os.environ.get(SIZE_ENV, "")
            try:
                limit_mb = int(raw) if raw else DEFAULT_LIMIT_MB
            except ValueError:
                raise CacheError(f"{SIZE_ENV}={raw!r} is not a whole number of megabytes") from None
        self.limit = max(0, limit_mb) * 2**20
        self._written = 0  # bytes put since the last evict(), added to the usage file there
        self._open()

    def _open(self) -> None:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.root.stat()
        except OSError as e:
            raise CacheError(f"cache folder {self.root}: {e.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise CacheError(f"cache folder {self.root} is not a folder")
        why = _unsafe(st)
        if why:
            raise CacheError(f"cache folder {self.root} is {why}: refusing to load code from it "
                             "(fix its owner or mode, or pick another with --cache-dir / TVMFUSE_CACHE_DIR)")

    def path(self, key: str) -> Path:
        return self.root / key[:2] / key

    # -- reading -------------------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``; None for a miss (absent, damaged, or not to be trusted)."""
        found = self.open(key)
        if found is None:
            return None
        fd, offset, size = found
        try:
            return os.pread(fd, size, offset)
        finally:
            os.close(fd)

    def open(self, key: str) -> tuple[int, int, int] | None:
        """(open descriptor, payload offset, payload size) of the entry under ``key``, its size and checksum
        checked (read in pieces: a 128 MB library is never one copy in memory); the caller closes the
        descriptor. None for a miss (absent, damaged, or not to be trusted)."""
        path = self.path(key)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return None
        except OSError as e:
            warnings.warn(f"kernel cache: cannot read {path} ({e.strerror}); building it again", stacklevel=3)
            return None
        with f:
            try:
                st = os.fstat(f.fileno())
                head = f.readline(256)
                digest = hashlib.file_digest(f, "sha256").hexdigest().encode()
            except OSError as e:
                warnings.warn(f"kernel cache: cannot read {path} ({e.strerror}); building it again", stacklevel=3)
                return None
            why = _unsafe(st)
            if why:
                warnings.warn(f"kernel cache: entry {path} is {why}: not loaded, building it again", stacklevel=3)
                self._discard(path)
                return None
            parts, size = head.split(), st.st_size - len(head)
            if len(parts) != 3 or parts[0] != MAGIC or parts[1] != str(size).encode() or parts[2] != digest:
                warnings.warn(f"kernel cache: entry {path} is damaged (size or checksum): building it again",
                              stacklevel=3)
                self._discard(path)
                return None
            try:
                os.utime(path)  # recently used: evicted last
            except OSError:
                pass
            return os.dup(f.fileno()), len(head), size

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass

    # -- writing -------------------------------------------------------------------------------------------
    def put(self, key: str, payload: bytes, *more) -> None:
        """Store ``payload`` (followed by ``more``: parts written in turn, not joined into one copy first; a part
        is bytes or a :class:`tvmfuse.library_file.LibraryFile`, copied inside the kernel) under ``key``
        atomically (a concurrent writer of the same key is harmless: both write the same content). A full or
        read-only disk only costs the entry, with a warning."""
        path = self.path(key)
        try:
            path.parent.mkdir(mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        except OSError as e:
            warnings.warn(f"kernel cache: cannot write in {path.parent} ({e.strerror}); not cached", stacklevel=2)
            return
        try:
            parts = (payload,) + more
            digest = hashlib.sha256()
            for part in parts:
                for piece in (part,) if isinstance(part, _BUFFERS) else part.chunks():
                    digest.update(piece)
            size = sum(len(p) if isinstance(p, _BUFFERS) else p.size for p in parts)
            head = b"%s %d %s\n" % (MAGIC, size, digest.hexdigest().encode())
            with os.fdopen(fd, "wb", buffering=0) as f:
                f.write(head)
                for part in parts:
                    if isinstance(part, _BUFFERS):
                        view = memoryview(part)
                        while len(view):
                            view = view[f.write(view):]
                    else:
                        part.send(f.fileno())
                # no fsync: an entry a crash of the machine leaves short or zeroed fails its checksum and is built
                # again (a cache needs no durability); each fsync cost 1-3 ms a kernel, 0.05 s for ResNet-50's build
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
            self._written += len(head) + size
        except OSError as e:
            warnings.warn(f"kernel cache: cannot write {path} ({e.strerror}); not cached", stacklevel=2)
            self._discard(Path(tmp))
        except BaseException:
            self._discard(Path(tmp))
            raise

    # -- upkeep --------------------------------------------------------------------------------------------
    def entries(self) -> list[tuple[Path, os.stat_result]]:
        out = []
        for sub in self.root.iterdir() if self.root.exists() else ():
            if sub.is_dir() and len(sub.name) == 2:
                for p in sub.iterdir():
                    if not p.name.startswith(".tmp-"):
                        try:
                            out.append((p, p.stat()))
                        except OSError:
                            pass
        return out

    def evict(self) -> int:
        """Delete least recently used entries until the store fits its limit (and temporary files of writers
        that died more than an hour ago); return how many entries went. The folder is scanned only when the
        total the last scan found, plus what builds wrote since (the usage file, updated under a lock by every
        process), passes the limit, or that scan is :data:`SCAN_EVERY` old: entries replaced count twice and a
        process's writes after its last evict not at all until then, both corrected by the next scan."""
        written, self._written = self._written, 0
        try:
            fd = os.open(self.root / USAGE_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return self._scan(time.time())[0]
        with os.fdopen(fd, "r+") as f:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_EX)  # released at close
            try:
                usage = json.loads(f.read() or "null")
                total, scanned = int(usage["bytes"]) + written, float(usage["scanned"])
            except (ValueError, TypeError, KeyError, OSError):
                total, scanned = None, 0.0
            now, gone = time.time(), 0
            if total is None or total > self.limit or not 0 <= now - scanned < SCAN_EVERY:
                (gone, total), scanned = self._scan(now), now
            try:
                f.seek(0)
                f.truncate()
                f.write(json.dumps({"bytes": total, "scanned": scanned}))
            except OSError:
                pass
        return gone

    def _scan(self, now: float) -> tuple[int, int]:
        """Evict as :meth:`evict` says from a listing of every entry; (entries deleted, bytes left)."""
        for sub in self.root.iterdir():
            if sub.is_dir() and len(sub.name) == 2:
                for p in sub.glob(".tmp-*"):
                    try:
                        if now - p.stat().st_mtime > SCAN_EVERY:
                            p.unlink()
                    except OSError:
                        pass
        items = sorted(self.entries(), key=lambda e: e[1].st_mtime)
        total, gone = sum(st.st_size for _, st in items), 0
        for p, st in items:
            if total <= self.limit:
                break
            self._discard(p)
            total -= st.st_size
            gone += 1
        return gone, total

    def clear(self) -> tuple[int, int]:
        """Delete every entry and the run log; return (entries, bytes) removed."""
        items = self.entries()
        for p, _ in items:
            self._discard(p)
        self._discard(self.root / RUNS_FILE)
        self._discard(self.root / USAGE_FILE)
        return len(items), sum(st.st_size for _, st in items)

    # -- what the last builds found ------------------------------------------------------------------------
    def log_run(self, kind: str, hits: int, misses: int) -> None:
        line = json.dumps({"time": round(time.time()), "kind": kind, "hits": hits, "misses": misses}) + "\n"
        path = self.root / RUNS_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:  # one short append: whole lines even with concurrent writers
                f.write(line)
            if path.stat().st_size > RUNS_KEPT * 200:
                lines = path.read_text().splitlines(keepends=True)[-RUNS_KEPT:]
                fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-runs-")
                with os.fdopen(fd, "w") as f:
                    f.writelines(lines)
                os.replace(tmp, path)
        except OSError:
            pass

    def runs(self) -> list[dict]:
        try:
            lines = (self.root / RUNS_FILE).read_text().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out
