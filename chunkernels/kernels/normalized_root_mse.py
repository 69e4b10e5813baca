"""normalized_root_mse: root mean squared error over a normalisation of the true image.

Reference: ``skimage.metrics.normalized_root_mse`` (scikit-image 0.26), normalisations
``'euclidean'`` (root mean square of ``image_true``), ``'min-max'`` (its range) and ``'mean'``.
It reuses the statistics pass of ``mean_squared_error`` (``kernels_cuda/mean_squared_error.cu``),
which also gathers the sums, minimum and maximum of the true image: one read of both images.
"""

from __future__ import annotations

import numpy as np

from chunkernels._registry import KernelSpec, always
from chunkernels.kernels import mean_squared_error

NORMALIZATIONS = ("euclidean", "min-max", "mean")


def reference(image_true: np.ndarray, image_test: np.ndarray, *,
              normalization: str = "euclidean") -> np.float64:
    """CPU reference: scikit-image's normalized root mean squared error."""
    t = mean_squared_error.float_type(image_true.dtype, image_test.dtype)
    true = np.asarray(image_true, dtype=t)
    normalization = normalization.lower()
    if normalization == "euclidean":
        denom = np.sqrt(np.mean(true * true, dtype=np.float64))
    elif normalization == "min-max":
        denom = true.max() - true.min()
    else:
        denom = true.mean()
    return np.sqrt(mean_squared_error.reference(image_true, image_test)) / denom


def finalize(stats, dtypes, *, normalization="euclidean"):
    """NRMSE from the combined statistics.

    'min-max' subtracts in the images' float type, as scikit-image does. 'mean' divides a float64
    sum; scikit-image sums float32 images in float32, so float32 results agree to float32
    precision, not closer.
    """
    sum_sq, sum_a2, sum_a, lo, hi, count = mean_squared_error.combine(stats)
    t = mean_squared_error.float_type(*dtypes)
    if normalization == "euclidean":
        denom = (sum_a2 / count) ** 0.5
    elif normalization == "min-max":
        denom = hi.astype(t) - lo.astype(t)
    else:
        denom = (sum_a / count).astype(t)
    return (sum_sq / count) ** 0.5 / denom


def validate(ndim, *, normalization="euclidean"):
    """``normalization``, case-insensitive, one of :data:`NORMALIZATIONS`."""
    value = normalization.lower() if isinstance(normalization, str) else normalization
    if value not in NORMALIZATIONS:
        raise ValueError(f"Unsupported norm_type: normalization={normalization!r}; use one of "
                         f"{', '.join(map(repr, NORMALIZATIONS))}")
    return {"normalization": value}


def cases(rng):
    for i, (x, ops, _) in enumerate(mean_squared_error.cases(rng)):
        yield x, ops, {"normalization": NORMALIZATIONS[i % 3]}


SPEC = KernelSpec(
    name="normalized_root_mse",
    summary="RMSE over a normalisation of the true image; reference skimage.metrics.normalized_root_mse",
    cpu=reference,
    gpu=mean_squared_error.dispatch,
    kind="reduction",
    source="mean_squared_error.cu",
    entries=("squared_error_stats<float, float, float, int, 2>",),
    dtypes=mean_squared_error.GPU_DTYPES,
    operands=("image_test",),
    alignment="same",
    result_dtype=always(np.float64),
    supports=mean_squared_error.supports,
    validate=validate,
    partial=mean_squared_error.partial,
    finalize=finalize,
    cases=cases,
    rtol=1e-6,
    skimage=("skimage.metrics:normalized_root_mse",),
)
