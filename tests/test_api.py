"""compile / run / benchmark / export through the Python API."""

import json

import numpy as np
import pytest

import tvmfuse
from tvmfuse import zoo
from tvmfuse.errors import InputError, TvmfuseError

from helpers import HOST, ort_run


def _x(seed=0):
    return {"input": np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype("float32")}


def test_compile_accepts_zoo_name_proto_and_path(tiny_compiled, tmp_path):
    ref = tiny_compiled.run(_x())[0]
    path = tmp_path / "tiny.onnx"
    path.write_bytes(zoo.get("tiny_convnet").SerializeToString())
    for model in (zoo.get("tiny_convnet"), path, str(path)):
        np.testing.assert_array_equal(tvmfuse.compile(model, target=HOST).run(_x())[0], ref)


def test_run_matches_onnxruntime(tiny_compiled):
    out = tiny_compiled.run(_x())
    ref = ort_run(zoo.get("tiny_convnet"), _x())
    assert len(out) == len(ref) == 1 and out[0].shape == (1, 10)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-4, atol=1e-4)


def test_inputs_and_outputs_described(tiny_compiled):
    assert [(i.name, i.shape, i.dtype) for i in tiny_compiled.inputs] == [("input", (1, 3, 32, 32), "float32")]
    assert [(o.name, o.shape, o.dtype) for o in tiny_compiled.outputs] == [("output", (1, 10), "float32")]
    assert "tiny_convnet" in repr(tiny_compiled)


@pytest.mark.parametrize("inputs, message", [
    ({"image": np.zeros((1, 3, 32, 32), "float32")}, r"missing input\(s\) \['input'\]; unknown input\(s\) \['image'\]"),
    ({"input": np.zeros((1, 3, 16, 16), "float32")}, r"'input': expected shape \(1, 3, 32, 32\), got \(1, 3, 16, 16\)"),
    ({"input": np.zeros((1, 3, 32, 32), "float64")}, r"'input': expected dtype float32, got float64"),
    ({"input": [[1.0]]}, r"'input' must be a numpy array"),
    ([np.zeros((1, 3, 32, 32), "float32")], r"must be a dict"),
])
def test_bad_run_inputs(tiny_compiled, inputs, message):
    with pytest.raises(InputError, match=message):
        tiny_compiled.run(inputs)


def test_non_contiguous_input_is_accepted(tiny_compiled):
    x = np.asfortranarray(_x()["input"])
    np.testing.assert_array_equal(tiny_compiled.run({"input": x})[0], tiny_compiled.run(_x())[0])


def test_scalar_input_runs():
    """A 0-d input (a scale, a sample rate) stays 0-d on its way to the VM."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "scaled",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    x = {"x": np.arange(4, dtype=np.float32), "s": np.array(2.5, np.float32)}
    np.testing.assert_array_equal(tvmfuse.compile(model, target=HOST).run(x)[0], x["x"] * 2.5)


def test_benchmark(tiny_compiled):
    r = tiny_compiled.benchmark(repeat=5, warmup=1)
    assert r["repeat"] == 5 and 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
    with pytest.raises(InputError, match="repeat"):
        tiny_compiled.benchmark(repeat=0)


def test_export_writes_library_and_manifest(tiny_compiled, tiny_exported):
    manifest = json.loads(tiny_exported.with_suffix(".json").read_text())
    assert tiny_exported.stat().st_size > 0
    assert manifest["inputs"] == [{"name": "input", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert manifest["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32"}]
    assert manifest["target"]["name"] == HOST and manifest["target"]["config"]["kind"] == "llvm"
    assert manifest["versions"]["tvm"].startswith("0.27") and manifest["versions"]["tvmfuse"] == tvmfuse.__version__
    assert manifest["versions"]["tvm_ffi"] == "0.1.14.post0"
    assert manifest["model"] == "zoo:tiny_convnet" and manifest["kernels"]


def test_export_needs_so_suffix(tiny_compiled, tmp_path):
    with pytest.raises(TvmfuseError, match=r"\.so"):
        tiny_compiled.export(tmp_path / "model.dll")
    assert not list(tmp_path.iterdir())


def test_loaded_in_process_matches(tiny_compiled, tiny_exported):
    loaded = tvmfuse.load(tiny_exported)
    np.testing.assert_array_equal(loaded.run(_x())[0], tiny_compiled.run(_x())[0])
    assert loaded.benchmark(repeat=3, warmup=0)["median_ms"] > 0
    with pytest.raises(InputError):
        loaded.run({"input": np.zeros((2, 3, 32, 32), "float32")})


def test_compile_progress_lines(capsys):
    tvmfuse.compile("zoo:tiny_convnet", target=HOST, progress=True)
    err = capsys.readouterr().err
    assert "[1/3] import ONNX" in err and "[3/3] build for x86-host" in err


def test_compile_warns_when_this_machine_cannot_run_the_library(monkeypatch):
    import warnings

    from tvmfuse import targets

    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        pytest.skip("this CPU cannot stand in for an AVX2 one")
    monkeypatch.setenv(targets.HOST_CPU_ENV, "znver3")
    with pytest.warns(UserWarning, match=r"target x86-avx512 uses CPU features this machine lacks \(avx512"):
        tvmfuse.compile("zoo:tiny_convnet", target="x86-avx512")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = tvmfuse.compile("zoo:tiny_convnet")  # the default: this machine
    assert not [w for w in caught if "lacks" in str(w.message)]
    assert cm.target.name == "x86-host" and cm.target.config["mcpu"] == "znver3"


def test_warnings_point_at_the_callers_line(monkeypatch):
    import warnings

    from tvmfuse import targets

    if not {"avx2", "fma"} <= targets._cpuinfo_flags():
        pytest.skip("this CPU cannot stand in for an AVX2 one")
    monkeypatch.setenv(targets.HOST_CPU_ENV, "znver3")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tvmfuse.quantize("zoo:tiny_convnet", calib="random:1", target="x86-avx512")
    mine = [w for w in caught if "lacks" in str(w.message) or "random batches" in str(w.message)]
    assert len(mine) == 2 and all(w.filename == __file__ for w in mine), [(w.filename, w.message) for w in mine]


def test_outputs_are_arrays_of_their_own():
    """``run`` reuses its input tensors and returns outputs copied out of the VM's: an output that is the input
    itself, or a constant of the library, is not changed by the next call, nor the library by the caller."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.arange(4, dtype=np.float32)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["k"], ["z"])],
                              "same", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(table, "k")])
    cm = tvmfuse.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
                         target="x86-host")
    first = cm.run({"x": np.ones(4, np.float32)})
    first[1][:] = -1  # the caller's copy
    second = cm.run({"x": np.full(4, 2, np.float32)})
    np.testing.assert_array_equal(first[0], np.ones(4))
    np.testing.assert_array_equal(second[0], np.full(4, 2))
    np.testing.assert_array_equal(second[1], table)
