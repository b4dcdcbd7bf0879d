"""bench/device/round.sh: a lent GPU machine returns 8 files a call at most, so the round packs every
finished step into one archive after each step, and ROUND_STEPS runs only the named steps (a short second
call). Run here on a copy of the script whose steps fail at once (no bench scripts beside it)."""

import shutil
import subprocess
import tarfile
from pathlib import Path

DEVICE = Path(__file__).resolve().parents[1] / "bench" / "device"


def test_only_the_named_steps_run_and_come_back_in_one_archive(tmp_path):
    copy = tmp_path / "bench" / "device"
    copy.mkdir(parents=True)
    for name in ("round.sh", "env.sh"):
        shutil.copy(DEVICE / name, copy / name)
    (tmp_path / "tvmfuse").mkdir()
    out, work = tmp_path / "out", tmp_path / "work"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(out), "ROUND_WORK": str(work),
           "ROUND_STEPS": "cuda_graph amx_tests profile_int8"}
    done = subprocess.run(["bash", str(copy / "round.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert [p.name for p in out.iterdir()] == ["round.tar.gz"]
    with tarfile.open(out / "round.tar.gz") as tar:
        names = sorted(Path(n).name for n in tar.getnames() if n not in (".", "./"))
        steps = tar.extractfile("./steps.txt").read().decode()
    assert names == ["amx_tests.txt", "cuda_graph.txt", "gpu.txt", "profile_int8.txt", "steps.txt"]
    ran = [line.split(":")[0] for line in steps.splitlines()]
    # in the round's order, not the variable's; a check run beside another step is waited for and packed
    assert ran == ["amx_tests", "profile_int8", "cuda_graph"]
    assert all(" exit " in line and not line.split(" exit ")[1].startswith("0 ") for line in steps.splitlines())
    assert done.stdout.strip().splitlines()[-3:] == steps.strip().splitlines()
