"""prewitt: the Prewitt derivative along one axis, smoothed by a box along the others.

Reference: ``scipy.ndimage.prewitt``: a ``[-1, 0, 1]`` correlation along ``axis``, then
``[1, 1, 1]`` along every other axis in turn, each pass stored in the output dtype. It is sobel
with another smoothing, so it shares sobel's parameters, halo and GPU passes
(``kernels_cuda/correlate1d.cu``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.ndimage as ndi

from chunkernels._shared import filters
from chunkernels._shared.cases import random_array
from chunkernels.kernels import sobel

SMOOTH = np.array([1.0, 1.0, 1.0])


def reference(x, *, axis=-1, mode="reflect", cval=0.0, output=None):
    """CPU reference: ``scipy.ndimage.prewitt``."""
    return ndi.prewitt(x, axis, output, mode if isinstance(mode, str) else list(mode), cval)


def dispatch(x, *, axis, mode, cval, output):
    """GPU path: scipy's separable passes, each stored in the output dtype."""
    return sobel.edge_gpu(x, axis, mode, cval, output, SMOOTH)


def cases(rng):
    """Random inputs for ``chunkernels check``."""
    x = random_array(rng, (39, 36), "float64")
    for mode in filters.MODES:
        yield x, (), {"axis": 1, "mode": mode, "cval": -1.5}
    yield random_array(rng, (11, 14, 8), "float32").transpose(1, 2, 0)[::-1], (), {
        "axis": 0, "mode": ("mirror", "wrap", "constant")}
    yield random_array(rng, (28, 33), "int16"), (), {"axis": 0, "output": np.float32}


#: sobel's spec (parameters, halo, boundary, GPU support) with prewitt's reference, passes and cases
SPEC = dataclasses.replace(
    sobel.SPEC,
    name="prewitt",
    summary="Prewitt derivative along an axis, box-smoothed along the others; reference "
            "scipy.ndimage.prewitt",
    cpu=reference,
    gpu=dispatch,
    cases=cases,
)
