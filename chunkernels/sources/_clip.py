"""κ-σ clipping of the background: the GPU lesson's ``ks_clipper_cpu`` on NumPy, CuPy and Dask.

NumPy arrays run the lesson's loop (:func:`clip_reference`). CuPy arrays and Dask arrays run the
same iteration as passes of the ``kappa_sigma_clip`` reduction kernel
(``chunkernels/kernels/kappa_sigma_clip.py``): each iteration is one pass that counts and sums the
values still kept and histograms their keys, then one (float32) to three (float64) passes that
refine the histogram bin holding the median until it is exact. Only a few numbers come back to
the host per pass.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from chunkernels import cluster, cuda
from chunkernels._apply import apply
from chunkernels._graph import in_memory_blocks, is_dask
from chunkernels.kernels import kappa_sigma_clip as ksc


class ClipResult(NamedTuple):
    """Statistics of the values κ-σ clipping keeps.

    Attributes
    ----------
    median
        Exact median of the kept values, as :func:`numpy.median` gives it (a NumPy scalar of the
        input's float type, float64 for integers; NaN when nothing is kept).
    std
        Population standard deviation of the kept values (``ddof=0``), computed in float64.
    count
        Number of kept values.
    iterations
        Clipping rounds performed: the number of times the lesson's loop computes a median and a
        standard deviation. When ``converged``, the last round clipped nothing.
    lower, upper
        The kept values are exactly those strictly inside ``(lower, upper)`` (float64): the
        intersection of every round's window ``median ± kappa * std``.
    mean
        Mean of the kept values (float64).
    converged
        Whether clipping stopped because a round clipped nothing (else ``max_iters`` stopped it).
    """

    median: np.floating
    std: float
    count: int
    iterations: int
    lower: float
    upper: float
    mean: float
    converged: bool


def kappa_sigma_clip(x, kappa=3.0, max_iters=None, return_mask=False):
    """κ-σ clip ``x``: repeatedly keep the values strictly inside ``median ± kappa * std``.

    The GPU lesson's ``ks_clipper_cpu`` (seed 002) with ``kappa`` for its 3: the median and the
    population standard deviation of the values still kept are computed, the values outside the
    open window ``(median - kappa * std, median + kappa * std)`` are dropped, and this repeats
    until a round drops nothing (or after ``max_iters`` rounds).

    Parameters
    ----------
    x : array_like, cupy.ndarray or dask.array.Array
        Data of any shape (it is clipped as one flat set of values): real integers, float32 or
        float64. Dask arrays may have NumPy or CuPy chunks; they are persisted first.
    kappa : float
        Half-width of the window in standard deviations, positive.
    max_iters : int or None
        Most clipping rounds; None clips until a round drops nothing.
    return_mask : bool
        Also return the mask of kept values.

    Returns
    -------
    ClipResult
        Median, standard deviation, count and window of the kept values.
    mask : numpy.ndarray, cupy.ndarray or dask.array.Array of bool
        Only with ``return_mask``: True where ``x`` is kept, ``(x > lower) & (x < upper)``, of
        ``x``'s array type (lazy for Dask).

    Raises
    ------
    ValueError
        ``kappa`` is not a positive finite number, or ``max_iters`` is not positive.
    TypeError
        ``x`` is not real integer or float32/float64 data, or ``max_iters`` is not an integer.

    Notes
    -----
    The median is exact (:func:`numpy.median`'s value, the mean of the two middle values for an
    even count, taken in the data's float type). The standard deviation is accumulated in float64
    whatever the data: NumPy's ``np.std`` of float32 data, which the lesson's loop calls,
    accumulates in float32, so its window edges can differ from these by a float32 rounding, and a
    value lying within that rounding of an edge may be kept by one and clipped by the other. The
    sums are shifted by the previous round's median, so they do not cancel.

    Any NaN makes the first round's median and standard deviation NaN, which clips everything
    (the lesson's loop does the same): the result keeps nothing. Infinite values give a NaN
    standard deviation, with the same effect.

    Examples
    --------
    >>> import numpy as np
    >>> from chunkernels.sources import kappa_sigma_clip
    >>> x = np.random.default_rng(0).standard_normal(100_000)
    >>> x[:100] = 50.0                              # outliers
    >>> stats = kappa_sigma_clip(x)
    >>> stats.count < x.size, abs(stats.std - 1) < 0.05
    (True, True)
    """
    kappa, max_iters = _check_arguments(kappa, max_iters)
    if not (is_dask(x) or cuda.is_cupy_array(x)):
        x = np.asarray(x)
    ksc.check_dtype(x.dtype)
    if is_dask(x):
        x = x.persist()
        result = _clip_dask(x, kappa, max_iters)
    elif cuda.is_cupy_array(x):
        result = _clip_with_passes(_DevicePasses([x]), x.dtype, kappa, max_iters)
    else:
        result = clip_reference(x, kappa, max_iters)
    if not return_mask:
        return result
    mask = apply(x, "threshold", value=np.float64(result.lower), upper=np.float64(result.upper))
    return result, mask


def _check_arguments(kappa, max_iters):
    if isinstance(kappa, bool) or not isinstance(kappa, numbers.Real) or not (
            math.isfinite(kappa) and kappa > 0):
        raise ValueError(f"kappa={kappa!r}; expected a positive finite number of standard "
                         f"deviations (the lesson uses 3)")
    if max_iters is not None:
        if isinstance(max_iters, bool) or not isinstance(max_iters, numbers.Integral):
            raise TypeError(f"max_iters={max_iters!r}; expected a positive integer or None "
                            f"(clip until a round clips nothing)")
        if max_iters < 1:
            raise ValueError(f"max_iters={max_iters}; expected a positive integer or None "
                             f"(clip until a round clips nothing)")
    return float(kappa), None if max_iters is None else int(max_iters)


def clip_reference(x, kappa=3.0, max_iters=None) -> ClipResult:
    """The lesson's ``ks_clipper_cpu`` on a NumPy array, with the standard deviation in float64.

    This loop defines :func:`kappa_sigma_clip`'s result: ``np.median`` and ``np.std(...,
    dtype=float64)`` of the kept values, the values strictly inside ``median ± kappa * std``
    (compared in float64) kept, until nothing more is clipped or after ``max_iters`` rounds.
    """
    data = np.asarray(x).reshape(-1)
    dtype = ksc.check_dtype(data.dtype)
    lower, upper = -math.inf, math.inf
    size_before, iterations = None, 0
    while True:
        median, std, mean = _stats_of(data, dtype)
        if size_before == data.size:
            return ClipResult(median, std, data.size, iterations, lower, upper, mean, True)
        if max_iters is not None and iterations == max_iters:
            return ClipResult(median, std, data.size, iterations, lower, upper, mean, False)
        iterations += 1
        lo, hi = _window(median, std, kappa)
        lower, upper = _intersect(lower, upper, lo, hi)
        size_before = data.size
        data = data[(data > np.float64(lo)) & (data < np.float64(hi))]


def _stats_of(data, dtype):
    """Median, float64 standard deviation and mean of a 1-D array (NaN when empty)."""
    if data.size == 0:
        return _median_type(dtype).type(np.nan), math.nan, math.nan
    with np.errstate(invalid="ignore", over="ignore"):
        return np.median(data), float(np.std(data, dtype=np.float64)), float(np.mean(data, dtype=np.float64))


def _median_type(dtype) -> np.dtype:
    """The type :func:`numpy.median` returns for data of ``dtype``."""
    return np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)


def _window(median, std, kappa):
    centre = float(median)
    return centre - kappa * std, centre + kappa * std


def _intersect(lower, upper, lo, hi):
    if math.isnan(lo) or math.isnan(lower):
        return math.nan, math.nan
    return max(lower, lo), min(upper, hi)


# -- passes -----------------------------------------------------------------------------------------

def _clip_with_passes(run, dtype, kappa, max_iters) -> ClipResult:
    """The lesson's loop with each round's statistics from passes of the kappa_sigma_clip kernel.

    ``run(**params)`` performs one pass over all the data and returns its result (a NumPy
    vector of ``ksc.HEAD`` values). The first pass sees every value; each later one only the
    values whose keys lie in the window kept so far, so NaNs are counted once, in the first.
    """
    dtype = ksc.check_dtype(dtype)
    window = ksc.all_keys(dtype)
    lower, upper = -math.inf, math.inf
    center = run.first_value()
    size_before, iterations, before = None, 0, None
    while True:
        head = run(window=window, bins=ksc.fit_bins(*window, run.nbins), center=center)
        count = int(head[ksc.COUNT])
        nans = int(head[ksc.NANS]) if size_before is None else 0
        size = count + nans
        if size_before == size:
            median, std, mean = before
            return ClipResult(median, std, size, iterations, lower, upper, mean, True)
        if nans or count == 0:
            median, std, mean = _median_type(dtype).type(np.nan), math.nan, math.nan
        else:
            median = _median(run, head, window, count, dtype)
            total, squares = float(head[ksc.SUM]), float(head[ksc.SUMSQ])
            mean = center + total / count
            var = (squares - total * total / count) / count
            std = math.sqrt(var) if var > 0 else (0.0 if var <= 0 else math.nan)
        if max_iters is not None and iterations == max_iters:
            return ClipResult(median, std, size, iterations, lower, upper, mean, False)
        iterations += 1
        lo, hi = _window(median, std, kappa)
        lower, upper = _intersect(lower, upper, lo, hi)
        new = ksc.window_keys(lo, hi, dtype)
        window = (max(window[0], new[0]), min(window[1], new[1]))
        if math.isfinite(median):
            center = float(median)
        size_before, before = size, (median, std, mean)


def _median(run, head, window, count, dtype):
    """The exact median of the ``count`` values in ``window``, from the first pass's ``head``
    (its histogram covered the whole window) and refinement passes."""
    ranks = ((count - 1) // 2, count // 2)
    lo, hi, shift = ksc.fit_bins(*window, run.nbins)
    while True:
        (b1, before1), (b2, _) = ((int(head[ksc.SEL + 3 * j]), int(head[ksc.SEL + 3 * j + 1]))
                                  for j in (0, 1))
        if shift == 0:  # single-key bins: the keys themselves
            middle = ksc.values([lo + b1, lo + b2], dtype)
            break
        if b1 != b2:  # the lower middle value ends bin b1, the upper one starts bin b2
            extremes = run(window=window, max_in=_bin_keys(lo, hi, shift, b1),
                           min_in=_bin_keys(lo, hi, shift, b2), moments=False)
            middle = np.array([extremes[ksc.AMAX], extremes[ksc.BMIN]]).astype(dtype)
            break
        ranks = (ranks[0] - before1, ranks[1] - before1)
        lo, hi, shift = ksc.fit_bins(*_bin_keys(lo, hi, shift, b1), run.nbins)
        head = run(window=window, bins=(lo, hi, shift), ranks=ranks, moments=False)
    # np.median's value: the mean of the middle one or two, in the data's float type
    return np.mean(middle[:1] if count % 2 else middle)


def _bin_keys(lo, hi, shift, b):
    first = lo + (b << shift)
    return first, min(hi, first + (1 << shift) - 1)


class _DevicePasses:
    """Passes over CuPy blocks held in this process, one device row per GPU: every block's
    kernel accumulates into its device's row, so a pass costs one launch per block, the rank
    selection and one small copy to the host."""

    def __init__(self, blocks):
        cp = cuda.cupy()
        self.blocks = [b for b in blocks if b.size]
        self.dtype = blocks[0].dtype
        self.passes = 0
        devices = sorted({b.device.id for b in self.blocks}) or [cp.cuda.runtime.getDevice()]
        self.walks = []
        for b in self.blocks:
            with b.device:
                self.walks.append((b.device.id, ksc.walks(b)))
        self.nbins = min(ksc.bins_cap(d) for d in devices)
        self.rows = {}
        for d in devices:
            with cp.cuda.Device(d):
                self.rows[d] = (cp.empty(ksc.HEAD + self.nbins, dtype=np.float64), ksc.Scratch(cp))

    def first_value(self) -> float:
        return float(self.blocks[0][(0,) * self.blocks[0].ndim]) if self.blocks else 0.0

    def __call__(self, **params):
        cp = cuda.cupy()
        p = ksc.resolve(self.dtype, **ksc.validate(0, **params))
        length = ksc.HEAD + (0 if p["extremes"] else ksc.bin_count(p["bins"]))
        for d, (row, scratch) in self.rows.items():
            with cp.cuda.Device(d):
                cp.cuda.runtime.memsetAsync(row.data.ptr, 0, length * 8,
                                            cp.cuda.get_current_stream().ptr)
        self.passes += 1
        for device, block_walks in self.walks:
            with cp.cuda.Device(device):
                row, scratch = self.rows[device]
                ksc.launch(block_walks, row, scratch, p)
        if len(self.rows) == 1:
            (d, (row, _)), = self.rows.items()
            with cp.cuda.Device(d):
                if not p["extremes"]:
                    ksc.select(row[:length], p["ranks"])
                return row[:ksc.HEAD].get()
        rows = []
        for d, (row, _) in self.rows.items():
            with cp.cuda.Device(d):
                rows.append(row[:length].get())
        head = ksc.combine(np.stack(rows))
        return (head if p["extremes"] else ksc.select(head, p["ranks"]))[:ksc.HEAD]


class _GraphPasses:
    """Passes as Dask graphs (one task per block and one to combine them), for chunks that are
    not in this process: on a distributed cluster's workers, or NumPy chunks run by Dask's
    threads."""

    def __init__(self, x):
        self.x = x
        self.nbins = _graph_bins_cap(x)
        self.passes = 0

    def first_value(self) -> float:
        if self.x.size == 0:
            return 0.0
        value = self.x[(0,) * self.x.ndim].compute()
        return float(value.get() if cuda.is_cupy_array(value) else value)

    def __call__(self, **params):
        self.passes += 1
        head = apply(self.x, "kappa_sigma_clip", **params).compute()
        return head.get() if cuda.is_cupy_array(head) else np.asarray(head)


def _clip_dask(x, kappa, max_iters) -> ClipResult:
    blocks = in_memory_blocks(x)
    if blocks and all(cuda.is_cupy_array(b) for b in blocks.values()):
        run = _DevicePasses(list(blocks.values()))
    else:
        run = _GraphPasses(x)
    return _clip_with_passes(run, x.dtype, kappa, max_iters)


def _graph_bins_cap(x) -> int:
    """Histogram bins every GPU that may run a block of ``x`` holds (all, for NumPy chunks)."""
    if not cuda.is_cupy_array(x._meta):
        return ksc.NBINS
    client = cluster.current()
    if client is None:  # no cluster: the blocks run on this process's GPU
        return _local_bins_cap()
    return min(client.run(_local_bins_cap).values(), default=ksc.NBINS)


def _local_bins_cap() -> int:
    """Runs where the blocks run: the bins the current GPU holds (all, without a GPU)."""
    if cuda.gpu_count() == 0:
        return ksc.NBINS
    return ksc.bins_cap(cuda.cupy().cuda.runtime.getDevice())
