"""Calibrators: observe the values one tensor takes over the calibration set, then choose its range.

Each calibrator takes numpy batches one at a time (:meth:`observe`) and keeps a small summary, never the
data; :meth:`range` then returns ``(lo, hi)``. Methods (the registry :data:`METHODS`):

``minmax``
    The running minimum and maximum.
``percentile`` (option ``percentile``, default 99.99)
    Cuts ``100 - percentile`` percent of the values off the tails of a histogram. Both tails are treated
    alike: each loses half of that share, except that a tensor that never goes below 0 (a ReLU output)
    keeps ``lo = 0`` and its upper tail loses the whole share (and likewise for one that never goes above
    0). The bounds never go past the observed min/max.
``entropy`` (options ``num_bins`` 2048, ``num_quantized_bins`` 128)
    The TensorRT/MXNet method: a histogram of ``|x|``; for each candidate threshold (a bin edge) the
    histogram clipped there (P, outliers added to its last bin) is compared with P quantized to ``levels``
    levels and expanded back (Q); the threshold ``t`` with the least KL(P || Q) wins. ``levels`` is
    ``num_quantized_bins`` (128: one side of a symmetric 8-bit grid) for tensors of both signs and twice
    that for tensors of one sign (a ReLU output gets all 256 u8 levels over ``[0, t]``, as NVIDIA's
    calibrator does for unsigned tensors); candidates start at ``levels`` bins. Bin 0, where the exact zeros
    of ReLU and padding pile up, is given its neighbour's count (also NVIDIA's): zeros are exact under any
    scale and should not drag the threshold down. The range is ``[0, t]`` for tensors that never go below
    0, ``[-t, 0]`` for ones never above 0, else ``[-t, t]``, each clamped to the observed min/max.

Histograms (:class:`AbsHistogram`) cover ``[0, R]`` with a fixed number of bins. When a batch holds a value
beyond ``R``, ``R`` grows by a power of two and adjacent bins are summed, so no count is ever lost and the
memory stays constant; only the resolution of earlier batches coarsens.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .table import CalibrationError


def _finite_values(array) -> np.ndarray:
    """``array`` flattened to float64; raises CalibrationError on NaN or infinity."""
    values = np.asarray(array).ravel()
    if values.dtype.kind not in "fiub":
        raise CalibrationError(f"calibrators observe numeric arrays, got dtype {values.dtype}")
    values = values.astype(np.float64, copy=False)
    if not np.all(np.isfinite(values)):
        bad = int(np.count_nonzero(~np.isfinite(values)))
        raise CalibrationError(f"{bad} of {values.size} observed values are NaN or infinite")
    return values


class MinMaxCalibrator:
    """The running minimum and maximum over every observed value."""

    method = "minmax"

    def __init__(self):
        self.lo, self.hi = math.inf, -math.inf

    def options(self) -> dict:
        """The options this calibrator was created with (JSON values)."""
        return {}

    def observe(self, array) -> None:
        """Fold one batch of values into the summary (empty arrays are ignored)."""
        values = _finite_values(array)
        if values.size:
            self.lo, self.hi = min(self.lo, float(values.min())), max(self.hi, float(values.max()))

    def range(self) -> tuple[float, float]:
        """``(lo, hi)``; raises CalibrationError when nothing was observed."""
        if self.lo > self.hi:
            raise CalibrationError("no values were observed")
        return self.lo, self.hi


class AbsHistogram:
    """Histograms of the positive values and of the magnitudes of the negative ones, on shared bins.

    Bin ``i`` of both covers ``[i * R / num_bins, (i + 1) * R / num_bins)`` (the last bin includes ``R``);
    zeros count in bin 0 of ``pos``. ``R`` is the largest magnitude of the first batch holding a nonzero value
    and grows by powers of two (merging adjacent bins) to hold later batches.

    Attributes
    ----------
    pos, neg : numpy.ndarray
        int64 counts, ``num_bins`` each.
    limit : float
        ``R``, 0 until a nonzero value arrives.
    lo, hi : float
        The exact minimum and maximum observed.
    """

    def __init__(self, num_bins: int = 2048):
        self.num_bins = num_bins
        self.pos = np.zeros(num_bins, dtype=np.int64)
        self.neg = np.zeros(num_bins, dtype=np.int64)
        self.limit = 0.0
        self.lo, self.hi = math.inf, -math.inf

    @property
    def total(self) -> int:
        return int(self.pos.sum() + self.neg.sum())

    @property
    def width(self) -> float:
        return self.limit / self.num_bins

    def _grow(self, amax: float) -> None:
        """Widen the bins by the power of two ``f`` that makes ``limit * f >= amax``, summing ``f`` bins into one."""
        if self.limit == 0.0:  # only zeros so far, all in bin 0 whatever the width
            self.limit = amax
            return
        factor = 2 ** math.ceil(math.log2(amax / self.limit))
        while self.limit * factor < amax:  # guard against log2 rounding down
            factor *= 2
        kept = -(-self.num_bins // factor)
        for counts in (self.pos, self.neg):
            if factor >= self.num_bins:  # every old bin falls into the new first one
                merged = np.array([counts.sum()])
            else:
                padded = np.zeros(kept * factor, dtype=np.int64)
                padded[:self.num_bins] = counts
                merged = padded.reshape(kept, factor).sum(axis=1)
            counts[:] = 0
            counts[:kept] = merged
        self.limit *= factor

    def _bins(self, magnitudes: np.ndarray) -> np.ndarray:
        if self.limit == 0.0:
            return np.zeros(magnitudes.size, dtype=np.int64)
        index = (magnitudes * (self.num_bins / self.limit)).astype(np.int64)
        return np.minimum(index, self.num_bins - 1)

    def add(self, array) -> None:
        """Count the values of ``array``."""
        values = _finite_values(array)
        if not values.size:
            return
        self.lo, self.hi = min(self.lo, float(values.min())), max(self.hi, float(values.max()))
        amax = max(-self.lo, self.hi)
        if amax > self.limit:
            self._grow(amax)
        negative = values < 0
        self.pos += np.bincount(self._bins(values[~negative]), minlength=self.num_bins)
        self.neg += np.bincount(self._bins(-values[negative]), minlength=self.num_bins)

    def quantile(self, counts: np.ndarray, fraction: float) -> float:
        """The magnitude below which ``fraction`` of ``counts`` lie, interpolated linearly inside its bin."""
        total = counts.sum()
        if total == 0:
            return 0.0
        cumulative = np.cumsum(counts)
        target = fraction * total
        i = int(np.searchsorted(cumulative, target, side="left"))
        i = min(i, self.num_bins - 1)
        before = cumulative[i - 1] if i else 0
        inside = (target - before) / counts[i] if counts[i] else 0.0
        return float((i + min(max(inside, 0.0), 1.0)) * self.width)


class _HistogramCalibrator:
    """Shared parts of the histogram methods."""

    method = ""

    def __init__(self, num_bins: int):
        if not isinstance(num_bins, numbers.Integral) or num_bins < 2:
            raise CalibrationError(f"{self.method}: num_bins must be an integer >= 2, got {num_bins!r}")
        self.histogram = AbsHistogram(int(num_bins))

    def observe(self, array) -> None:
        """Fold one batch of values into the histogram (empty arrays are ignored)."""
        self.histogram.add(array)

    def _checked(self) -> AbsHistogram:
        if self.histogram.total == 0:
            raise CalibrationError("no values were observed")
        return self.histogram


class PercentileCalibrator(_HistogramCalibrator):
    """Range that leaves out ``100 - percentile`` percent of the values, split between the tails.

    Parameters
    ----------
    percentile : float
        In (0, 100]; 100 gives the min/max (up to the histogram's resolution).
    num_bins : int
        Histogram bins.
    """

    method = "percentile"

    def __init__(self, percentile: float = 99.99, num_bins: int = 2048):
        if not isinstance(percentile, numbers.Real) or not 0 < percentile <= 100:
            raise CalibrationError(f"percentile must be a number in (0, 100], got {percentile!r}")
        super().__init__(num_bins)
        self.percentile = float(percentile)

    def options(self) -> dict:
        """The options this calibrator was created with (JSON values)."""
        return {"percentile": self.percentile, "num_bins": self.histogram.num_bins}

    def range(self) -> tuple[float, float]:
        """``(lo, hi)`` at the percentile; raises CalibrationError when nothing was observed."""
        h = self._checked()
        cut = (100.0 - self.percentile) / 100.0
        # Share of all values cut off each tail; a tensor of one sign spends the whole share on its one tail.
        up, down = (cut, 0.0) if h.lo >= 0 else (0.0, cut) if h.hi <= 0 else (cut / 2, cut / 2)
        total = h.total
        hi = 0.0 if h.hi <= 0 else min(h.quantile(h.pos, max(1.0 - up * total / h.pos.sum(), 0.0)), h.hi)
        lo = 0.0 if h.lo >= 0 else max(-h.quantile(h.neg, max(1.0 - down * total / h.neg.sum(), 0.0)), h.lo)
        return float(lo), float(hi)


class EntropyCalibrator(_HistogramCalibrator):
    """Threshold minimising the KL divergence between the clipped and the quantized histogram of ``|x|``.

    Parameters
    ----------
    num_bins : int
        Histogram bins (2048 as TensorRT).
    num_quantized_bins : int
        Quantization levels per sign the candidates are compared at (128: one side of an 8-bit grid;
        doubled for tensors of one sign), also the fewest bins a candidate threshold spans.
    """

    method = "entropy"

    def __init__(self, num_bins: int = 2048, num_quantized_bins: int = 128):
        super().__init__(num_bins)
        if not isinstance(num_quantized_bins, numbers.Integral) or not 2 <= num_quantized_bins <= num_bins:
            raise CalibrationError(f"entropy: num_quantized_bins must be an integer in [2, num_bins={num_bins}], "
                                   f"got {num_quantized_bins!r}")
        self.num_quantized_bins = int(num_quantized_bins)

    def options(self) -> dict:
        """The options this calibrator was created with (JSON values)."""
        return {"num_bins": self.histogram.num_bins, "num_quantized_bins": self.num_quantized_bins}

    def threshold(self) -> float:
        """The magnitude threshold ``t`` with the least KL divergence."""
        h = self._checked()
        amax = max(-h.lo, h.hi)
        counts = (h.pos + h.neg).astype(np.float64)
        # Bin 0 is dominated by exact zeros (ReLU, padding) that any scale represents exactly: like NVIDIA's
        # calibrator, give it its neighbour's count so the zero spike does not pull the threshold down.
        counts[0] = counts[1]
        # A one-signed tensor spreads all 256 u8 levels over [0, t]; a two-signed one has 128 per side.
        levels = self.num_quantized_bins * (2 if h.lo >= 0 or h.hi <= 0 else 1)
        levels = min(levels, h.num_bins)
        last = int(np.flatnonzero(counts)[-1]) + 1 if counts.any() else 0
        if last <= levels:  # every value already fits in the smallest candidate
            return min(last * h.width, amax)
        best = levels + int(np.argmin(kl_divergences(counts, levels, last, levels)))
        return min(best * h.width, amax)

    def range(self) -> tuple[float, float]:
        """``(lo, hi)`` from the threshold (see the module docstring); raises when nothing was observed."""
        t = self.threshold()
        h = self.histogram
        lo = 0.0 if h.lo >= 0 else max(-t, h.lo)
        hi = 0.0 if h.hi <= 0 else min(t, h.hi)
        return float(lo), float(hi)


def _smooth(counts: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Move ``eps`` of mass onto each empty bin, taken evenly from the others (MXNet's smoothing).

    Applied to counts (not probabilities), as MXNet and ONNX Runtime do, so the mass moved is negligible
    next to a count of 1; a bin it would empty keeps ``eps``.
    """
    zeros = counts == 0
    n_zeros = int(zeros.sum())
    if n_zeros == 0 or n_zeros == counts.size:
        return counts
    smoothed = counts + eps * zeros - (eps * n_zeros / (counts.size - n_zeros)) * ~zeros
    return np.where(smoothed > 0, smoothed, eps)


def kl_divergence(counts: np.ndarray, bins: int, levels: int) -> float:
    """KL(P || Q) of clipping the histogram ``counts`` after ``bins`` bins and quantizing to ``levels``.

    P is ``counts[:bins]`` with every count beyond added to its last bin. Q merges ``counts[:bins]`` into
    ``levels`` groups of ``bins // levels`` bins (the last group takes the remainder) and spreads each group's
    count evenly over the bins where P is nonzero. Both are smoothed, then normalised, before comparing.
    """
    sliced = counts[:bins]
    p = sliced.copy()
    p[-1] += counts[bins:].sum()
    nonzero = p != 0
    starts = np.arange(levels) * (bins // levels)
    group_sum = np.add.reduceat(sliced, starts)
    group_nonzero = np.add.reduceat(nonzero.astype(np.float64), starts)
    lengths = np.diff(np.append(starts, bins))
    per_bin = np.divide(group_sum, group_nonzero, out=np.zeros(levels), where=group_nonzero > 0)
    q = np.where(nonzero, np.repeat(per_bin, lengths), 0.0)
    if q.sum() == 0:
        return math.inf
    p, q = _smooth(p), _smooth(q)
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(p * np.log(p / q)))


_ROWS = 32  # candidates computed together: (32, up to 2048) float64 arrays stay in the core's cache


def kl_divergences(counts: np.ndarray, first: int, last: int, levels: int) -> np.ndarray:
    """``kl_divergence(counts, i, levels)`` for every ``i`` from ``first`` to ``last``, computed for many ``i`` at
    once with the same operations (the sums taken in another order: equal to about 1e-15 relative).

    One call per candidate costs some 25 small numpy calls, and a histogram has up to 1,900 candidates: 95 ms a
    tensor, 5 s of calibrating MobileNetV2's 55 tensors. Here the candidates sharing a group width
    (``i // levels``) go ``_ROWS`` at a time as the rows of one array, zero past each row's own ``i``; the
    groups' sums come from prefix sums of the counts (whole numbers: exact in float64 in any order).
    """
    eps = 1e-4
    counts = np.asarray(counts, dtype=np.float64)
    tail = np.append(np.cumsum(counts[::-1])[::-1], 0.0)  # tail[i]: everything from bin i on
    prefix, prefix_nonzero = np.append(0.0, np.cumsum(counts)), np.append(0, np.cumsum(counts != 0))
    out = np.empty(last - first + 1)
    start = first
    while start <= last:
        width = start // levels
        stop = min(last, (width + 1) * levels - 1, start + _ROWS - 1)
        bins = np.arange(start, stop + 1)
        rows, cols, full = np.arange(len(bins)), np.arange(stop), (levels - 1) * width
        inside = cols < bins[:, None]
        p = counts[:stop] * inside
        p[rows, bins - 1] += tail[bins]  # P: the clipped mass on its last bin
        nonzero = p != 0
        edges = np.arange(levels) * width  # groups [g w, (g + 1) w), the last one up to the row's i
        group_sum = np.empty((len(bins), levels))
        group_nonzero = np.empty((len(bins), levels))
        group_sum[:, :-1] = prefix[edges[1:]] - prefix[edges[:-1]]
        group_sum[:, -1] = prefix[bins] - prefix[full]
        group_nonzero[:, :-1] = prefix_nonzero[edges[1:]] - prefix_nonzero[edges[:-1]]
        group_nonzero[:, -1] = (prefix_nonzero[bins] - prefix_nonzero[full] - (counts[bins - 1] != 0)
                                + nonzero[rows, bins - 1])
        per_bin = np.divide(group_sum, group_nonzero, out=np.zeros_like(group_sum), where=group_nonzero > 0)
        q = np.empty_like(p)
        q[:, :full] = np.repeat(per_bin[:, :-1], width, axis=1)
        q[:, full:] = per_bin[:, -1:]
        q *= nonzero
        empty = q.sum(axis=1) == 0
        p, q = _smooth_rows(p, inside, nonzero, bins, eps), _smooth_rows(q, inside, q != 0, bins, eps)
        with np.errstate(divide="ignore", invalid="ignore"):  # the empty rows' NaN: set to inf below
            p /= p.sum(axis=1, keepdims=True)
            q /= q.sum(axis=1, keepdims=True)
            divergence = (p * np.log(np.divide(p, q, out=np.ones_like(p), where=inside))).sum(axis=1)
        divergence[empty] = math.inf
        out[start - first:stop - first + 1] = divergence
        start = stop + 1
    return out


def _smooth_rows(counts: np.ndarray, inside: np.ndarray, nonzero: np.ndarray, sizes: np.ndarray,
                 eps: float) -> np.ndarray:
    """:func:`_smooth` of each row's first ``sizes`` entries (``inside``, where ``nonzero`` lies); the rest stay
    zero. The same values: a nonzero count less the mass taken, ``eps`` on an empty bin."""
    n_zeros = sizes - nonzero.sum(axis=1)
    smooth = (n_zeros > 0) & (n_zeros < sizes)
    take = np.where(smooth, eps * n_zeros / np.maximum(sizes - n_zeros, 1), 0.0)
    out = np.where(nonzero, counts - take[:, None], inside * (eps * smooth)[:, None])
    if (np.where(nonzero, out, 1.0) <= 0).any():  # a count the taking would empty keeps eps
        out[nonzero & (out <= 0)] = eps
    return out


METHODS = {"minmax": MinMaxCalibrator, "entropy": EntropyCalibrator, "percentile": PercentileCalibrator}


def create_calibrator(method: str, **options):
    """A fresh calibrator of ``method`` (a key of :data:`METHODS`) with its options.

    Raises
    ------
    CalibrationError
        For an unknown method (listing the known ones) or an option the method does not take or accept.
    """
    if method not in METHODS:
        raise CalibrationError(f"unknown calibration method {method!r}; known methods: {', '.join(METHODS)}")
    cls = METHODS[method]
    try:
        return cls(**options)
    except TypeError:
        import inspect

        accepted = [p for p in inspect.signature(cls).parameters]
        raise CalibrationError(f"calibration method {method!r} takes option(s) {accepted or 'none'}, got "
                               f"{sorted(options)}") from None
