"""gaussian_laplace: the N-D Laplace filter with Gaussian second derivatives.

Reference: ``scipy.ndimage.gaussian_laplace``, that is scipy's ``generic_laplace``: for each
filtered axis in turn a *term*, scipy's Gaussian filter of order 2 along that axis and 0 along the
others (sigma 0, hence no pass, along the unfiltered axes), every pass of it with that axis' mode
and stored in the output dtype; the first term is computed into the output, each further one into
a temporary of the output dtype that is added to it. The GPU runs the same passes
(``kernels_cuda/correlate1d.cu``) and the same additions.

The terms (:func:`terms`), their parameters, halo and Dask boundary are shared with
gaussian_gradient_magnitude, which combines the same kind of terms another way.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi

from chunkernels._halo import WHOLE_AXIS
from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels.kernels import correlate1d, gaussian_filter


def reference(x, *, sigma, axes, mode, radius, cval=0.0, truncate=4.0, output=None):
    """CPU reference: ``scipy.ndimage.gaussian_laplace``; where a radius reaches beyond its
    axis, scipy's terms (:func:`sum_terms`) with the Gaussians folded onto the axes."""
    full = _full_sigma(x.ndim, sigma, axes)
    if not folds(x.shape, full, radius, axes, filters.SCIPY_REACH):
        return ndi.gaussian_laplace(x, list(sigma), output, list(mode), cval, axes=axes,
                                    truncate=truncate, radius=list(radius))
    return sum_terms(x, terms(x.shape, full, radius, axes, mode, 2, filters.SCIPY_REACH), cval,
                     filters.result_dtype(x.dtype, output=output))


def folds(shape, sigma, radius, axes, least=0) -> bool:
    """Whether the terms' Gaussians (``sigma`` and ``radius`` one per axis of the input) reach
    beyond an axis of ``shape`` (and ``least``: :func:`~chunkernels._shared.filters.folds`),
    and are folded onto it."""
    return bool(axes) and any(filters.folds(r, n, least) for s, r, n in zip(sigma, radius, shape)
                              if s > gaussian_filter.SIGMA_EPS)


def validate(ndim, sigma, mode="reflect", cval=0.0, axes=None, truncate=4.0, radius=None,
             output=None):
    """scipy.ndimage.gaussian_laplace's parameters: ``sigma`` and ``mode`` per filtered axis;
    ``truncate`` and ``radius`` go to the Gaussian filter of every axis, as scipy passes them, so
    ``radius`` is one per axis of the input (the unfiltered axes' unused)."""
    axes = filters.check_axes(axes, ndim)
    full = _full_sigma(ndim, filters.per_axis(sigma, len(axes), "sigma"), axes)
    full, radius, truncate = smoothing(ndim, full, truncate, radius, axes)
    return {"sigma": tuple(full) if len(axes) == ndim else tuple(full[ax] for ax in axes),
            "axes": axes, "mode": filters.modes(mode, len(axes)), "radius": radius,
            "cval": filters.check_cval(cval), "truncate": truncate,
            "output": filters.output_dtype(output)}


def smoothing(ndim, sigma, truncate, radius, axes):
    """``(sigma, radius, truncate)`` checked as scipy's gaussian_filter checks them: per axis of
    the input, the Gaussian's sigma and radius (``int(truncate * sigma + 0.5)`` unless given)
    where scipy filters, that is where sigma > 1e-15, and 0 and 0 where it does not.

    Without filtered axes scipy copies the input and never builds a Gaussian, so nothing is
    checked then.
    """
    if not axes:
        return (0.0,) * ndim, (0,) * ndim, truncate
    params = gaussian_filter.validate(ndim, sigma, truncate=truncate, radius=radius)
    kept = dict(zip(params["axes"], zip(params["sigma"], params["radius"])))
    sigma, radius = zip(*(kept.get(ax, (0.0, 0)) for ax in range(ndim)))
    return sigma, radius, params["truncate"]


def _full_sigma(ndim, sigma, axes):
    """gaussian_laplace's sigma per axis of the input (0 on the unfiltered axes).

    As scipy: ``sigma[i]`` is axis ``axes[i]``'s where some axes are not filtered, but where
    every axis is, ``sigma[i]`` is axis ``i``'s whatever the order of ``axes``.
    """
    if len(axes) == ndim:
        return list(sigma)
    full = [0.0] * ndim
    for ax, s in zip(axes, sigma):
        full[ax] = s
    return full


def stacked(params):
    """The spec's ``stack``: the parameters for blocks stacked along a new leading axis.

    ``axes`` shift by one and ``radius``, one per axis of the input, gains the new axis's
    (unused: it is not filtered). ``sigma`` is per axis of the input where every axis is
    filtered and per filtered axis otherwise (scipy's rule, :func:`_full_sigma`); once the new
    axis is not filtered it is read per filtered axis, so it is given so.
    """
    axes = params["axes"]
    full = _full_sigma(len(params["radius"]), params["sigma"], axes)
    return {**params, "axes": tuple(a + 1 for a in axes), "sigma": tuple(full[a] for a in axes),
            "radius": (0, *params["radius"])}


