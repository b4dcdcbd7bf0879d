"""Pinned inputs (``consts=`` / ``--const``) and the ``If`` nodes they decide: the taken branch is inlined
(outer-scope reads, its own initializers, nested ``If``), the model matches onnxruntime run with the pinned
value, the manifest records it and a run given another value is refused; an ``If`` on data is refused in
one line naming the node and the input its condition reads."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvmfuse
from helpers import ort_run
from tvmfuse import cli, corpus
from tvmfuse.errors import InputError, UnsupportedOpError

RNG = np.random.default_rng(0)
W_THEN = RNG.standard_normal((4, 3, 3, 3)).astype("float32") * 0.3
W_ELSE = RNG.standard_normal((4, 3, 1, 1)).astype("float32")
W_NESTED = RNG.standard_normal((4, 3, 3, 3)).astype("float32") * 0.3


def _branch(name: str, nodes, initializers=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)],
                             list(initializers))


def audio_like(nested: bool = False, on_data: bool = False) -> onnx.ModelProto:
    """x[1, 3, 8, 8], sr (an int64 scalar): 16 kHz takes a 3x3 conv (+ ReLU), anything else a 1x1 conv. The
    branches read ``x`` and ``w`` (an initializer of the main graph) from the outer scope and have an
    initializer of their own named ``w`` too. ``nested``: the 16 kHz branch itself branches on sr > 12000.
    ``on_data``: the condition is sum(x) > 0 instead."""
    then_nodes = [helper.make_node("Conv", ["x", "w_then"], ["t0"], pads=[1, 1, 1, 1]),
                  helper.make_node("Add", ["t0", "w"], ["t1"]), helper.make_node("Relu", ["t1"], ["then_out"])]
    then_inits = [numpy_helper.from_array(W_THEN, "w_then")]
    if nested:
        inner_then = _branch("inner_then", [helper.make_node("Conv", ["x", "w_nested"], ["inner_then_out"],
                                                             pads=[1, 1, 1, 1])],
                             [numpy_helper.from_array(W_NESTED, "w_nested")])
        inner_else = _branch("inner_else", [helper.make_node("Relu", ["t1"], ["inner_else_out"])])
        then_nodes[-1:] = [helper.make_node("Greater", ["sr", "limit"], ["big"]),
                           helper.make_node("If", ["big"], ["then_out"], name="inner_if",
                                            then_branch=inner_then, else_branch=inner_else)]
    then_branch = _branch("then", then_nodes, then_inits)
    else_branch = _branch("else", [helper.make_node("Conv", ["x", "w_else"], ["e0"]),
                                   helper.make_node("Mul", ["e0", "w"], ["else_out"])],
                          [numpy_helper.from_array(W_ELSE, "w_else")])
    if on_data:
        cond_nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                      helper.make_node("Greater", ["s", "zero"], ["cond"])]
    else:
        cond_nodes = [helper.make_node("Equal", ["sr", "rate"], ["cond"])]
    nodes = cond_nodes + [helper.make_node("If", ["cond"], ["y"], name="/model/If", then_branch=then_branch,
                                           else_branch=else_branch)]
    inits = [numpy_helper.from_array(np.array(16000, np.int64), "rate"),
             numpy_helper.from_array(np.array(12000, np.int64), "limit"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.float32(0.5).reshape(1), "w")]
    graph = helper.make_graph(nodes, "audio", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                               helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


X = RNG.standard_normal((1, 3, 8, 8)).astype("float32")


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("rate", [16000, 8000])
def test_the_taken_branch_is_inlined_and_matches_onnxruntime(rate, nested):
    model = audio_like(nested)
    cm = tvmfuse.compile(model, target="x86-host", consts={"sr": rate})
    assert [i.name for i in cm.inputs] == ["x"]
    (want,) = ort_run(model, {"x": X, "sr": np.array(rate, np.int64)})
    np.testing.assert_allclose(cm.run({"x": X})[0], want, rtol=1e-5, atol=1e-5)
    assert cm.manifest()["pinned_inputs"] == {"sr": {"shape": [], "dtype": "int64", "value": [rate]}}


def test_a_run_given_another_value_is_refused_the_same_value_ignored(tmp_path):
    cm = tvmfuse.compile(audio_like(), target="x86-host", consts={"sr": 16000})
    same = cm.run({"x": X, "sr": np.array(16000, np.int64)})[0]
    np.testing.assert_array_equal(same, cm.run({"x": X})[0])
    with pytest.raises(InputError, match=r"^input 'sr' was pinned to \[16000\] when the model was compiled "
                                         r"\(--const\); a run cannot change it \(got \[8000\]\)$"):
        cm.run({"x": X, "sr": np.array(8000, np.int64)})
    loaded = tvmfuse.load(cm.export(tmp_path / "m.so"))
    with pytest.raises(InputError, match="was pinned to"):
        loaded.run({"x": X, "sr": np.array(8000, np.int64)})
    np.testing.assert_array_equal(loaded.run({"x": X})[0], same)


def test_an_if_on_data_or_an_unpinned_input_is_one_line_naming_the_node_and_input():
    with pytest.raises(UnsupportedOpError, match=r"If node '/model/If': its condition depends on input\(s\) "
                                                 r"\['x'\]; pin it with --const NAME=VALUE"):
        tvmfuse.compile(audio_like(on_data=True), target="x86-host")
    with pytest.raises(UnsupportedOpError, match=r"If node '/model/If': its condition depends on input\(s\) "
                                                 r"\['sr'\]"):
        tvmfuse.compile(audio_like(), target="x86-host")


def test_bad_consts_are_one_line_errors():
    with pytest.raises(InputError, match=r"--const names unknown input\(s\) \['rate'\]; the model's inputs are "
                                         r"\['sr', 'x'\]"):
        tvmfuse.compile(audio_like(), target="x86-host", consts={"rate": 1})
    with pytest.raises(InputError, match=r"--const sr: input 'sr' has shape \(\); 2 value\(s\) given"):
        tvmfuse.compile(audio_like(), target="x86-host", consts={"sr": "16000,8000"})
    with pytest.raises(InputError, match=r"--const sr: input 'sr' is int64; \[16000.5\] is not"):
        tvmfuse.compile(audio_like(), target="x86-host", consts={"sr": 16000.5})


def test_the_cli_pins_with_const(tmp_path, capsys):
    path = tmp_path / "audio.onnx"
    onnx.save(audio_like(), path)
    out = tmp_path / "m.so"
    assert cli.main(["compile", str(path), "--target", "x86-host", "--const", "sr=8000", "-o", str(out), "-q"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["pinned_inputs"]["sr"]["value"] == [8000]
    for bad, said in [("sr", "expected NAME=VALUE"), ("sr=abc", "not a number"), ("nope=1", "unknown input")]:
        assert cli.main(["compile", str(path), "--target", "x86-host", "--const", bad, "-q", "-o",
                         str(tmp_path / "bad.so")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
    assert not (tmp_path / "bad.so").exists()


def test_a_loop_is_refused_by_name():
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"]),
                              helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("c_out", TensorProto.FLOAT, [1])])
    graph = helper.make_graph([helper.make_node("Loop", ["n", "", "x"], ["y"], name="loop", body=body)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [numpy_helper.from_array(np.array(3, np.int64), "n")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match="unsupported ONNX op: Loop"):
        tvmfuse.compile(model, target="x86-host")


# The audio model of the issue: Silero VAD (silero-vad on PyPI, MIT), whose exports branch on the sample rate,
# one If at the top (silero_vad.onnx) or inside (the op15, half and "ifless" forms). Fetched into the corpus cache
# by tvmfuse.corpus.fetch(SILERO[0]) (bench/real_models.py fetches the corpus); skipped when not cached.
SILERO = [corpus.CorpusModel(f"silero_vad_{form}", "silero-vad==6.2.3", f"silero_vad/data/{file}", "input", (1, 512),
                             "Silero VAD: STFT conv, conv encoder, LSTM state, If on the sample rate", "MIT")
          for form, file in [("top_if", "silero_vad.onnx"), ("op15", "silero_vad_16k_op15.onnx"),
                             ("half", "silero_vad_half.onnx"), ("op18", "silero_vad_op18_ifless.onnx")]]


@pytest.mark.parametrize("entry", SILERO, ids=[m.name for m in SILERO])
def test_silero_vad_pinned_to_16k_matches_onnxruntime(entry):
    path = corpus.local_path(entry)
    if not path.is_file():
        pytest.skip(f"{entry.package} not in the corpus cache (tvmfuse.corpus.fetch fetches it)")
    proto = onnx.load(str(path))
    names = {i.name for i in proto.graph.input}
    shapes = {"input": (1, 512), "state": (2, 1, 128)}
    consts = {"sr": 16000} if "sr" in names else None
    cm = tvmfuse.compile(str(path), target="x86-host", shapes=shapes, consts=consts)
    assert [i.name for i in cm.inputs] == ["input", "state"]
    rng = np.random.default_rng(0)
    x = {"input": rng.standard_normal((1, 512)).astype("float32") * 0.1,
         "state": rng.standard_normal((2, 1, 128)).astype("float32") * 0.1}
    want = ort_run(proto, dict(x, sr=np.array(16000, np.int64)) if consts else x)  # the file as shipped
    for got, ref in zip(cm.run(x), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def test_tuning_takes_the_pinned_inputs_too(tmp_path, capsys):
    from tvmfuse import targets
    from tvmfuse.tune.tuner import extract_tasks

    spec = targets.resolve("x86-host")
    pinned = {t.name for t in extract_tasks(audio_like(), spec, consts={"sr": 16000})}
    assert pinned and pinned != {t.name for t in extract_tasks(audio_like(), spec, consts={"sr": 8000})}
    path = tmp_path / "audio.onnx"
    onnx.save(audio_like(), path)
    assert cli.main(["tune", str(path), "--const", "sr=16000", "--export-candidates", str(tmp_path / "c"), "-q"]) == 0
    assert "wrote the candidates of" in capsys.readouterr().out
    assert cli.main(["tune", str(path), "--export-candidates", str(tmp_path / "c"), "-q"]) == 2
    assert "pin it with --const" in capsys.readouterr().err
