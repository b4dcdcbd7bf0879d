"""Real tuning runs, kept tiny (one conv kernel, a few trials): reuse, interruption and resume, clear failures, RPC.

These run MetaSchedule end to end (builder processes, runner, XGBoost); each takes seconds to a minute here.
"""

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import tvmfuse
from tvmfuse import targets
from tvmfuse.passes.kernel_names import kind
from tvmfuse.runtime import random_inputs
from tvmfuse.tune.database import LogStore
from tvmfuse.tune.measure import RPCSpec, TuningError
from tvmfuse.tune.runs import RUNS
from tvmfuse.tune.tuner import tune

from helpers.tune import HOST, MODEL, record_lines, wide_conv

def test_tune_writes_a_validated_record_that_compile_applies_and_never_retunes(tmp_path):
    report = tune(MODEL, HOST, trials=4, logs=tmp_path, trials_per_iter=4, progress=False)
    (result,) = report.tasks
    assert result.status in ("tuned", "default kept") and result.trials >= 1
    assert result.tuned_us > 0 and result.default_us > 0
    store = LogStore(tmp_path, HOST)
    assert len(record_lines(store.path)) == 1 and not (store.path / RUNS).exists()
    cm = tvmfuse.compile(MODEL, target=HOST, logs=tmp_path)
    assert list(map(kind, cm.tuning_logs["applied"])) == ["tvmfuse_conv2d_relu"]
    x = random_inputs(cm.inputs)
    np.testing.assert_allclose(cm.run(x)[0], tvmfuse.compile(MODEL, target=HOST, logs=False).run(x)[0],
                               rtol=1e-4, atol=1e-4)
    # The same workload in another model (other weights, other input name) is not tuned again.
    from helpers import conv_relu

    again = tune(conv_relu(batch=1, seed=5), HOST, trials=4, logs=tmp_path, progress=False)
    assert [t.status for t in again.tasks] == ["in logs"] and again.records_written == 0


SCRIPT = """
import sys, onnx
from tvmfuse.tune.tuner import tune
tune(onnx.load(sys.argv[1]), "x86-host", trials=int(sys.argv[3]), logs=sys.argv[2], trials_per_iter=2,
     resume=sys.argv[4] == "1", progress=True)
"""


def _start(model_path, logs, trials, resume):
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(model_path), str(logs), str(trials),
                             "1" if resume else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group: kill -9 reaches its workers too


def _staged(store):
    runs = sorted((store.path / RUNS).glob("*")) if (store.path / RUNS).exists() else []
    return sum(len(record_lines(r)) for r in runs)


def _wait_for_records(proc, store, n, timeout=300):
    deadline = time.monotonic() + timeout
    while _staged(store) < n:
        assert proc.poll() is None, f"tuning ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "no records measured in time"
        time.sleep(0.5)


