"""Calibrators on synthetic data whose right answer is known."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from tvmfuse.quant.calibrate import (METHODS, AbsHistogram, EntropyCalibrator, MinMaxCalibrator,
                                     PercentileCalibrator, create_calibrator, kl_divergence,
                                     kl_divergences)
from tvmfuse.quant.table import CalibrationError

RNG = np.random.default_rng(1234)
GAUSS = RNG.standard_normal(1_000_000)


def _observe_all(cal, batches):
    for b in batches:
        cal.observe(b)
    return cal.range()


def test_registry_and_factory():
    assert set(METHODS) == {"minmax", "entropy", "percentile"}
    assert isinstance(create_calibrator("minmax"), MinMaxCalibrator)
    assert isinstance(create_calibrator("entropy", num_bins=512), EntropyCalibrator)
    assert create_calibrator("percentile", percentile=99.0).percentile == 99.0


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(CalibrationError, match="unknown calibration method 'kl'.*minmax, entropy, percentile"):
        create_calibrator("kl")


@pytest.mark.parametrize("method, options, match", [
    ("minmax", {"percentile": 99.0}, r"'minmax' takes option\(s\) none"),
    ("percentile", {"bins": 10}, "percentile.*num_bins"),
    ("percentile", {"percentile": 0}, r"\(0, 100\]"),
    ("percentile", {"percentile": 100.5}, r"\(0, 100\]"),
    ("entropy", {"num_quantized_bins": 4096}, "num_quantized_bins"),
    ("entropy", {"num_bins": 1}, "num_bins"),
])
def test_bad_options_are_clear_errors(method, options, match):
    with pytest.raises(CalibrationError, match=match):
        create_calibrator(method, **options)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_range_before_any_data_is_an_error(method):
    cal = create_calibrator(method)
    cal.observe(np.zeros(0, np.float32))
    with pytest.raises(CalibrationError, match="no values were observed"):
        cal.range()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_non_finite_values_are_an_error(method):
    with pytest.raises(CalibrationError, match="1 of 3 observed values are NaN or infinite"):
        create_calibrator(method).observe(np.array([1.0, np.nan, 2.0], np.float32))


def test_minmax_uniform_is_exact_and_incremental_equals_one_batch():
    data = RNG.uniform(-2.5, 7.0, 100_000).astype(np.float32)
    whole = _observe_all(MinMaxCalibrator(), [data])
    assert whole == (float(data.min()), float(data.max()))
    assert _observe_all(MinMaxCalibrator(), np.array_split(data, 13)) == whole


def test_percentile_gaussian_matches_analytic_quantile():
    lo, hi = _observe_all(PercentileCalibrator(percentile=99.0), np.array_split(GAUSS, 8))
    expected = NormalDist().inv_cdf(1 - 0.01 / 2)  # each tail loses half of the 1 %
    # The sample quantile of 1e6 draws is within ~0.005 of the analytic one (1 sigma).
    assert hi == pytest.approx(expected, abs=0.02)
    assert lo == pytest.approx(-expected, abs=0.02)


def test_percentile_matches_the_sample_quantile_within_a_bin():
    cal = PercentileCalibrator(percentile=99.9)
    lo, hi = _observe_all(cal, np.array_split(GAUSS, 8))
    want_lo, want_hi = np.quantile(GAUSS, [0.0005, 0.9995])
    assert lo == pytest.approx(want_lo, abs=cal.histogram.width)
    assert hi == pytest.approx(want_hi, abs=cal.histogram.width)


def test_percentile_one_signed_tensor_spends_the_whole_share_on_its_tail():
    # |N(0, 1)| (a ReLU-like tensor): P(|x| > t) = 0.1 % at t = inv_cdf(1 - 0.0005).
    lo, hi = _observe_all(PercentileCalibrator(percentile=99.9), [np.abs(GAUSS)])
    assert lo == 0.0
    assert hi == pytest.approx(NormalDist().inv_cdf(1 - 0.0005), abs=0.03)
    lo, hi = _observe_all(PercentileCalibrator(percentile=99.9), [-np.abs(GAUSS)])
    assert hi == 0.0 and lo == pytest.approx(-NormalDist().inv_cdf(1 - 0.0005), abs=0.03)


def test_percentile_100_is_the_min_max():
    data = RNG.uniform(-1.0, 3.0, 50_000)
    lo, hi = _observe_all(PercentileCalibrator(percentile=100), [data])
    width = 3.0 / 2048
    assert lo == pytest.approx(data.min(), abs=width) and hi == pytest.approx(data.max(), abs=width)
    assert data.min() <= lo and hi <= data.max()


def test_percentile_incremental_with_growing_range_within_a_bin_of_one_batch():
    # Batches of increasing spread force the histogram to grow (merging bins) several times.
    batches = [GAUSS[i::4] * (i + 1) / 4 for i in range(4)]
    one = _observe_all(PercentileCalibrator(percentile=99.0), [np.concatenate(batches)])
    cal = PercentileCalibrator(percentile=99.0)
    many = _observe_all(cal, batches)
    width = cal.histogram.width
    assert many == pytest.approx(one, abs=2 * width)


def test_histogram_growth_keeps_every_count():
    h = AbsHistogram(64)
    h.add(np.array([0.0, 0.5, -0.25]))
    h.add(np.array([3.0, -7.0, 0.0]))  # limit 0.5 -> 8 (x16): 64 bins merge 16 to 1
    h.add(np.array([100.0]))  # -> 128
    assert h.total == 7 and h.limit == 128.0
    # Bins are now 2 wide: 0, 0.5, 0 | 3 | 100 and 0.25 | 7 on the negative side.
    assert h.pos[0] == 3 and h.pos[1] == 1 and h.pos[50] == 1
    assert h.neg[0] == 1 and h.neg[3] == 1
    assert (h.lo, h.hi) == (-7.0, 100.0)


def test_histogram_growth_by_far_more_than_its_bins():
    h = AbsHistogram(64)
    h.add(np.array([1e-30, -1e-30]))
    h.add(np.array([1e30]))
    assert h.total == 3 and h.pos[0] == 1 and h.neg[0] == 1 and h.limit >= 1e30


def test_histogram_only_zeros_then_data():
    h = AbsHistogram(16)
    h.add(np.zeros(10))
    assert h.total == 10 and h.limit == 0.0
    h.add(np.array([4.0]))
    assert h.limit == 4.0 and h.pos[0] == 10 and h.pos[15] == 1


def _mxnet_kl(hist, bins, levels):
    """A literal transcription of MXNet's _get_optimal_threshold inner loop (loops, no vectorisation)."""
    sliced = hist[:bins].astype(np.float64)
    p = sliced.copy()
    p[bins - 1] += hist[bins:].sum()
    is_nonzero = (p != 0).astype(np.int64)
    merged = bins // levels
    quantized = np.zeros(levels)
    for j in range(levels):
        quantized[j] = sliced[j * merged:(j + 1) * merged].sum()
    quantized[-1] += sliced[levels * merged:].sum()
    q = np.zeros(bins)
    for j in range(levels):
        start = j * merged
        stop = bins if j == levels - 1 else start + merged
        norm = is_nonzero[start:stop].sum()
        if norm != 0:
            q[start:stop] = quantized[j] / norm
    q[p == 0] = 0

    def smooth(d, eps=1e-4):
        zeros = (d == 0).astype(np.float64)
        n_zeros = zeros.sum()
        n_nonzeros = d.size - n_zeros
        return d + eps * zeros - eps * n_zeros / n_nonzeros * (1 - zeros)

    p, q = smooth(p), smooth(q)
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(p * np.log(p / q)))


