"""The cache from the command line: flags, `tvmfuse cache info/clear`, concurrent compiles, compiles killed
half-way."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tvmfuse.cache.store import MAGIC, Store

MODEL = "zoo:tiny_convnet"


def _cli(*argv, cwd=None, env=None):
    env = dict(os.environ if env is None else env)
    env.pop("TVMFUSE_NO_CACHE", None)
    return subprocess.run([sys.executable, "-m", "tvmfuse", *map(str, argv)], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def _entries_are_whole(root) -> int:
    """How many entries the folder holds; fails on any entry whose checksum does not hold."""
    import hashlib

    n = 0
    for path, _ in Store(root).entries():
        head, _, payload = path.read_bytes().partition(b"\n")
        magic, size, digest = head.split()
        assert magic == MAGIC and int(size) == len(payload) and digest.decode() == hashlib.sha256(payload).hexdigest()
        n += 1
    return n


def test_compile_says_what_came_from_the_cache_and_cache_info_counts_it(tmp_path):
    cache = tmp_path / "cache"
    first = _cli("compile", MODEL, "-o", tmp_path / "a.so", "--cache-dir", cache, "-q")
    assert first.returncode == 0, first.stderr
    assert "kernel cache: 0 of" in first.stdout
    second = _cli("compile", MODEL, "-o", tmp_path / "b.so", "--cache-dir", cache, "-q")
    assert "kernel cache: the whole build reused" in second.stdout
    assert (tmp_path / "a.so").read_bytes() == (tmp_path / "b.so").read_bytes()
    run = _cli("run", tmp_path / "b.so")
    assert run.returncode == 0, run.stderr
    info = _cli("cache", "info", "--cache-dir", cache)
    assert info.returncode == 0 and "models   1 of 2 whole builds reused" in info.stdout, info.stdout
    assert "kernels  0 of" in info.stdout and "schedules 0 of" in info.stdout, info.stdout  # the first build's
    assert "lowered   0 of" in info.stdout, info.stdout
    assert f"folder   {cache}" in info.stdout
    off = _cli("compile", MODEL, "-o", tmp_path / "c.so", "--no-cache", "-q")
    assert "kernel cache: off" in off.stdout
    cleared = _cli("cache", "clear", "--cache-dir", cache)
    assert cleared.returncode == 0 and cleared.stdout.startswith("removed ")
    assert _entries_are_whole(cache) == 0


def test_a_cache_folder_others_can_write_is_refused_with_exit_2(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    done = _cli("compile", MODEL, "-o", tmp_path / "m.so", "--cache-dir", shared, "-q")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"tvmfuse compile: error: cache folder {shared} is writable by other users (mode 777): refusing to load "
        "code from it (fix its owner or mode, or pick another with --cache-dir / TVMFUSE_CACHE_DIR)"]
    assert not (tmp_path / "m.so").exists()


_COMPILE = """
import sys, numpy as np, tvmfuse
from tvmfuse.runtime import random_inputs
from helpers import conv_relu
cache = False if sys.argv[2] == "False" else sys.argv[2]
cm = tvmfuse.compile(conv_relu(), "x86-host", shapes={"x": (int(sys.argv[3]), 3, 16, 16)}, cache=cache)
np.save(sys.argv[4], cm.run(random_inputs(cm.inputs))[0])
"""


def test_concurrent_compiles_of_overlapping_models_share_one_folder(tmp_path):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "TVMFUSE_NO_CACHE"}
    jobs = [(batch, tmp_path / f"out{i}.npy") for i, batch in enumerate((1, 1, 2, 2))]
    env["PYTHONPATH"] = str(Path(__file__).parents[1])  # tests/: the helpers package
    procs = [subprocess.Popen([sys.executable, "-c", _COMPILE, MODEL, str(cache), str(b), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for b, out in jobs]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        assert "damaged" not in err
    assert _entries_are_whole(cache) > 0
    np.testing.assert_array_equal(np.load(jobs[0][1]), np.load(jobs[1][1]))
    np.testing.assert_array_equal(np.load(jobs[2][1]), np.load(jobs[3][1]))
    single = subprocess.run([sys.executable, "-c", _COMPILE, MODEL, "False", "1", str(tmp_path / "ref.npy")],
                            env=env, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr
    np.testing.assert_array_equal(np.load(jobs[0][1]), np.load(tmp_path / "ref.npy"))  # as built without it


def test_compiles_killed_at_random_points_leave_no_damaged_entry(tmp_path):
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "TVMFUSE_NO_CACHE"}
    rng = random.Random(7)
    for _ in range(5):
        p = subprocess.Popen([sys.executable, "-m", "tvmfuse", "compile", MODEL, "-o", str(tmp_path / "k.so"),
                              "--cache-dir", str(cache), "-q"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 6.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        _entries_are_whole(cache)
    done = _cli("compile", MODEL, "-o", tmp_path / "k.so", "--cache-dir", cache, "-q", env=env)
    assert done.returncode == 0 and "damaged" not in done.stderr, done.stderr
    assert _cli("run", tmp_path / "k.so").returncode == 0
