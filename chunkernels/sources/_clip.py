"""κ-σ clipping of the background: the GPU lesson's ``ks_clipper_cpu`` on NumPy, CuPy and Dask.

NumPy arrays run the lesson's loop (:func:`clip_reference`). CuPy arrays and Dask arrays run the
same iteration as passes of the ``kappa_sigma_clip`` reduction kernel (``_passes.py``): CuPy
blocks in this process take one launch per block and pass, blocks on a distributed cluster's
workers are passed over by the workers themselves (``_clip_cluster.py``), other Dask arrays by a
small graph per pass.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from chunkernels import cuda
from chunkernels._apply import apply_kernel
from chunkernels._graph import as_input, in_memory_blocks
from chunkernels.interop import array_entry
from chunkernels.kernels import kappa_sigma_clip as ksc
from chunkernels.sources import _clip_cluster
from chunkernels.sources._passes import (
    ClipResult,
    DevicePasses,
    GraphPasses,
    clip_with_passes,
    intersect,
    median_type,
    window_of,
)

__all__ = ["ClipResult", "clip_reference", "kappa_sigma_clip"]


@array_entry("x")
def kappa_sigma_clip(kind, x, kappa=3.0, max_iters=None, return_mask=False):
    """κ-σ clip ``x``: repeatedly keep the values strictly inside ``median ± kappa * std``.

    The GPU lesson's ``ks_clipper_cpu`` (seed 002) with ``kappa`` for its 3: the median and the
    population standard deviation of the values still kept are computed, the values outside the
    open window ``(median - kappa * std, median + kappa * std)`` are dropped, and this repeats
    until a round drops nothing (or after ``max_iters`` rounds).

    Parameters
    ----------
    x : array_like, cupy.ndarray, dask.array.Array or xarray.DataArray
        Data of any shape (it is clipped as one flat set of values): real integers, float32 or
        float64. Dask arrays may have NumPy or CuPy chunks; they are persisted first (unless a
        cluster's workers hold them already: then those workers pass over their own chunks).
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
    mask : numpy.ndarray, cupy.ndarray, dask.array.Array or xarray.DataArray of bool
        Only with ``return_mask``: True where ``x`` is kept, ``(x > lower) & (x < upper)``, of
        ``x``'s array type (lazy for Dask; a DataArray labelled as ``x``).

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
    sums are shifted by the previous round's median, so they do not cancel, and scaled by a power
    of two where float64 squares would overflow (values beyond about 1e154): the statistics stay
    finite wherever the values are (NumPy's ``np.std`` of ``[1e160, 2e160, 3e160]`` is inf; here
    it is 8.16e159, and all three are kept).

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
    x = as_input(x, "kappa_sigma_clip", "x", chunk_sizes=True)
    ksc.check_dtype(x.dtype)
    if kind.dask and not _clip_cluster.held(x):
        x = x.persist()
    result = clip(kind, x, kappa, max_iters)
    if not return_mask:
        return result
    mask = apply_kernel(kind, x, "threshold", params={"value": np.float64(result.lower),
                                                      "upper": np.float64(result.upper)})
    return result, mask


def clip(kind, x, kappa, max_iters=None) -> ClipResult:
    """:func:`kappa_sigma_clip`'s statistics of ``x`` (of ``kind``; a Dask array persisted, or
    held by a cluster's workers), its arguments and dtype checked."""
    if kind.dask:
        return _clip_dask(x, kappa, max_iters)
    if kind.gpu:
        return clip_with_passes(DevicePasses([x]), x.dtype, kappa, max_iters)
    return clip_reference(x, kappa, max_iters)


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
        lo, hi = window_of(median, std, kappa)
        lower, upper = intersect(lower, upper, lo, hi)
        size_before = data.size
        data = data[(data > np.float64(lo)) & (data < np.float64(hi))]


def _stats_of(data, dtype):
    """Median, float64 standard deviation and mean of a 1-D array (NaN when empty).

    Where float64 overflows (values beyond about 1e154 square to infinity), the statistics are
    those of the values scaled by a power of two, scaled back: the same numbers NumPy would give
    with a wider exponent, finite wherever the values are. Infinite values give NaN, as NumPy's.
    """
    if data.size == 0:
        return median_type(dtype).type(np.nan), math.nan, math.nan
    with np.errstate(invalid="ignore", over="ignore"):
        std, mean = float(np.std(data, dtype=np.float64)), float(np.mean(data, dtype=np.float64))
        if not (math.isfinite(std) and math.isfinite(mean)):
            largest = max(abs(float(data.max())), abs(float(data.min())))
            if math.isfinite(largest):
                scale = math.ldexp(1.0, -math.frexp(largest)[1])
                scaled = data.astype(np.float64) * scale
                std, mean = float(np.std(scaled)) / scale, float(np.mean(scaled)) / scale
    return np.median(data), std, mean


def _clip_dask(x, kappa, max_iters) -> ClipResult:
    blocks = in_memory_blocks(x)
    if blocks and all(cuda.is_cupy_array(b) for b in blocks.values()):
        # in block order, as a cluster's worker takes them: the sums add up the same
        ordered = [blocks[key] for key in sorted(blocks)]
        return clip_with_passes(DevicePasses(ordered), x.dtype, kappa, max_iters)
    if blocks is None:  # on a distributed cluster's workers: they pass over their own blocks
        result = _clip_cluster.clip(x, kappa, max_iters)
        if result is not None:
            return result
    return clip_with_passes(GraphPasses(x), x.dtype, kappa, max_iters)
