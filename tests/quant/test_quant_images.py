"""Calibration from what users have: a folder of images with a stated preprocessing, and random:N."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tvmfuse.quant.data import CalibrationDataError, load_calibration_data
from tvmfuse.quant.images import PRESETS, Preprocess, load_images, preprocess_of
from tvmfuse.quant.table import CalibrationError
from tvmfuse.tensors import TensorInfo

Image = pytest.importorskip("PIL.Image")

INPUT = TensorInfo("input", (1, 3, 4, 6), "float32")


def _solid(folder, name, rgb, size=(6, 4)):
    folder.mkdir(exist_ok=True)
    Image.new("RGB", size, rgb).save(folder / name)  # lossless PNG: every pixel exactly rgb
    return folder / name


def test_imagenet_preset_normalises_each_channel(tmp_path):
    _solid(tmp_path / "imgs", "a.png", (255, 0, 51))
    _solid(tmp_path / "imgs", "b.png", (0, 128, 255))
    x = load_images(tmp_path / "imgs", INPUT, PRESETS["imagenet"])
    assert x.shape == (2, 3, 4, 6) and x.dtype == np.float32
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    for sample, rgb in zip(x, [(255, 0, 51), (0, 128, 255)]):
        want = (np.array(rgb) / 255 - mean) / std
        np.testing.assert_allclose(sample.reshape(3, -1), np.repeat(want[:, None], 24, axis=1), rtol=1e-5)


def test_layout_bgr_resize_and_grey(tmp_path):
    _solid(tmp_path / "imgs", "a.png", (10, 20, 30), size=(17, 9))  # resized to the input's 4 x 6
    nhwc = TensorInfo("x", (1, 4, 6, 3), "float32")
    x = load_images(tmp_path / "imgs", nhwc, preprocess_of("raw", layout="NHWC", bgr=True))
    assert x.shape == (1, 4, 6, 3)
    np.testing.assert_allclose(x[0, 0, 0], [30, 20, 10])
    grey = load_images(tmp_path / "imgs", TensorInfo("x", (1, 1, 4, 6), "float32"), PRESETS["unit"])
    assert grey.shape == (1, 1, 4, 6) and 0 < grey.max() < 1


def test_preprocess_parts_and_errors():
    p = preprocess_of("symmetric", mean=(0.4, 0.5, 0.6))
    assert p.mean == (0.4, 0.5, 0.6) and p.std == (0.5,)
    assert preprocess_of(None, mean=0.5, std=0.25) == Preprocess(mean=(0.5,), std=(0.25,))
    for kwargs, message in (({"preset": None}, "preset"), ({"preset": "coco"}, "unknown preprocessing preset"),
                            ({"preset": "unit", "std": (1, 0, 1)}, "none of them 0"),
                            ({"preset": "unit", "layout": "CHW"}, "not NCHW or NHWC")):
        preset = kwargs.pop("preset")
        with pytest.raises(CalibrationError, match=message):
            preprocess_of(preset, **kwargs)


def test_folders_that_cannot_calibrate_say_why(tmp_path):
    _solid(tmp_path / "imgs", "a.png", (1, 2, 3))
    with pytest.raises(CalibrationDataError, match=r"images need their preprocessing.*preprocess=imagenet"):
        load_calibration_data(tmp_path / "imgs", [INPUT])
    with pytest.raises(CalibrationDataError, match="images calibrate a model with one input"):
        load_calibration_data(tmp_path / "imgs", [INPUT, TensorInfo("ids", (1, 4), "int64")], "unit")
    with pytest.raises(CalibrationError, match="has 5 channels"):
        load_images(tmp_path / "imgs", TensorInfo("x", (1, 5, 4, 6), "float32"), PRESETS["unit"])
    (tmp_path / "imgs" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(CalibrationError, match="broken.jpg: cannot read as an image"):
        load_calibration_data(tmp_path / "imgs", [INPUT], "unit")
    np.save(tmp_path / "imgs" / "x.npy", np.zeros((3, 4, 6), np.float32))
    with pytest.raises(CalibrationDataError, match="both .npy files and images"):
        load_calibration_data(tmp_path / "imgs", [INPUT], "unit")


def test_a_folder_of_images_becomes_batches_of_the_model_batch_size(tmp_path):
    for i in range(4):
        _solid(tmp_path / "imgs", f"{i}.png", (i * 60, 100, 200))
    batches = load_calibration_data(tmp_path / "imgs", [TensorInfo("input", (2, 3, 4, 6), "float32")], "unit")
    assert len(batches) == 2 and batches[0]["input"].shape == (2, 3, 4, 6)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tvmfuse", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_cli_quantizes_from_jpegs_and_from_random_data(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(4):  # photographs are not solid colours: noise, saved lossy
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(folder / f"p{i}.jpg", quality=90)
    lib = tmp_path / "q.so"
    done = _cli("quantize", "zoo:tiny_convnet", "--calib", folder, "--preprocess", "imagenet", "-o", lib, "-q")
    assert done.returncode == 0, done.stderr
    q = json.loads(lib.with_suffix(".json").read_text())["quantization"]
    assert q["calibration_batches"] == 4 and q["calibration_data"] == f"{folder} (images, preprocess " \
        "Preprocess(scale=0.00392156862745098, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), " \
        "layout='NCHW', bgr=False))"
    assert q["int8_partitions"] > 0
    plain = _cli("quantize", "zoo:tiny_convnet", "--calib", folder, "-o", tmp_path / "r.so", "-q")
    assert plain.returncode == 2 and len(plain.stderr.strip().splitlines()) == 1
    assert "images need their preprocessing, as the model was trained: --preprocess imagenet|unit|symmetric|raw " \
           "or --mean and --std" in plain.stderr
    rand = _cli("quantize", "zoo:tiny_convnet", "--calib", "random:3", "-o", tmp_path / "r.so", "-q")
    assert rand.returncode == 0, rand.stderr
    assert "tvmfuse quantize: warning: calibrating on 3 random batches" in rand.stderr
    assert json.loads((tmp_path / "r.json").read_text())["quantization"]["calibration_data"] == "random:3"
    misplaced = _cli("quantize", "zoo:tiny_convnet", "--calib", "random:3", "--preprocess", "unit", "-o",
                     tmp_path / "s.so", "-q")
    assert misplaced.returncode == 2 and "apply to a folder of images given to --calib" in misplaced.stderr
    bad = _cli("quantize", "zoo:tiny_convnet", "--calib", "random:x", "-o", tmp_path / "s.so", "-q")
    assert bad.returncode == 2 and "random:N takes a whole number" in bad.stderr
    assert not (tmp_path / "s.so").exists()


def test_help_shows_calib_or_table_as_required():
    out = _cli("quantize", "--help").stdout
    assert out.startswith("usage: tvmfuse quantize MODEL (--calib DATA | --table TABLE) -o OUT.so")
    words = " ".join(out.split())  # argparse wraps the help
    assert "required unless --table" in words and "random:N" in words and "axis 0 the samples" in words
