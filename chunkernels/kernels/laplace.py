"""laplace: the N-D Laplace filter, a sum of second differences along the filtered axes.

Reference: ``scipy.ndimage.laplace`` (``generic_laplace`` with ``[1, -2, 1]`` correlations): each
axis' term is stored in the output dtype and added to the output, as scipy adds them. The GPU
runs the same passes (``kernels_cuda/correlate1d.cu``) and the same additions.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage as ndi

from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels.kernels import correlate1d

SECOND_DIFFERENCE = np.array([1.0, -2.0, 1.0])


def reference(x, *, axes, mode, cval=0.0, output=None):
    """CPU reference: ``scipy.ndimage.laplace``."""
    return ndi.laplace(x, output, list(mode), cval, axes=axes)


def validate(ndim, mode="reflect", cval=0.0, axes=None, output=None):
    """scipy.ndimage.laplace's parameters; ``mode`` may give one mode per filtered axis."""
    axes = filters.check_axes(axes, ndim)
    return {"axes": axes, "mode": filters.modes(mode, len(axes)), "cval": filters.check_cval(cval),
            "output": filters.output_dtype(output)}


def halo(ndim, *, axes, **params):
    """1 along each filtered axis."""
    return filters.depth_along(ndim, dict.fromkeys(axes, 1))


def dispatch(x, *, axes, mode, cval, output):
    """GPU path: one correlate1d pass per axis, the terms added in the output dtype."""
    out_dtype = filters.result_dtype(x.dtype, output=output)
    if not axes:
        return x.astype(out_dtype, order="K", copy=True)
    out = None
    for ax, md in zip(axes, mode):
        term = correlate1d.pass_gpu(x, SECOND_DIFFERENCE, ax, md, cval, 0, out_dtype)
        if out is None:
            out = term
        else:
            out += term
    return out


def supports(x, *, output=None, **params):
    return correlate1d.gpu_supports(x, filters.result_dtype(x.dtype, output=output))


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (41, 37), "float64")
    for mode in filters.MODES:
        yield x, (), {"mode": mode, "cval": 1.0}
    yield random_array(rng, (12, 15, 9), "float32")[:, ::-1], (), {
        "mode": ("wrap", "mirror"), "axes": (0, 2)}
    yield random_array(rng, (30, 31), "int16"), (), {}


SPEC = correlate1d.separable_spec(
    name="laplace",
    summary="N-D Laplace filter (second differences summed); reference scipy.ndimage.laplace",
    cpu=reference,
    gpu=dispatch,
    halo=halo,
    halo_rule="1 along each filtered axis",
    supports=supports,
    validate=validate,
    cases=cases,
)