def terms(shape, sigma, radius, axes, mode, order, least=0):
    """``(mode, passes)`` of each term on an array of ``shape``: per filtered axis and its mode,
    scipy's Gaussian filter of derivative ``order`` along that axis and 0 along the others;
    ``passes`` are its ``(axis, weights)`` along every axis whose sigma (one per axis of the
    input) is > 1e-15, in axis order, as scipy's gaussian_filter runs them (weights that reach
    beyond their axis, and ``least``, folded onto it)."""
    return [(md, [(a, filters.gaussian_pass_weights(s, order if a == ax else 0, r, shape[a], md,
                                                    least))
                  for a, (s, r) in enumerate(zip(sigma, radius))
                  if s > gaussian_filter.SIGMA_EPS])
            for ax, md in zip(axes, mode)]


def terms_halo(ndim, sigma, radius, axes, mode):
    """The radius along every axis the terms filter (none without terms).

    Where the filtered axes' modes mix ``wrap`` with others, every term filters every such axis
    with its own mode: a block at the array's edge would need its halo both wrapped around the
    array and not, which one halo exchange cannot give; those axes take the whole axis
    (:data:`~chunkernels._halo.WHOLE_AXIS`: ``apply`` makes them one chunk).
    """
    if not axes:
        return (0,) * ndim
    mixed = len({md == "wrap" for md in mode}) > 1
    return filters.depth_along(ndim, {
        a: WHOLE_AXIS if mixed and r else r
        for a, (s, r) in enumerate(zip(sigma, radius)) if s > gaussian_filter.SIGMA_EPS})


def terms_boundary(mode="reflect", **params):
    """``"periodic"`` when every term wraps, else ``"none"`` (mixed modes make the filtered axes
    one chunk, :func:`terms_halo`, where the boundary does not matter)."""
    modes = [mode] if isinstance(mode, str) else list(mode)
    wrap = [filters.MODE_SYNONYMS.get(md, md) == "wrap" for md in modes]
    return "periodic" if wrap and all(wrap) else "none"


def sum_terms(x, terms, cval, out_dtype, each=None):
    """scipy's sum of ``terms`` (on the device for CuPy ``x``, by scipy's correlate1d for NumPy
    ``x``): the first computed into the output, each further one into a temporary of the output
    dtype added to it, so integer sums wrap as scipy's do. ``each(term)`` changes every term in
    place before it is added (gradient magnitude squares)."""
    out = None
    for md, passes in terms:
        term = x
        for axis, weights in passes:
            if isinstance(term, np.ndarray):
                term = ndi.correlate1d(term, weights, axis, out_dtype, md, cval, 0)
            else:
                term = correlate1d.pass_gpu(term, weights, axis, md, cval, 0, out_dtype)
        if not passes:  # scipy's gaussian_filter copies the input when no sigma is > 1e-15
            term = x.astype(out_dtype, order="K", copy=True)
        if each is not None:
            each(term)
        if out is None:
            out = term
        else:
            out += term
    return out if out is not None else x.astype(out_dtype, order="K", copy=True)


def halo(ndim, *, sigma, axes, mode, radius, **params):
    """``radius`` (``int(truncate * sigma + 0.5)`` unless given) along each filtered axis; the
    whole axis where the modes mix ``wrap`` with others."""
    return terms_halo(ndim, _full_sigma(ndim, sigma, axes), radius, axes, mode)


def dispatch(x, *, sigma, axes, mode, radius, cval, truncate, output):
    """GPU path: one term per filtered axis, its passes stored in the output dtype, summed
    there."""
    out_dtype = filters.result_dtype(x.dtype, output=output)
    steps = terms(x.shape, _full_sigma(x.ndim, sigma, axes), radius, axes, mode, 2)
    return sum_terms(x, steps, cval, out_dtype)


def supports(x, *, sigma, axes, radius, output=None, **params):
    """The passes' dtypes and shared memory (``radius`` one per axis of the input)."""
    full = _full_sigma(x.ndim, sigma, axes)
    return gaussian_filter.gpu_supports(
        x, {a: r for a, (s, r) in enumerate(zip(full, radius)) if s > gaussian_filter.SIGMA_EPS},
        output)


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (37, 33), "float64")
    for mode in filters.MODES:
        yield x, (), {"sigma": 1.5, "mode": mode, "cval": 0.5}
    yield random_array(rng, (16, 21, 7), "float32").transpose(1, 0, 2)[:, ::-1], (), {
        "sigma": (1.0, 2.0), "axes": (0, 2), "mode": ("nearest", "mirror")}
    yield random_array(rng, (25, 26), "float64"), (), {"sigma": (0.8, 1.2),
                                                       "mode": ("reflect", "wrap")}
    yield random_array(rng, (30, 28), "int32"), (), {"sigma": 1.0, "radius": (3, 2)}
    yield random_array(rng, (24, 25), "uint8", nonnegative=True), (), {
        "sigma": 2.0, "output": np.float32}
    # radii beyond the array: the Gaussians folded onto it
    yield random_array(rng, (7, 5), "float64"), (), {"sigma": 6.0, "mode": "reflect"}


#: The terms' passes are gaussian_filter's: its GPU support (and its stacking of blocks)
SPEC = correlate1d.separable_spec(
    name="gaussian_laplace",
    summary="Laplace filter with Gaussian second derivatives; reference "
            "scipy.ndimage.gaussian_laplace",
    cpu=reference,
    gpu=dispatch,
    halo=halo,
    halo_rule="radius = int(truncate * sigma + 0.5) per filtered axis (the whole axis where "
              "the modes mix 'wrap' with others)",
    boundary=terms_boundary,
    stack=stacked,
    supports=supports,
    validate=validate,
    cases=cases,
)
