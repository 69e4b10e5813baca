"""mean_squared_error: mean of ``(a - b)**2`` over two same-shape images, as scikit-image.

Reference: ``skimage.metrics.mean_squared_error`` (scikit-image 0.26). Both images are converted to
scikit-image's float type for the pair (float32 stays float32, float16 becomes float32, other
types float64), the squared differences are taken in that type and averaged in float64.

Chunked: each block yields rows of partial statistics (the device kernel one row per thread
block), and one finalize step combines them. The same statistics serve ``normalized_root_mse``
(``chunkernels/kernels/normalized_root_mse.py``). CUDA source: ``kernels_cuda/mean_squared_error.cu``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec, always
from chunkernels._shared.cases import random_array

#: Columns of a statistics row: sum (a-b)^2, sum a^2, sum a, min a, max a, element count.
SUM_SQ, SUM_A2, SUM_A, MIN_A, MAX_A, COUNT = range(6)
STATS = 6
MAX_NDIM = 4
_THREADS = 256
_BLOCKS_PER_SM = 8

_FLOAT_TYPES = {"e": np.float32, "f": np.float32, "d": np.float64, "g": np.float64}
GPU_DTYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
              "float32", "float64")


def float_type(*dtypes) -> np.dtype:
    """scikit-image's float type for a set of input dtypes (complex refused, as it does)."""
    for dt in map(np.dtype, dtypes):
        if dt.kind == "c":
            raise ValueError("complex valued input is not supported")
    return np.dtype(np.result_type(*(_FLOAT_TYPES.get(np.dtype(d).char, np.float64)
                                     for d in dtypes)))


def reference(a: np.ndarray, b: np.ndarray) -> np.float64:
    """CPU reference: scikit-image's mean squared error of ``a`` and ``b``."""
    t = float_type(a.dtype, b.dtype)
    a, b = np.asarray(a, dtype=t), np.asarray(b, dtype=t)
    return np.mean((a - b) ** 2, dtype=np.float64)


def partial(a: np.ndarray, b: np.ndarray, **params) -> np.ndarray:
    """CPU statistics of one block pair: a (1, STATS) row, the layout the GPU kernel writes."""
    t = float_type(a.dtype, b.dtype)
    a, b = np.asarray(a, dtype=t), np.asarray(b, dtype=t)
    d = a - b
    row = np.empty((1, STATS))
    row[0, SUM_SQ] = np.sum(d * d, dtype=np.float64)
    row[0, SUM_A2] = np.sum(a * a, dtype=np.float64)
    row[0, SUM_A] = np.sum(a, dtype=np.float64)
    row[0, MIN_A] = a.min() if a.size else np.inf
    row[0, MAX_A] = a.max() if a.size else -np.inf
    row[0, COUNT] = a.size
    return row


def dispatch(a, b, **params):
    """GPU statistics of one block pair: one row per CUDA thread block, views read in place."""
    cp = cuda.cupy()
    if a.size == 0:
        return cp.asarray(partial(np.empty(0, a.dtype), np.empty(0, b.dtype)))
    plan = layout.plan_pointwise(a, b)
    if plan.ndim > MAX_NDIM:
        axis = plan.axes[0][0]
        index = lambda i: (slice(None),) * axis + (i,)  # noqa: E731
        return cp.concatenate([dispatch(a[index(i)], b[index(i)]) for i in range(a.shape[axis])])
    shape = plan.shape or (1,)
    pad = MAX_NDIM - len(shape)
    extents = list(shape[1:]) + [1] * pad
    a_strides = list(plan.strides[0] or (0,)) + [0] * pad
    b_strides = list(plan.strides[1] or (0,)) + [0] * pad
    n = math.prod(shape)
    blocks = max(1, min(-(-n // _THREADS), _BLOCKS_PER_SM * cuda.sm_count(cp.cuda.runtime.getDevice())))
    t = float_type(a.dtype, b.dtype)
    index_type = "long long" if plan.index64 else "int"
    expr = (f"squared_error_stats<{cuda.cuda_type(a.dtype)}, {cuda.cuda_type(b.dtype)}, "
            f"{cuda.cuda_type(t)}, {index_type}, {len(shape)}>")
    kernel = cuda.function("mean_squared_error", expr)
    rows = cp.empty((blocks, STATS), dtype=np.float64)
    i = np.int64 if plan.index64 else np.int32
    kernel((blocks,), (_THREADS,), (a, b, rows, i(n), *map(i, extents), *map(i, a_strides),
                                   *map(i, b_strides)))
    return rows


def combine(stats):
    """Sums, minimum and maximum over rows of statistics (NumPy or CuPy, on their device)."""
    sums = stats[:, [SUM_SQ, SUM_A2, SUM_A, COUNT]].sum(axis=0)
    return sums[0], sums[1], sums[2], stats[:, MIN_A].min(), stats[:, MAX_A].max(), sums[3]


def finalize(stats, dtypes, **params):
    """Mean squared error from the combined statistics."""
    sum_sq, _, _, _, _, count = combine(stats)
    return sum_sq / count


def validate_pair(ndim, **params):
    """No parameters."""
    if params:
        raise TypeError(f"mean_squared_error takes no parameters; got {sorted(params)}")
    return {}


def supports(a, b, **params):
    """The GPU kernel reads pairs of the same shape (scikit-image requires it)."""
    if a.shape != b.shape:
        return False, f"shapes differ: {a.shape} and {b.shape}"
    return True, ""


def cases(rng):
    """Random image pairs: dtypes scikit-image sees, and the views Dask hands a kernel."""
    image = functools.partial(random_array, rng, nonnegative=True)
    for da_, db_ in (("float32", "float32"), ("float64", "float64"), ("uint8", "uint8"),
                     ("uint16", "float32"), ("int32", "int64")):
        yield image((67, 45), da_), (image((67, 45), db_),), {}
    a, b = image((40, 6, 33), "float64"), image((40, 6, 33), "float64")
    yield a.transpose(2, 0, 1), (b[::-1].transpose(2, 0, 1),), {}
    base = image((64, 130), "float32")
    yield base[::2, 3:-3], (base[1::2, 3:-3],), {}
    yield image((3, 4, 2, 5, 6), "float32")[:, ::2, :, ::2], (image((3, 2, 2, 3, 6), "float32"),), {}


SPEC = KernelSpec(
    name="mean_squared_error",
    summary="mean of (a - b)**2 over two same-shape images; reference skimage.metrics.mean_squared_error",
    cpu=reference,
    gpu=dispatch,
    kind="reduction",
    source="mean_squared_error.cu",
    entries=("squared_error_stats<float, float, float, int, 2>",
             "squared_error_stats<unsigned char, unsigned char, double, long long, 4>",
             "squared_error_stats<int, long long, double, int, 1>"),
    dtypes=GPU_DTYPES,
    operands=("image1",),
    alignment="same",
    result_dtype=always(np.float64),
    supports=supports,
    validate=validate_pair,
    partial=partial,
    finalize=finalize,
    cases=cases,
    skimage=("skimage.metrics:mean_squared_error",),
)
