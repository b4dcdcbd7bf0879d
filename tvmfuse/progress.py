"""Step-by-step progress lines on stderr for long operations (compile, export)."""

from __future__ import annotations

import contextlib
import sys
import time


class Steps:
    """Prints ``[i/n] name ... 1.2 s`` for each step when enabled; silent otherwise.

    Parameters
    ----------
    total : int
        Number of steps announced.
    enabled : bool
        Print or stay silent (the Python API is silent by default, the CLI is not).
    """

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.enabled, self.index = total, enabled, 0
        self.stream = stream or sys.stderr
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str):
        self.index += 1
        if self.enabled:
            print(f"[{self.index}/{self.total}] {name} ...", end="", file=self.stream, flush=True)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            if self.enabled:
                print(" failed", file=self.stream, flush=True)
            raise
        self.times[name] = time.perf_counter() - start
        if self.enabled:
            print(f" {self.times[name]:.1f} s", file=self.stream, flush=True)
