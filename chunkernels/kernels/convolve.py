"""convolve: N-D convolution with N-D weights and scipy.ndimage's boundary modes.

Reference: ``scipy.ndimage.convolve``, which is ``correlate`` with the weights reversed along every
axis and each origin mirrored (``-origin``, one less along axes with an even number of taps). The
GPU runs that correlation (``kernels_cuda/correlate.cu``).
"""

from __future__ import annotations

import scipy.ndimage as ndi

from chunkernels._registry import KernelSpec
from chunkernels._shared import filters
from chunkernels.kernels import correlate, correlate1d


def reference(x, *, weights, origin, mode="reflect", cval=0.0, output=None):
    """CPU reference: ``scipy.ndimage.convolve``; where the weights reach beyond an axis (and
    beyond :func:`~chunkernels.kernels.correlate.scipy_reach`), the equal correlation with them
    folded onto it (:func:`chunkernels.kernels.correlate.reference`)."""
    corr, corr_origin = as_correlation(weights, origin)
    reaches = [filters.reach(m, o) for m, o in zip(corr.shape, corr_origin)]
    if any(filters.folds(r, n, correlate.scipy_reach(r, n, mode))
           for r, n in zip(reaches, x.shape)):
        return correlate.reference(x, weights=corr, origin=corr_origin, mode=mode, cval=cval,
                                   output=output)
    return ndi.convolve(x, weights, output, mode, cval, list(origin))


def as_correlation(weights, origin):
    """``(weights, origins)`` of the correlation that equals this convolution, as scipy forms it."""
    flipped = weights[(slice(None, None, -1),) * weights.ndim]
    return flipped, tuple(-o - (1 - m % 2) for m, o in zip(weights.shape, origin))


def halo(ndim, *, weights, origin, **params):
    """``weights.shape[k] // 2 + |origin'[k]|``, ``origin'`` the correlation's origins."""
    weights, origin = as_correlation(weights, origin)
    return correlate.halo(ndim, weights=weights, origin=origin)


def dispatch(x, *, weights, origin, mode, cval, output):
    """GPU path: the equivalent correlation on the N-D tile kernel."""
    weights, origin = as_correlation(weights, origin)
    return correlate.dispatch(x, weights=weights, origin=origin, mode=mode, cval=cval,
                              output=output)


def supports(x, *, weights, origin, **params):
    """correlate's, for the equivalent correlation."""
    weights, origin = as_correlation(weights, origin)
    return correlate.supports(x, weights=weights, origin=origin, **params)


SPEC = KernelSpec(
    name="convolve",
    summary="N-D convolution with N-D weights, scipy.ndimage modes; reference scipy.ndimage.convolve",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="correlate.cu",
    entries=correlate.SPEC.entries[:2],
    dtypes=correlate1d.GPU_DTYPES,
    halo=halo,
    halo_rule="weights.shape[k] // 2 + |origin'[k]| per axis (origin' = -origin, minus 1 if even)",
    boundary=filters.boundary,
    result_dtype=filters.result_dtype,
    supports=supports,
    validate=correlate.validate,
    cases=correlate.cases,
)

