"""Calibration data: .npz and .npy-directory layouts, batching, and a clear error for each bad input."""

from __future__ import annotations

import numpy as np
import pytest

from tvmfuse.quant.data import CalibrationDataError, check_batch, load_calibration_data
from tvmfuse.quant.table import CalibrationError
from tvmfuse.tensors import TensorInfo

IMAGE = TensorInfo("input", (2, 3, 4, 4), "float32")
IDS = TensorInfo("token_ids", (2, 5), "int64")
RNG = np.random.default_rng(0)


def _samples(n, info=IMAGE):
    shape = (n,) + tuple(info.shape[1:])
    if info.dtype == "int64":
        return RNG.integers(0, 100, shape).astype(np.int64)
    return RNG.standard_normal(shape).astype(info.dtype)


def test_npz_samples_are_cut_into_batches_of_the_model_batch_size(tmp_path):
    x = _samples(6)
    np.savez(tmp_path / "d.npz", input=x)
    batches = load_calibration_data(tmp_path / "d.npz", [IMAGE])
    assert len(batches) == 3
    for b, batch in enumerate(batches):
        assert list(batch) == ["input"] and batch["input"].shape == (2, 3, 4, 4)
        np.testing.assert_array_equal(batch["input"], x[2 * b:2 * b + 2])


def test_npz_of_whole_batches_and_several_inputs(tmp_path):
    x, ids = _samples(4).reshape(2, 2, 3, 4, 4), _samples(4, IDS)
    np.savez(tmp_path / "d.npz", input=x, token_ids=ids)
    batches = load_calibration_data(str(tmp_path / "d.npz"), [IMAGE, IDS])
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[1]["input"], x[1])
    np.testing.assert_array_equal(batches[1]["token_ids"], ids[2:])
    assert batches[0]["token_ids"].dtype == np.int64


def test_float64_is_cast_to_float32(tmp_path):
    x = _samples(2).astype(np.float64)
    np.savez(tmp_path / "d.npz", input=x)
    (batch,) = load_calibration_data(tmp_path / "d.npz", [IMAGE])
    assert batch["input"].dtype == np.float32
    np.testing.assert_array_equal(batch["input"], x.astype(np.float32))


def test_directory_single_input_any_names_in_natural_order(tmp_path):
    samples = _samples(12)
    for i in range(12):  # one sample per file; 'img_10' must come after 'img_9'
        np.save(tmp_path / f"img_{i}.npy", samples[i])
    batches = load_calibration_data(tmp_path, [IMAGE])
    assert len(batches) == 6
    np.testing.assert_array_equal(np.concatenate([b["input"] for b in batches]), samples)


def test_directory_files_may_hold_batches(tmp_path):
    x = _samples(4)
    np.save(tmp_path / "a.npy", x[:2])
    np.save(tmp_path / "b.npy", x[2:].reshape(1, 2, 3, 4, 4))
    batches = load_calibration_data(tmp_path, [IMAGE])
    np.testing.assert_array_equal(np.concatenate([b["input"] for b in batches]), x)


def test_directory_several_inputs_by_name_and_index(tmp_path):
    x, ids = _samples(4), _samples(4, IDS)
    for i in range(2):
        np.save(tmp_path / f"input_{i}.npy", x[2 * i:2 * i + 2])
        np.save(tmp_path / f"token_ids_{i}.npy", ids[2 * i:2 * i + 2])
    batches = load_calibration_data(tmp_path, [IMAGE, IDS])
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[1]["token_ids"], ids[2:])


def test_check_batch_accepts_float64_and_rejects_bad_shapes():
    batch = check_batch({"input": _samples(2).astype(np.float64)}, [IMAGE], "batch 0")
    assert batch["input"].dtype == np.float32
    with pytest.raises(CalibrationDataError, match=r"batch 3: input 'input' expects shape \(2, 3, 4, 4\), got \(1, 3, 4, 4\)"):
        check_batch({"input": _samples(1)}, [IMAGE], "batch 3")
    with pytest.raises(CalibrationDataError, match="dict of input name"):
        check_batch([1, 2], [IMAGE], "batch 0")


# ---- bad input: each a clear error naming the file and the input ----