@pytest.mark.slow  # three tuning runs, one killed and one interrupted: about 50 s
def test_interrupted_runs_keep_their_records_and_resume(tmp_path):
    model = wide_conv()
    model_path = tmp_path / "m.onnx"
    model_path.write_bytes(model.SerializeToString())
    store = LogStore(tmp_path / "logs", HOST)
    # kill -9 mid-run: the run folder keeps every measured batch.
    proc = _start(model_path, tmp_path / "logs", 12, resume=False)
    _wait_for_records(proc, store, 4)
    os.killpg(proc.pid, signal.SIGKILL)  # the tuner and its builder/runner processes, as a killed shell job
    proc.wait()
    after_kill = _staged(store)
    assert after_kill >= 4 and record_lines(store.path) == []
    # Ctrl-C on a resumed run: it continues from those records, and stops cleanly keeping the new ones too.
    proc = _start(model_path, tmp_path / "logs", 12, resume=True)
    _wait_for_records(proc, store, after_kill + 2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "run again with --resume" in err
    after_int = _staged(store)
    assert after_int >= after_kill + 2 and len(list((store.path / RUNS).glob("*"))) == 1
    # The last resume only measures what is left of the 12 trials, then writes the validated record.
    report = tune(model, HOST, trials=12, logs=tmp_path / "logs", trials_per_iter=8, resume=True, progress=False)
    (result,) = report.tasks
    assert result.status in ("tuned", "default kept") and result.trials <= 12
    assert len(record_lines(store.path)) == 1 and not (store.path / RUNS).exists()


def test_nothing_built_is_a_clear_error(tmp_path):
    # A build timeout no build can meet stands in for MetaSchedule's silent "0 valid samples".
    with pytest.raises(TuningError, match="no candidate was built and measured.*Timeout"):
        tune(MODEL, HOST, trials=2, logs=tmp_path, trials_per_iter=2, builder_timeout=0.001, progress=False)
    assert record_lines(LogStore(tmp_path, HOST).path) == []


def test_target_without_templates_is_sent_offline(tmp_path):
    # The CUDA rules have no MetaSchedule templates: their tiles are tuned offline (tests/tune/test_offline_cuda.py).
    with pytest.raises(TuningError, match="cuda-sm80: its backend .cuda. has no MetaSchedule templates.*--export-candidates"):
        tune(MODEL, "cuda-sm80", trials=2, logs=tmp_path)
    assert not any(tmp_path.iterdir())


def test_target_this_host_cannot_run_needs_rpc(tmp_path):
    # Sapphire Rapids with every extension (AMX, AVX512-FP16): what few CI hosts have (the device host does).
    full_spr = targets.resolve({"kind": "llvm", "mcpu": "sapphirerapids"})
    if not full_spr.backend().runs_on_this_cpu():
        with pytest.raises(TuningError, match="cannot run on this machine.*lacks .*amx.*--rpc"):
            tune(MODEL, full_spr, trials=2, logs=tmp_path)
    if not targets.resolve("x86-avx512").backend().runs_on_this_cpu():
        with pytest.raises(TuningError, match="cannot run on this machine.*lacks avx512"):
            tune(MODEL, "x86-avx512", trials=2, logs=tmp_path)


def test_rpc_spec_errors():
    with pytest.raises(TuningError, match="HOST:PORT"):
        RPCSpec.parse("localhost", "k")
    with pytest.raises(TuningError, match="cannot reach the RPC tracker"):
        RPCSpec("127.0.0.1", _free_port(), "k").check()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_servers(rpc: RPCSpec, n: int, timeout=120):
    from tvm import rpc as tvm_rpc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            summary = tvm_rpc.connect_tracker(rpc.host, rpc.port).summary()
            if len([s for s in summary["server_info"] if s["key"].endswith(rpc.key)]) >= n:
                return
        except Exception:  # noqa: BLE001 - tracker still starting
            pass
        time.sleep(0.5)
    raise AssertionError("RPC servers did not register")


@pytest.mark.slow
def test_tune_through_an_rpc_tracker_and_two_servers(tmp_path):
    port = _free_port()
    rpc = RPCSpec("127.0.0.1", port, "tvmfuse-test")
    env = dict(os.environ, TVM_NUM_THREADS="1")
    # Each in its own process group: the tracker and servers serve from a tvm.exec.popen_worker child that a
    # SIGTERM to the CLI process leaves running (re-parented to init, holding its port) for good.
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                               "--port", str(port), "--port-end", str(port + 1)], env=env, start_new_session=True)]
    try:
        time.sleep(2)
        for i in range(2):
            procs.append(subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                                           "--port", str(9190 + 10 * i), "--port-end", str(9199 + 10 * i),
                                           "--tracker", f"127.0.0.1:{port}", "--key", rpc.key], env=env,
                                          start_new_session=True))
        _wait_for_servers(rpc, 2)
        assert rpc.check() == 2
        report = tune(MODEL, HOST, trials=4, logs=tmp_path, trials_per_iter=4, rpc=rpc, progress=False)
        (result,) = report.tasks
        assert result.status in ("tuned", "default kept") and result.trials >= 1
        assert result.tuned_us > 0 and result.default_us > 0  # checked and timed on an RPC server
        applied = tvmfuse.compile(MODEL, target=HOST, logs=tmp_path).tuning_logs["applied"]
        assert list(map(kind, applied)) == ["tvmfuse_conv2d_relu"]
    finally:
        _stop_groups(procs)


def _stop_groups(procs):
    """SIGTERM each process's whole group (the CLI and the popen worker that serves); no process survives."""
    import psutil

    family = []
    for p in procs:
        try:
            family += [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for p in reversed(procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait(timeout=30)
    _, alive = psutil.wait_procs(family, timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f"RPC tracker/server processes survived SIGTERM: {[p.pid for p in alive]}"


FAKE_TORCH = """import os
with open({marker!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
raise ImportError("fake torch: only records who imports it")
"""


@pytest.mark.slow
def test_tuning_workers_do_not_import_torch(tmp_path, monkeypatch):
    # tvm-ffi imports torch whenever it can; in every builder and runner worker that cost a PyTorch import
    # (the builder pool restarts every batch). A fake torch on PYTHONPATH records each process importing it.
    marker = tmp_path / "imported_by"
    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text(FAKE_TORCH.format(marker=str(marker)))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    # The fake works: a fresh interpreter importing tvm (tvm-ffi) imports it.
    subprocess.run([sys.executable, "-c", "import tvm"], check=True)
    assert marker.read_text().split() != []
    marker.unlink()
    report = tune(MODEL, HOST, trials=2, logs=tmp_path / "logs", trials_per_iter=2, progress=False)
    assert report.tasks[0].trials >= 1  # candidates were built and run by workers
    assert not marker.exists(), f"tuning workers imported torch: pids {marker.read_text().split()}"
    assert os.environ["PYTHONPATH"] == str(tmp_path / "fake")  # restored after the run
