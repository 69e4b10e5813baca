"""sobel: the Sobel derivative along one axis, smoothed along the others.

Reference: ``scipy.ndimage.sobel``: a ``[-1, 0, 1]`` correlation along ``axis``, then ``[1, 2, 1]``
along every other axis in turn, each pass stored in the output dtype. The GPU runs the same
passes (``kernels_cuda/correlate1d.cu``).
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi

from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels.kernels import correlate1d

DERIVATIVE = np.array([-1.0, 0.0, 1.0])
SMOOTH = np.array([1.0, 2.0, 1.0])


def reference(x, *, axis=-1, mode="reflect", cval=0.0, output=None):
    """CPU reference: ``scipy.ndimage.sobel``."""
    return ndi.sobel(x, axis, output, mode if isinstance(mode, str) else list(mode), cval)


def validate(ndim, axis=-1, mode="reflect", cval=0.0, output=None):
    """scipy.ndimage.sobel's (and prewitt's) parameters; ``mode`` may give one mode per axis."""
    axis = filters.check_axis(axis, ndim)
    return {"axis": axis, "mode": filters.modes(mode, ndim), "cval": filters.check_cval(cval),
            "output": filters.output_dtype(output)}


def halo(ndim, **params):
    """1 along every axis."""
    return (1,) * ndim


def boundary(mode="reflect", **params):
    """Dask's boundary per axis: ``mode`` names one mode per axis (``axis`` is the derivative's,
    not the only filtered one)."""
    return filters.boundary(mode)


def passes(ndim, axis, weights_axis, weights_other):
    """``(axis, weights)`` of scipy's passes: ``axis`` first, then the others in order."""
    return [(axis, weights_axis)] + [(a, weights_other) for a in range(ndim) if a != axis]


def edge_gpu(x, axis, mode, cval, output, smooth):
    """The GPU path of sobel and prewitt: ``[-1, 0, 1]`` along ``axis``, then ``smooth`` along
    each other axis, each pass stored in the output dtype as scipy stores it."""
    out_dtype = filters.result_dtype(x.dtype, output=output)
    for ax, weights in passes(x.ndim, axis, DERIVATIVE, smooth):
        x = correlate1d.pass_gpu(x, weights, ax, mode[ax], cval, 0, out_dtype)
    return x


def dispatch(x, *, axis, mode, cval, output):
    """GPU path: scipy's separable passes, each stored in the output dtype."""
    return edge_gpu(x, axis, mode, cval, output, SMOOTH)


def supports(x, *, output=None, **params):
    out_dtype = filters.result_dtype(x.dtype, output=output)
    return correlate1d.gpu_supports(x, out_dtype)


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (41, 37), "float64")
    for mode in filters.MODES:
        yield x, (), {"axis": 0, "mode": mode, "cval": 2.0}
    yield random_array(rng, (12, 15, 9), "float32").transpose(2, 0, 1), (), {
        "axis": -1, "mode": ("wrap", "mirror", "nearest")}
    yield random_array(rng, (30, 31), "uint8", nonnegative=True), (), {"axis": 1}


SPEC = correlate1d.separable_spec(
    name="sobel",
    summary="Sobel derivative along an axis, smoothed along the others; reference scipy.ndimage.sobel",
    cpu=reference,
    gpu=dispatch,
    ndim=(1, None),
    halo=halo,
    halo_rule="1 along every axis",
    boundary=boundary,
    supports=supports,
    validate=validate,
    cases=cases,
)