@pytest.mark.parametrize("bins", [16, 23, 40, 64])
def test_kl_divergence_matches_mxnet_reference(bins):
    hist = np.random.default_rng(bins).poisson(50, 64).astype(np.float64)
    hist[[3, 30, 41]] = 0
    assert kl_divergence(hist, bins, 16) == pytest.approx(_mxnet_kl(hist, bins, 16), rel=1e-9, abs=1e-12)


def _histograms():
    """Histograms as calibration makes them (whole counts, bin 0 as bin 1) and the unusual: a dense one, one
    with a sparse tail, one with five nonzero bins, one decaying over many magnitudes, one of fractions (whose
    smoothing empties bins: the clip to eps)."""
    rng = np.random.default_rng(5)
    dense = rng.poisson(rng.exponential(50, 2048)).astype(np.float64)
    sparse = rng.poisson(rng.exponential(50, 2048) * (rng.random(2048) < 0.7)).astype(np.float64)
    sparse[1650:] = 0
    few = np.zeros(2048)
    few[[0, 1, 5, 700, 2000]] = [10, 10, 3, 1, 1]
    decaying = rng.poisson(3000 * np.exp(-np.arange(2048) / 60)).astype(np.float64)
    fractions = rng.random(2048) * (rng.random(2048) < 0.1) * 1e-3
    for counts in (dense, sparse, few, decaying, fractions):
        counts[0] = counts[1]
    return {"dense": dense, "sparse": sparse, "few": few, "decaying": decaying, "fractions": fractions}


