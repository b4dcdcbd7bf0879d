"""TVM's own warning lines (Scope Saving/Loaded, the gather's fast mode) stay away from users; other output
passes on as it comes; TVMFUSE_TVM_LOG=1 lets them through."""

from __future__ import annotations

import os
import subprocess
import sys

from tvmfuse.runtime import tvm_log

WARNING = b"[12:00:00] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:\n"


def test_drops_tvms_warning_lines_and_keeps_everything_else(capfd):
    before = tvm_log.dropped()
    with tvm_log.quiet_tvm_warnings():
        with tvm_log.quiet_tvm_warnings():  # nested (export inside a compile): one redirection
            os.write(2, WARNING + b"[1/3] import ONNX ... ")
            os.write(2, b"0.1 s\n[12:00:01] /project/src/x.cc:9: Error: a real problem\n")
        os.write(2, b"[12:00:02] /project/include/tvm/topi/transform.h:1261: Warning: Fast mode segfaults\n")
    err = capfd.readouterr().err
    assert err == "[1/3] import ONNX ... 0.1 s\n[12:00:01] /project/src/x.cc:9: Error: a real problem\n"
    assert tvm_log.dropped() == before + 2


def test_a_partial_line_is_passed_on_before_its_end_unless_it_may_be_tvms():
    assert tvm_log._could_be_tvm(b"[12:0") and tvm_log._could_be_tvm(b"[12:00:00] /proj")
    assert not tvm_log._could_be_tvm(b"[1/3] import") and not tvm_log._could_be_tvm(b"compiling")


def test_the_switch_lets_them_through(capfd, monkeypatch):
    monkeypatch.setenv(tvm_log.ENV, "1")
    with tvm_log.quiet_tvm_warnings():
        os.write(2, WARNING)
    assert capfd.readouterr().err == WARNING.decode()


SCRIPT = r"""
import numpy as np, tvmfuse
from onnx import helper, numpy_helper
from helpers import make_model
idx = numpy_helper.from_array(np.array([0, 2, 1], np.int64), "idx")
model = make_model([helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)], [("x", [1, 4, 5])], [("y", None)], [idx])
cm = tvmfuse.compile(model)  # legalizing the gather: "Fast mode segfaults ..."
cm.run({"x": np.ones((1, 4, 5), "float32")})
cm.export("%s/m.so")  # linked before the run: no "Scope Saving:" to drop
tvmfuse.load("%s/m.so")  # "Scope Loaded:"
"""


def test_compile_run_export_and_load_print_none_of_them(tmp_path):
    script = SCRIPT % (tmp_path, tmp_path)
    tests = os.path.dirname(__file__)
    for switch, shown in (("", False), ("1", True)):
        env = dict(os.environ, PYTHONPATH=tests, **{tvm_log.ENV: switch})
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        assert ("Warning: Fast mode segfaults" in done.stderr) == shown, done.stderr
        assert "Warning: Scope Saving" not in done.stderr, done.stderr
