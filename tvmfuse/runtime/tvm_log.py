"""Keep TVM's own warning lines away from users.

TVM's C++ logger writes ``[hh:mm:ss] /project/src/...cc:276: Warning: ...`` straight to file descriptor 2:
``Scope Saving:`` once per weight when a library that has run is exported, ``Scope Loaded:`` when it is
loaded, ``Fast mode segfaults when there are out-of-bounds indices`` for every gather a frontend legalizes.
They are about TVM's internals, not about the user's model, and a warning that matters is said by tvmfuse
in its own words. :func:`quiet_tvm_warnings` points fd 2 at a pipe for the duration and forwards every
other byte at once (progress lines stay live), dropping TVM's warning lines; ``TVMFUSE_TVM_LOG=1`` lets them
through. Errors are never dropped. Nested and concurrent uses share one redirection.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

ENV = "TVMFUSE_TVM_LOG"
# TVM's logger: "[18:31:54] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:"
_TVM_WARNING = re.compile(rb"^\[\d\d:\d\d:\d\d\] \S+\.(cc|h|cpp):\d+: Warning: ")
_STAMP = b"[00:00:00] "  # the shape of its time stamp, a 0 for each digit

_lock = threading.Lock()
_state = {"depth": 0, "saved": None, "write": None, "reader": None, "dropped": 0}


def dropped() -> int:
    """How many TVM warning lines were dropped in this process (for tests and diagnostics)."""
    return _state["dropped"]


def _could_be_tvm(partial: bytes) -> bool:
    """Whether a line begun but not ended may still turn out to be one of TVM's (its time stamp so far)."""
    return all(c == want or (want == ord("0") and 48 <= c <= 57) for c, want in zip(partial, _STAMP))


def _forward(read_fd: int, out_fd: int) -> None:
    pending = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        kept = []
        for line in lines:
            if _TVM_WARNING.match(line):
                _state["dropped"] += 1
            else:
                kept.append(line + b"\n")
        # a partial line (a progress line waiting for its "done") is passed on at once, unless it may be the
        # start of a TVM warning line
        if pending and not _could_be_tvm(pending):
            kept.append(pending)
            pending = b""
        if kept:
            os.write(out_fd, b"".join(kept))
    if pending and not _TVM_WARNING.match(pending):
        os.write(out_fd, pending)
    os.close(read_fd)


def _start() -> None:
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    reader = threading.Thread(target=_forward, args=(read_fd, saved), name="tvmfuse-tvm-log", daemon=True)
    reader.start()
    _state.update(saved=saved, reader=reader)


def _stop() -> None:
    with contextlib.suppress(ValueError, OSError):
        sys.stderr.flush()
    saved = _state["saved"]
    os.dup2(saved, 2)  # closes the pipe's last write end: the reader sees the end and finishes
    _state["reader"].join(timeout=10)
    os.close(saved)
    _state.update(saved=None, reader=None)


@contextlib.contextmanager
def quiet_tvm_warnings():
    """Drop TVM's warning lines written to fd 2 meanwhile; pass everything else on as it comes."""
    if os.environ.get(ENV) == "1":
        yield
        return
    try:
        os.fstat(2)
    except OSError:  # no stderr at all: nothing to filter
        yield
        return
    with _lock:
        if _state["depth"] == 0:
            _start()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                _stop()
