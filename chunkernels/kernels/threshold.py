"""threshold: ``x > value`` (and, with ``upper``, ``& (x < upper)``) as a boolean mask.

The segmentation step of source finding (``np.where(data > threshold, 1, 0)`` in the GPU lesson,
seed 002) and the keep mask of κ-σ clipping (the open window ``(lower, upper)``). Comparisons
are strict and follow NumPy's type rules for the scalar: a Python float compared with float32 data
is rounded to float32 first (NumPy treats it as a weak scalar), a ``numpy.float64`` compares in
float64. On CuPy blocks a ``cupy.ElementwiseKernel`` computes it, reading any view in place
(CuPy's elementwise kernels index by strides); the output follows the input's memory order.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec, always

GPU_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64")


def reference(x, *, value, upper=None):
    """CPU reference: ``numpy.greater(x, value)``, and ``numpy.less(x, upper)`` when given."""
    mask = np.greater(x, value)
    if upper is not None:
        mask &= np.less(x, upper)
    return mask


def dispatch(x, *, value, upper=None):
    """GPU path: the comparison as a CuPy elementwise kernel, on any view of ``x``."""
    cp = cuda.cupy()
    out = layout.empty_like(cp, x, np.bool_)
    lo = _typed(x.dtype, value)
    if upper is None:
        _kernel(lo.dtype)(x, lo, out)
    else:
        hi = _typed(x.dtype, upper)
        _kernel(lo.dtype, hi.dtype)(x, lo, hi, out)
    return out


def _typed(x_dtype, value):
    """``value`` as a NumPy scalar of the dtype NumPy compares ``x_dtype`` data and it in,
    rounded as NumPy rounds it (a Python float to float32 next to float32 data)."""
    try:
        with np.errstate(over="ignore"):  # NumPy compares an out-of-range float as +-inf
            return np.result_type(x_dtype, value).type(value)
    except OverflowError:  # a Python int beyond x's integer type, which NumPy compares exactly
        return np.result_type(x_dtype, np.asarray(value)).type(value)


@functools.cache
def _kernel(lo_dtype, hi_dtype=None):
    """The elementwise comparison for scalars of these dtypes (CuPy compiles it per input dtype
    and device on first use).

    The scalars' types are spelled out rather than left to type placeholders: CuPy 14 does not
    bind a placeholder from a NumPy scalar alone (``KeyError`` on the placeholder).
    """
    cp = cuda.cupy()
    lo = _ctype(lo_dtype)
    if hi_dtype is None:
        return cp.ElementwiseKernel(f"T x, {np.dtype(lo_dtype).name} lo", "bool y",
                                    f"y = ({lo})x > lo", "chunkernels_threshold")
    hi = _ctype(hi_dtype)
    return cp.ElementwiseKernel(
        f"T x, {np.dtype(lo_dtype).name} lo, {np.dtype(hi_dtype).name} hi", "bool y",
        f"y = (({lo})x > lo) && (({hi})x < hi)", "chunkernels_threshold_band")


def _ctype(dtype) -> str:
    """The C++ type CuPy's elementwise kernels use for ``dtype``."""
    return "float16" if np.dtype(dtype) == np.float16 else cuda.cuda_type(dtype)


def validate(ndim, *, value=None, upper=None):
    """``value`` and ``upper``: real scalars (Python or NumPy numbers, 0-d arrays)."""
    if value is None:
        raise TypeError("threshold needs value=, the level x is compared with (x > value); "
                        "e.g. chunkernels.apply(x, 'threshold', value=5.0)")
    return {"value": _scalar("value", value),
            "upper": None if upper is None else _scalar("upper", upper)}


def _scalar(name, value):
    if cuda.is_cupy_array(value):
        value = value.get()
    if isinstance(value, np.ndarray):
        if value.ndim:
            raise ValueError(f"threshold: {name} must be a scalar; got an array of shape "
                             f"{value.shape}")
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"threshold: {name}={value!r} ({type(value).__name__}); expected a real "
                        f"number (int, float or a NumPy scalar)")
    return value


def _cases(rng):
    """Random data for ``chunkernels check``: weak and strong scalars, bands, views."""
    x32 = rng.standard_normal((37, 45)).astype(np.float32)
    yield x32, (), {"value": 0.1}  # rounded to float32, as NumPy does
    yield x32, (), {"value": np.float64(0.1)}  # compared in float64
    yield x32[::-1, ::3], (), {"value": -0.5, "upper": np.float64(1.25)}
    yield np.asfortranarray(rng.standard_normal((20, 9, 4))), (), {"value": 0.0, "upper": 2.0}
    yield rng.integers(-50, 50, size=(31, 17)).astype(np.int16), (), {"value": 3.5}
    yield rng.integers(0, 255, size=(8, 40), dtype=np.uint8), (), {"value": 300, "upper": None}


SPEC = KernelSpec(
    name="threshold",
    summary="x > value (strict; and x < upper with upper) as a bool mask; reference numpy.greater",
    cpu=reference,
    gpu=dispatch,
    kind="elementwise",
    dtypes=GPU_DTYPES,
    result_dtype=always(np.bool_),
    validate=validate,
    cases=_cases,
)