def test_missing_path(tmp_path):
    with pytest.raises(CalibrationError, match="calibration data not found: .*nothing.npz"):  # the base class
        load_calibration_data(tmp_path / "nothing.npz", [IMAGE])


def test_unknown_and_missing_input_names(tmp_path):
    np.savez(tmp_path / "d.npz", images=_samples(2))
    with pytest.raises(CalibrationDataError, match=r"d.npz: unknown input name\(s\) \['images'\]; no data for "
                                                   r"input\(s\) \['input'\]; the model's inputs are 'input' \(2, 3, 4, 4\)"):
        load_calibration_data(tmp_path / "d.npz", [IMAGE])


def test_wrong_shape_shows_expected_and_given(tmp_path):
    np.savez(tmp_path / "d.npz", input=RNG.standard_normal((4, 3, 5, 5)).astype(np.float32))
    with pytest.raises(CalibrationDataError, match=r"d.npz: input 'input' \(2, 3, 4, 4\) float32 cannot take an "
                                                   r"array of shape \(4, 3, 5, 5\); expected one sample \(3, 4, 4\)"):
        load_calibration_data(tmp_path / "d.npz", [IMAGE])


def test_wrong_dtype(tmp_path):
    np.savez(tmp_path / "d.npz", input=_samples(2).astype(np.float16))
    with pytest.raises(CalibrationDataError, match="d.npz: input 'input' expects dtype float32, got float16"):
        load_calibration_data(tmp_path / "d.npz", [IMAGE])
    np.save(tmp_path / "token_ids_0.npy", _samples(2, IDS).astype(np.int32))
    np.save(tmp_path / "input_0.npy", _samples(2))
    with pytest.raises(CalibrationDataError, match="token_ids_0.npy: input 'token_ids' expects dtype int64, got int32"):
        load_calibration_data(tmp_path, [IMAGE, IDS])


def test_empty_sets(tmp_path):
    np.savez(tmp_path / "d.npz", input=np.zeros((0, 3, 4, 4), np.float32))
    with pytest.raises(CalibrationDataError, match="d.npz: empty calibration set"):
        load_calibration_data(tmp_path / "d.npz", [IMAGE])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CalibrationDataError, match="empty calibration set .no .npy files"):
        load_calibration_data(tmp_path / "empty", [IMAGE])


def test_sample_count_not_a_multiple_of_the_batch_size(tmp_path):
    np.savez(tmp_path / "d.npz", input=_samples(5))
    with pytest.raises(CalibrationDataError, match="5 samples, not a multiple of the model's batch size 2"):
        load_calibration_data(tmp_path / "d.npz", [IMAGE])


def test_inputs_with_different_sample_counts(tmp_path):
    np.savez(tmp_path / "d.npz", input=_samples(4), token_ids=_samples(2, IDS))
    with pytest.raises(CalibrationDataError, match="different numbers of batches"):
        load_calibration_data(tmp_path / "d.npz", [IMAGE, IDS])


def test_directory_naming_errors_for_several_inputs(tmp_path):
    np.save(tmp_path / "input_0.npy", _samples(2))
    np.save(tmp_path / "token_ids_1.npy", _samples(2, IDS))
    with pytest.raises(CalibrationDataError, match="inputs 'input' and 'token_ids' have files for different indices"):
        load_calibration_data(tmp_path, [IMAGE, IDS])
    np.save(tmp_path / "stray.npy", _samples(2))
    with pytest.raises(CalibrationDataError, match="stray.npy: for a model with several inputs, files must be named"):
        load_calibration_data(tmp_path, [IMAGE, IDS])


def test_corrupt_files(tmp_path):
    (tmp_path / "d.npz").write_bytes(b"PK\x03\x04 definitely not a zip")
    with pytest.raises(CalibrationDataError, match="d.npz: not a readable .npz archive"):
        load_calibration_data(tmp_path / "d.npz", [IMAGE])
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x.npy").write_bytes(b"garbage")
    with pytest.raises(CalibrationDataError, match="x.npy: not an .npy file"):
        load_calibration_data(tmp_path / "dir", [IMAGE])
    (tmp_path / "data.txt").write_text("1 2 3")
    with pytest.raises(CalibrationDataError, match="must be an .npz file or a directory"):
        load_calibration_data(tmp_path / "data.txt", [IMAGE])

