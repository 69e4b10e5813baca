"""convolve1d: a 1-D convolution along one axis, with scipy.ndimage's boundary modes.

Reference: ``scipy.ndimage.convolve1d``, which is ``correlate1d`` with the weights reversed and the
origin mirrored (``-origin``, one less for an even number of weights). The GPU runs that
correlation (``kernels_cuda/correlate1d.cu``).
"""

from __future__ import annotations

import scipy.ndimage as ndi

from chunkernels._shared import filters
from chunkernels.kernels import correlate1d


def reference(x, *, weights, axis=-1, mode="reflect", cval=0.0, origin=0, output=None):
    """CPU reference: ``scipy.ndimage.convolve1d``; where the weights reach beyond the axis, the
    equal correlation with them folded onto it (:func:`~chunkernels._shared.filters.fold`)."""
    corr, corr_origin = as_correlation(weights, origin)
    if filters.folds(filters.reach(len(corr), corr_origin), x.shape[axis], filters.SCIPY_REACH):
        return correlate1d.reference(x, weights=corr, axis=axis, mode=mode, cval=cval,
                                     origin=corr_origin, output=output)
    return ndi.convolve1d(x, weights, axis, output, mode, cval, origin)


def as_correlation(weights, origin):
    """``(weights, origin)`` of the correlation that equals this convolution, as scipy forms it."""
    return weights[::-1], -origin - (1 - len(weights) % 2)


def halo(ndim, *, weights, axis, origin, **params):
    """``len(weights) // 2 + |origin'|`` along ``axis``, ``origin'`` the correlation's origin."""
    weights, origin = as_correlation(weights, origin)
    return filters.depth_along(ndim, {axis: filters.reach(len(weights), origin)})


def dispatch(x, *, weights, axis, mode, cval, origin, output):
    """GPU path: the equivalent correlation, one separable pass."""
    weights, origin = as_correlation(weights, origin)
    return correlate1d.dispatch(x, weights=weights, axis=axis, mode=mode, cval=cval,
                                origin=origin, output=output)


def supports(x, *, weights, origin=0, **params):
    """correlate1d's, for the equivalent correlation."""
    weights, origin = as_correlation(weights, origin)
    return correlate1d.supports(x, weights=weights, origin=origin, **params)


SPEC = correlate1d.separable_spec(
    name="convolve1d",
    summary="1-D convolution along an axis, scipy.ndimage modes; reference scipy.ndimage.convolve1d",
    cpu=reference,
    gpu=dispatch,
    ndim=(1, None),
    halo=halo,
    halo_rule="len(weights) // 2 + |origin'| along axis (origin' = -origin, minus 1 if even)",
    supports=supports,
    validate=correlate1d.validate,
    cases=correlate1d.cases,
)
