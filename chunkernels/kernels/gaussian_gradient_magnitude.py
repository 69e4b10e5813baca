"""gaussian_gradient_magnitude: the gradient magnitude with Gaussian first derivatives.

Reference: ``scipy.ndimage.gaussian_gradient_magnitude``, that is scipy's
``generic_gradient_magnitude``: for each filtered axis in turn a term, scipy's Gaussian filter of
order 1 along that axis and 0 along the others, every pass of it with that axis' mode and stored
in the output dtype; the first term is squared in place in the output, each further one squared
in a temporary of the output dtype and added to it, and the square root is taken in place, cast
back to the output dtype (integer outputs included). As scipy, the Gaussian smooths every axis of
the input, filtered or not: ``sigma`` is one per axis of the input, also with ``axes``.

The GPU runs the same passes (``kernels_cuda/correlate1d.cu``, the terms of
:mod:`~chunkernels.kernels.gaussian_laplace`) and the same element-wise arithmetic in CuPy.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi

from chunkernels import cuda
from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels.kernels import correlate1d, gaussian_filter, gaussian_laplace


def reference(x, *, sigma, axes, mode, radius, cval=0.0, truncate=4.0, output=None):
    """CPU reference: ``scipy.ndimage.gaussian_gradient_magnitude``; where a radius reaches
    beyond its axis, scipy's terms, squares and root with the Gaussians folded onto the axes."""
    if not gaussian_laplace.folds(x.shape, sigma, radius, axes, filters.SCIPY_REACH):
        return ndi.gaussian_gradient_magnitude(x, list(sigma), output, list(mode), cval,
                                               axes=axes, truncate=truncate, radius=list(radius))
    steps = gaussian_laplace.terms(x.shape, sigma, radius, axes, mode, 1, filters.SCIPY_REACH)
    out = gaussian_laplace.sum_terms(x, steps, cval, filters.result_dtype(x.dtype, output=output),
                                     each=_square)
    return np.sqrt(out, out, casting="unsafe")  # scipy's, in place in the output dtype


def validate(ndim, sigma, mode="reflect", cval=0.0, axes=None, truncate=4.0, radius=None,
             output=None):
    """scipy.ndimage.gaussian_gradient_magnitude's parameters: ``mode`` per filtered axis;
    ``sigma``, ``truncate`` and ``radius`` go to the Gaussian filter of every axis of the input,
    as scipy passes them (so ``sigma`` is one per axis of the input)."""
    axes = filters.check_axes(axes, ndim)
    sigma, radius, truncate = gaussian_laplace.smoothing(ndim, sigma, truncate, radius, axes)
    return {"sigma": sigma, "axes": axes, "mode": filters.modes(mode, len(axes)), "radius": radius,
            "cval": filters.check_cval(cval), "truncate": truncate,
            "output": filters.output_dtype(output)}


def stacked(params):
    """The spec's ``stack``: the parameters for blocks stacked along a new leading axis. ``axes``
    shift by one; ``sigma`` and ``radius``, one per axis of the input, gain the new axis's (0:
    it is neither smoothed nor differentiated)."""
    return {**params, "axes": tuple(a + 1 for a in params["axes"]),
            "sigma": (0.0, *params["sigma"]), "radius": (0, *params["radius"])}


def halo(ndim, *, sigma, axes, mode, radius, **params):
    """``radius`` (``int(truncate * sigma + 0.5)`` unless given) along every axis with a sigma
    (filtered or not, as scipy smooths them); the whole axis where the modes mix ``wrap`` with
    others."""
    return gaussian_laplace.terms_halo(ndim, sigma, radius, axes, mode)


def dispatch(x, *, sigma, axes, mode, radius, cval, truncate, output):
    """GPU path: one term per filtered axis, its passes stored in the output dtype, squared and
    summed there, then the square root cast back to it."""
    cp = cuda.cupy()
    out_dtype = filters.result_dtype(x.dtype, output=output)
    steps = gaussian_laplace.terms(x.shape, sigma, radius, axes, mode, 1)
    if not steps:
        return x.astype(out_dtype, order="K", copy=True)
    out = gaussian_laplace.sum_terms(x, steps, cval, out_dtype, each=_square)
    # scipy's np.sqrt(output, output, casting="unsafe") computes in the dtype NumPy's sqrt picks
    # for the output's (float16 for 8-bit integers, float32 for 16-bit ones) and casts back
    root = np.sqrt.resolve_dtypes((out_dtype, None))[-1]
    result = cp.sqrt(out.astype(root, copy=False)).astype(out_dtype, copy=False)
    if out_dtype.kind == "i" and out_dtype.itemsize >= 4:
        # a signed sum that wrapped below zero has a NaN root, which x86's truncating conversion
        # (scipy's cast) makes the dtype's minimum for 32- and 64-bit integers; the device's
        # makes it 0 (as x86 does for 8- and 16-bit ones, which keep the low bits of INT_MIN)
        result = cp.where(out < 0, out_dtype.type(np.iinfo(out_dtype).min), result)
    return result


def supports(x, *, sigma, radius, output=None, **params):
    """The passes' dtypes and shared memory (``sigma`` and ``radius`` one per axis)."""
    return gaussian_filter.gpu_supports(
        x, {a: r for a, (s, r) in enumerate(zip(sigma, radius)) if s > gaussian_filter.SIGMA_EPS},
        output)


def _square(term):
    """``term`` squared in place in its own dtype, as scipy's ``np.multiply(t, t, t)``."""
    cuda.array_module(term).multiply(term, term, out=term)


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (35, 38), "float64")
    for mode in filters.MODES:
        yield x, (), {"sigma": 1.2, "mode": mode, "cval": -0.5}
    yield random_array(rng, (18, 15, 8), "float32").transpose(2, 1, 0)[::-1], (), {
        "sigma": (1.0, 0.0, 1.5), "axes": (2, 0), "mode": ("mirror", "constant")}
    yield random_array(rng, (22, 27), "float64"), (), {"sigma": 1.0,
                                                       "mode": ("wrap", "nearest")}
    yield random_array(rng, (26, 24), "uint16", nonnegative=True), (), {"sigma": 1.5,
                                                                        "radius": (4, 2)}
    yield random_array(rng, (24, 25), "int16"), (), {"sigma": 2.0, "output": np.float64}
    # radii beyond the array: the Gaussians folded onto it
    yield random_array(rng, (7, 5), "float64"), (), {"sigma": 6.0, "mode": "nearest"}


#: The terms are gaussian_laplace's (its Dask boundary), their passes gaussian_filter's (its GPU
#: support, and its stacking of blocks)
SPEC = correlate1d.separable_spec(
    name="gaussian_gradient_magnitude",
    summary="Gradient magnitude with Gaussian derivatives; reference "
            "scipy.ndimage.gaussian_gradient_magnitude",
    cpu=reference,
    gpu=dispatch,
    halo=halo,
    supports=supports,
    halo_rule="radius = int(truncate * sigma + 0.5) along every axis with a sigma (the whole "
              "axis where the modes mix 'wrap' with others)",
    boundary=gaussian_laplace.terms_boundary,
    stack=stacked,
    validate=validate,
    cases=cases,
)
