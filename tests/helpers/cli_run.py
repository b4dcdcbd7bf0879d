"""tvmfuse's CLI in a fresh process, saying whether TVM was imported on the way (the cache's answers without TVM)."""

from __future__ import annotations

import os
import subprocess
import sys

CLI = ("import sys; from tvmfuse import cli; rc = cli.main(sys.argv[1:]); print('TVM', 'tvm' in sys.modules); "
       "sys.exit(rc)")


def cli_run(args, cache, **env) -> str:
    """Standard output of ``tvmfuse ARGS --cache-dir CACHE`` (``env`` added to the environment); it ends with
    ``TVM True`` or ``TVM False``."""
    proc = subprocess.run([sys.executable, "-c", CLI, *args, "--cache-dir", str(cache)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
