"""gaussian_filter: the N-D Gaussian filter (and its derivatives), separable, per-axis parameters.

Reference: ``scipy.ndimage.gaussian_filter``. On the GPU, one correlate1d pass per filtered axis
(``kernels_cuda/correlate1d.cu``), each storing its result in the output dtype as scipy does, so
integer and float32 results round the way scipy's do between passes.
"""

from __future__ import annotations

import scipy.ndimage as ndi

from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels._shared.filters import FilterArgumentError
from chunkernels.kernels import correlate1d

#: scipy skips axes whose sigma is at most this.
SIGMA_EPS = 1e-15


def reference(x, *, sigma, order, mode, radius, axes, cval=0.0, truncate=4.0, output=None):
    """CPU reference: ``scipy.ndimage.gaussian_filter``; where a radius reaches beyond its axis
    and beyond :data:`~chunkernels._shared.filters.SCIPY_REACH`, scipy's passes (correlate1d,
    each stored in the output dtype) with the Gaussian folded onto the axis
    (:func:`~chunkernels._shared.filters.folded_gaussian_weights`)."""
    least = filters.SCIPY_REACH
    if not any(filters.folds(r, x.shape[ax], least) for r, ax in zip(radius, axes)):
        return ndi.gaussian_filter(x, list(sigma), list(order), output, list(mode), cval,
                                   truncate, radius=list(radius), axes=axes)
    out_dtype = filters.result_dtype(x.dtype, output=output)
    for axis, weights, md in passes(x.shape, sigma, order, mode, radius, axes, least):
        x = ndi.correlate1d(x, weights, axis, out_dtype, md, cval, 0)
    return x


def validate(ndim, sigma, order=0, mode="reflect", cval=0.0, truncate=4.0, radius=None,
             axes=None, output=None):
    """scipy.ndimage.gaussian_filter's parameters, per filtered axis; axes with sigma <= 1e-15
    are dropped, as scipy drops them."""
    axes = filters.check_axes(axes, ndim)
    count = len(axes)
    sigmas = [filters.finite(s, "sigma", filters.SIGMA)
              for s in filters.per_axis(sigma, count, "sigma")]
    orders = [_order(o) for o in filters.per_axis(order, count, "order")]
    modes = filters.per_axis(mode, count, "mode")  # checked on the axes filtered, as scipy checks
    truncate = filters.finite(truncate, "truncate", filters.TRUNCATE)
    keep = [i for i in range(count) if sigmas[i] > SIGMA_EPS]
    radii = filters.per_axis(radius, count, "radius")
    for i in keep:
        radii[i] = filters.gaussian_radius(sigmas[i], truncate, radii[i])
    pick = lambda seq: tuple(seq[i] for i in keep)  # noqa: E731
    return {"sigma": pick(sigmas), "order": pick(orders),
            "mode": tuple(filters.canonical_mode(m) for m in pick(modes)),
            "radius": pick(radii), "axes": pick(axes), "cval": filters.check_cval(cval),
            "truncate": truncate, "output": filters.output_dtype(output)}


def _order(value) -> int:
    value = filters.as_int(value, "order")
    if value < 0:
        raise FilterArgumentError(f"order must be non-negative; got {value}")
    return int(value)


def halo(ndim, *, radius, axes, **params):
    """``radius`` along each filtered axis (``int(truncate * sigma + 0.5)`` unless given)."""
    return filters.depth_along(ndim, dict(zip(axes, radius)))


def passes(shape, sigma, order, mode, radius, axes, least=0):
    """``(axis, weights, mode)`` of each separable pass on an array of ``shape``, in scipy's
    order; weights that reach beyond their axis (and ``least``) are folded onto it."""
    return [(ax, filters.gaussian_pass_weights(s, o, r, shape[ax], md, least), md)
            for ax, s, o, md, r in zip(axes, sigma, order, mode, radius)]


def dispatch(x, *, sigma, order, mode, radius, axes, cval, truncate, output):
    """GPU path: one correlate1d pass per filtered axis, each stored in the output dtype."""
    out_dtype = filters.result_dtype(x.dtype, output=output)
    steps = passes(x.shape, sigma, order, mode, radius, axes)
    if not steps:
        return x.astype(out_dtype, order="K", copy=True)
    for axis, weights, md in steps:
        x = correlate1d.pass_gpu(x, weights, axis, md, cval, 0, out_dtype)
    return x


def supports(x, *, radius, axes, output=None, **params):
    """The passes' dtypes and shared memory (:func:`gpu_supports`, ``radius`` one per axis of
    ``axes``)."""
    return gpu_supports(x, dict(zip(axes, radius)), output)


def gpu_supports(x, radius_by_axis, output):
    """``(ok, reason)`` of Gaussian passes of these radii (folded where they reach beyond an
    axis) on ``x``: gaussian_filter's, gaussian_laplace's and gaussian_gradient_magnitude's."""
    out_dtype = filters.result_dtype(x.dtype, output=output)
    itemsize = correlate1d.accumulator(x.dtype, out_dtype).itemsize
    smem = max((correlate1d.pass_smem(filters.folded_taps(2 * r + 1, 0, x.shape[ax]), itemsize)
                for ax, r in radius_by_axis.items()), default=0)
    return correlate1d.gpu_supports(x, out_dtype, smem=smem)


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (41, 37), "float64")
    for mode in filters.MODES:
        yield x, (), {"sigma": 2.0, "mode": mode, "cval": 0.25}
    yield random_array(rng, (30, 25, 6), "float32").transpose(1, 0, 2), (), {
        "sigma": (1.5, 0.8, 0.0), "order": (0, 1, 2), "mode": ("wrap", "mirror", "reflect")}
    yield random_array(rng, (50, 40), "float32")[::-2, 3:], (), {"sigma": 3.0, "radius": 4, "axes": (1,)}
    yield random_array(rng, (33, 34), "uint8", nonnegative=True), (), {"sigma": 1.0}
    # radii beyond the array: the Gaussian folded onto it
    yield random_array(rng, (9, 6), "float64"), (), {"sigma": (7.0, 5.0), "mode": "mirror"}


SPEC = correlate1d.separable_spec(
    name="gaussian_filter",
    summary="N-D Gaussian filter (orders 0..n per axis), separable; reference scipy.ndimage.gaussian_filter",
    cpu=reference,
    gpu=dispatch,
    halo=halo,
    halo_rule="radius = int(truncate * sigma + 0.5) per filtered axis",
    stack=filters.stacked_axes,
    supports=supports,
    validate=validate,
    cases=cases,
)
