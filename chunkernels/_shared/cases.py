"""Random inputs for the kernels' ``cases`` (what ``chunkernels check`` runs), also offered to
users through :mod:`chunkernels.testing`."""

from __future__ import annotations

import numpy as np


def random_array(rng, shape, dtype, *, nonnegative=False):
    """Random values of ``dtype`` for kernel checks.

    Floats are standard normal, or uniform in [0, 1) with ``nonnegative`` (image-like data);
    integers are uniform in the dtype's range clipped to [-2**20, 2**20] (to [0, 2**20] with
    ``nonnegative``), so sums of many stay exact in float64.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        values = rng.random(shape) if nonnegative else rng.standard_normal(shape)
        return values.astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    info = np.iinfo(dtype)
    low = 0 if nonnegative else max(info.min, -(2**20))
    return rng.integers(low, min(info.max, 2**20), size=shape, endpoint=True).astype(dtype)
