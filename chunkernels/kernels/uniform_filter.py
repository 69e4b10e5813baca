"""uniform_filter: the N-D moving average, separable, per-axis size, origin and mode.

Reference: ``scipy.ndimage.uniform_filter``. On the GPU, one correlate1d pass per filtered axis
(``kernels_cuda/correlate1d.cu``) with unit weights, the sum divided by the size before it is
stored (scipy's mean, so integer results truncate as scipy's do), each pass stored in the output
dtype as scipy stores it.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.ndimage as ndi

from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels._shared.filters import FilterTypeError
from chunkernels.kernels import correlate1d


def reference(x, *, size, origin, mode, axes, cval=0.0, output=None):
    """CPU reference: ``scipy.ndimage.uniform_filter``; where a filter reaches beyond its axis
    and beyond :data:`~chunkernels._shared.filters.SCIPY_REACH`, scipy's passes (each stored in
    the output dtype), those axes' sums taken over the filter folded onto the axis
    (:func:`~chunkernels._shared.filters.folded_uniform_counts`), in float64, then divided by
    the size."""
    reaches = [filters.reach(s, o) for s, o in zip(size, origin)]
    least = filters.SCIPY_REACH
    if not any(filters.folds(r, x.shape[ax], least) for r, ax in zip(reaches, axes)):
        return ndi.uniform_filter(x, list(size), output, list(mode), cval, list(origin),
                                  axes=axes)
    out_dtype = filters.result_dtype(x.dtype, output=output)
    for ax, s, o, md, r in zip(axes, size, origin, mode, reaches):
        if not filters.folds(r, x.shape[ax], least):
            x = ndi.uniform_filter1d(x, s, ax, out_dtype, md, cval, o)
            continue
        counts = filters.folded_uniform_counts(s, o, x.shape[ax], md)
        sums = ndi.correlate1d(x, counts, ax, np.promote_types(x.dtype, np.float64), md, cval)
        x = (sums / s).astype(out_dtype, copy=False)
    return x


def validate(ndim, size=3, mode="reflect", cval=0.0, origin=0, axes=None, output=None):
    """scipy.ndimage.uniform_filter's parameters, per filtered axis; axes of size <= 1 are
    dropped, as scipy drops them."""
    axes = filters.check_axes(axes, ndim)
    count = len(axes)
    sizes = [_size(s) for s in filters.per_axis(size, count, "size")]
    origins = [filters.as_int(o, "origin") for o in filters.per_axis(origin, count, "origin")]
    modes = filters.per_axis(mode, count, "mode")  # checked on the axes filtered, as scipy checks
    keep = [i for i in range(count) if sizes[i] > 1]
    for i in keep:
        filters.check_origin(origins[i], sizes[i], "size")
    pick = lambda seq: tuple(seq[i] for i in keep)  # noqa: E731
    return {"size": pick(sizes), "origin": pick(origins),
            "mode": tuple(filters.canonical_mode(m) for m in pick(modes)), "axes": pick(axes),
            "cval": filters.check_cval(cval),
            "output": filters.output_dtype(output)}


def _size(value) -> int:
    """A filter size as scipy.ndimage.uniform_filter takes it: any finite real number, truncated
    by ``int()`` (3.5 is 3; sizes up to 1 filter nothing). uniform_filter1d takes integers only.

    A NaN size, which SciPy skips (NaN > 1 is false), and an infinite one, which it cannot
    truncate, are refused naming the size (:func:`~chunkernels._shared.filters.finite`)."""
    if isinstance(value, numbers.Real):
        return int(filters.finite(value, "size", SIZE))
    raise FilterTypeError(f"size must be a real number: {value!r} cannot be compared with 1 "
                          f"(scipy.ndimage.uniform_filter truncates real sizes with int())")


SIZE = "give the filter's length in pixels (sizes up to 1 leave an axis unfiltered)"


def halo(ndim, *, size, origin, axes, **params):
    """``size // 2 + |origin|`` along each filtered axis."""
    return filters.depth_along(ndim,
                               {ax: filters.reach(s, o) for ax, s, o in zip(axes, size, origin)})


def dispatch(x, *, size, origin, mode, axes, cval, output):
    """GPU path: one correlate1d pass per filtered axis: unit weights (folded onto the axis
    where they reach beyond it), sum divided by the size."""
    out_dtype = filters.result_dtype(x.dtype, output=output)
    if not axes:
        return x.astype(out_dtype, order="K", copy=True)
    for ax, s, o, md in zip(axes, size, origin, mode):
        if filters.folds(filters.reach(s, o), x.shape[ax]):
            weights, o = filters.folded_uniform_counts(s, o, x.shape[ax], md), 0
        else:
            weights = np.ones(s)
        x = correlate1d.pass_gpu(x, weights, ax, md, cval, o, out_dtype, divisor=s)
    return x


def supports(x, *, size, origin, axes, output=None, **params):
    out_dtype = filters.result_dtype(x.dtype, output=output)
    itemsize = correlate1d.accumulator(x.dtype, out_dtype).itemsize
    smem = max((correlate1d.pass_smem(filters.folded_taps(s, o, x.shape[ax]), itemsize)
                for s, o, ax in zip(size, origin, axes)), default=0)
    return correlate1d.gpu_supports(x, out_dtype, smem=smem)


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (41, 37), "float64")
    for mode in filters.MODES:
        yield x, (), {"size": 4, "mode": mode, "cval": -1.0}
    yield random_array(rng, (30, 25, 6), "float32").transpose(1, 0, 2), (), {
        "size": (3, 6, 2), "origin": (1, -3, 0), "mode": ("wrap", "nearest", "reflect")}
    yield random_array(rng, (33, 34), "int32"), (), {"size": 3}
    # sizes beyond the array: the unit weights folded onto it
    yield random_array(rng, (9, 6), "float64"), (), {"size": (25, 14), "origin": (5, -3),
                                                     "mode": "reflect"}


SPEC = correlate1d.separable_spec(
    name="uniform_filter",
    summary="N-D moving average (size, origin per axis), separable; reference scipy.ndimage.uniform_filter",
    cpu=reference,
    gpu=dispatch,
    halo=halo,
    halo_rule="size // 2 + |origin| per filtered axis",
    stack=filters.stacked_axes,
    supports=supports,
    validate=validate,
    cases=cases,
)