@pytest.mark.parametrize("levels", [128, 256])
@pytest.mark.parametrize("name", list(_histograms()))
def test_kl_divergences_are_kl_divergence_of_each_candidate(name, levels):
    counts = _histograms()[name]
    last = int(np.flatnonzero(counts)[-1]) + 1
    one_by_one = np.array([kl_divergence(counts, i, levels) for i in range(levels, last + 1)])
    batched = kl_divergences(counts, levels, last, levels)
    finite = np.isfinite(one_by_one)
    assert np.array_equal(np.isfinite(batched), finite)
    np.testing.assert_allclose(batched[finite], one_by_one[finite], rtol=1e-11)
    assert np.argmin(batched) == np.argmin(one_by_one)  # the threshold chosen


def test_entropy_ignores_a_few_huge_outliers():
    data = np.concatenate([GAUSS, [40.0, -38.0, 39.5, 35.0]])
    lo, hi = _observe_all(EntropyCalibrator(), np.array_split(RNG.permutation(data), 5))
    bulk = NormalDist().inv_cdf(1 - 1e-4)  # 99.98 % of the bulk lies within +-3.7
    assert bulk < hi < 40.0 / 4 and lo == -hi


def test_entropy_relu_output_range_starts_at_zero():
    relu = np.maximum(GAUSS, 0.0)  # half the values are exact zeros
    lo, hi = _observe_all(EntropyCalibrator(), [relu])
    assert lo == 0.0
    assert NormalDist().inv_cdf(0.999) < hi <= relu.max()


def test_entropy_negative_only_and_clamped_to_observed_extremes():
    lo, hi = _observe_all(EntropyCalibrator(), [-np.abs(GAUSS)])
    assert hi == 0.0 and lo < -3.0
    # Mixed signs with a short negative side: the threshold is clamped to the observed minimum.
    lo, hi = _observe_all(EntropyCalibrator(), [np.concatenate([np.abs(GAUSS), [-0.375]])])
    assert lo == -0.375 and hi > 3.0


def test_entropy_constant_and_zero_tensors():
    assert _observe_all(EntropyCalibrator(), [np.full(1000, 5.0)]) == (0.0, 5.0)
    assert _observe_all(EntropyCalibrator(), [np.zeros(1000)]) == (0.0, 0.0)


def test_entropy_incremental_equals_one_batch_when_the_first_batch_spans_the_range():
    data = np.concatenate([[30.0, -25.0], GAUSS])  # the first batch holds the extremes: no regrowth
    one = _observe_all(EntropyCalibrator(), [data])
    assert _observe_all(EntropyCalibrator(), np.array_split(data, 10)) == one


def test_entropy_incremental_is_close_to_one_batch_when_the_range_grows():
    data = np.concatenate([GAUSS, [30.0, -25.0]])
    one = _observe_all(EntropyCalibrator(), [data])
    # The outliers arrive last: the histogram grows 8x and its bins get coarser (36/2048 instead of
    # 30/2048), which moves the KL optimum on its flat bottom by some percent.
    many = _observe_all(EntropyCalibrator(), np.array_split(data, 10))
    assert many[1] == pytest.approx(one[1], rel=0.15)
    assert many[0] == -many[1]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_ranges_are_plain_floats_within_the_data(method):
    data = RNG.standard_normal(10_000)
    lo, hi = _observe_all(create_calibrator(method), [data])
    assert type(lo) is float and type(hi) is float
    assert data.min() <= lo < 0 < hi <= data.max() and math.isfinite(lo)
