"""A linked library held as an open file that has no name: one copy for run, export and the cache.

ResNet-50's library is 128 MB. Passed around as bytes it went through fresh process memory at every step: read
back after the link (0.1 s), written into the cache entry (0.25 s), written again by the export and by the
first run's load (0.25 s each), mostly page faults (about 2 us a 4 KiB page on a KVM guest). Held as a file,
each of those steps is a copy inside the kernel (``os.sendfile``: 0.03 s for 128 MB) and a stored build is
checked with one streamed checksum. The file's name is removed as soon as it is open, so a process killed at
any point leaves nothing behind; the descriptor keeps the data until the object is collected. Every read gives
its offset (``pread``, ``sendfile`` with an offset), so threads share one descriptor safely.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

CHUNK = 1 << 20


class LibraryFile:
    """``size`` bytes from ``offset`` of the open descriptor ``fd`` (owned: closed when this is collected)."""

    def __init__(self, fd: int, offset: int = 0, size: int | None = None):
        self.fd, self.offset = fd, offset
        self.size = os.fstat(fd).st_size - offset if size is None else size
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def link(cls, executable) -> "LibraryFile":
        """``executable`` (a ``tvm.relax.VMExecutable``) linked by :func:`tvmfuse.link.export_library`."""
        from . import link

        def link_in(folder, pack):  # the library beside its objects: see tvmfuse.scratch
            path = os.path.join(folder, "model.so")
            link.export_in(executable, path, folder, pack)
            return cls(os.open(path, os.O_RDONLY))

        return link.in_workspace(executable, link_in)

    @classmethod
    def from_bytes(cls, data: bytes) -> "LibraryFile":
        fd, path = tempfile.mkstemp(prefix="tvmfuse-lib-", suffix=".so")
        try:
            os.unlink(path)
            _write_all(fd, memoryview(data))
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def part_of(cls, fd: int, offset: int, size: int) -> "LibraryFile":
        """A part of the open file ``fd`` (a cache entry), through a descriptor of its own: the entry may be
        replaced or evicted meanwhile, this keeps reading what was checked."""
        return cls(os.dup(fd), offset, size)

    def read_bytes(self) -> bytes:
        out = bytearray(self.size)
        view, done = memoryview(out), 0
        while done < self.size:
            n = os.preadv(self.fd, [view[done:done + CHUNK]], self.offset + done)
            if n <= 0:
                raise OSError(f"library file ended after {done} of {self.size} bytes")
            done += n
        return bytes(out)

    def chunks(self):
        """The bytes in pieces of at most :data:`CHUNK` (for a checksum)."""
        done = 0
        while done < self.size:
            piece = os.pread(self.fd, min(CHUNK, self.size - done), self.offset + done)
            if not piece:
                raise OSError(f"library file ended after {done} of {self.size} bytes")
            yield piece
            done += len(piece)

    def send(self, out_fd: int) -> None:
        """Append the bytes to ``out_fd`` at its position, copied inside the kernel."""
        done = 0
        while done < self.size:
            n = os.sendfile(out_fd, self.fd, self.offset + done, self.size - done)
            if n <= 0:
                raise OSError(f"library file ended after {done} of {self.size} bytes")
            done += n

    def write(self, path: str | os.PathLike) -> None:
        """Write the library to ``path`` (created or truncated)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            self.send(fd)
        finally:
            os.close(fd)

    def load(self):
        """The TVM runtime module of the library (loaded from a private copy, in :func:`tvmfuse.scratch.folder`;
        the mapping outlives the file)."""
        from . import scratch

        for folder in scratch.folders(self.size):
            try:
                return self._load_in(folder)
            except OSError:
                if folder is None:
                    raise

    def _load_in(self, folder: str | None):
        import tvm

        tmp = tempfile.mkdtemp(prefix="tvmfuse-load-", dir=folder)
        try:
            path = os.path.join(tmp, "model.so")
            self.write(path)
            return tvm.runtime.load_module(path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_all(fd: int, view: memoryview) -> None:
    while len(view):
        view = view[os.write(fd, view[:CHUNK * 64]):]
