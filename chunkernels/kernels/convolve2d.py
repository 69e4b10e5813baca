"""convolve2d: 2-D convolution with scipy.signal's output modes and boundaries.

Reference: ``scipy.signal.convolve2d``: result dtype ``numpy.result_type(in1, in2)``, sums in that
type (integers wrap as scipy's integer arithmetic does), ``mode`` full / same / valid, ``boundary``
fill (with ``fillvalue``) / wrap / symm. The GPU runs it as a correlation with the flipped weights
on the N-D tile kernel (``kernels_cuda/correlate.cu``), reading the output window each mode
defines. Through ``apply`` on Dask arrays, ``mode='same'`` (the one that keeps the shape);
:func:`chunkernels.signal.convolve2d` gives full and valid on Dask arrays by padding and slicing.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.signal as signal

from chunkernels import cuda
from chunkernels._errors import HaloError
from chunkernels._registry import KernelSpec
from chunkernels._shared.cases import random_array
from chunkernels._shared.filters import FilterArgumentError
from chunkernels.kernels import correlate, correlate1d

MODES = ("full", "same", "valid")
BOUNDARIES = {"fill": "fill", "pad": "fill", "wrap": "wrap", "circular": "wrap",
              "symm": "symm", "symmetric": "symm"}
#: scipy.ndimage's mode that extends the input as each scipy.signal boundary does.
NDIMAGE_MODE = {"fill": "constant", "wrap": "wrap", "symm": "reflect"}
#: numpy.pad's mode for the same extension.
PAD_MODE = {"fill": "constant", "wrap": "wrap", "symm": "symmetric"}


def extension(n: int, pad: int, boundary: str) -> np.ndarray:
    """Indices into an axis of ``n`` that extend it by ``pad`` on each side, as ``boundary``
    ('wrap' or 'symm') extends it: periodically, or mirrored with the edge repeated, the pattern
    repeating for pads longer than the axis (``kernels_cuda/boundary.cuh``'s wrap and reflect)."""
    j = np.arange(-pad, n + pad)
    if boundary == "wrap":
        return j % n
    r = j % (2 * n)
    return np.where(r < n, r, 2 * n - 1 - r)


def reference(x, *, weights, mode="full", boundary="fill", fillvalue=0):
    """CPU reference: ``scipy.signal.convolve2d`` (CuPy weights are copied to the host)."""
    if cuda.is_cupy_array(weights):
        weights = weights.get()
    return signal.convolve2d(x, weights, mode, boundary, fillvalue)


def validate(ndim, weights, mode="full", boundary="fill", fillvalue=0):
    """scipy.signal.convolve2d's parameters, checked and normalised.

    Host weights become a read-only copy. CuPy weights stay on their device: the GPU path reads
    them without a host round trip, which would synchronise the device (the lesson passes its
    Gaussian as a CuPy array), and a lazy graph holds a copy of them (:class:`BlockFunction`);
    the CPU reference copies them to the host.
    """
    if not cuda.is_cupy_array(weights):
        weights = np.array(weights)
    if ndim != 2 or weights.ndim != 2:
        raise FilterArgumentError(f"convolve2d inputs must both be 2-D arrays; got in1 of ndim "
                                  f"{ndim} and in2 of ndim {weights.ndim}")
    if weights.dtype.kind not in "biufc":
        raise FilterArgumentError(f"convolve2d takes numeric arrays; got in2 of dtype "
                                  f"{weights.dtype}")
    if isinstance(weights, np.ndarray):
        weights.setflags(write=False)
    if mode not in MODES:
        raise FilterArgumentError(f"Acceptable mode flags are 'valid', 'same', or 'full'; got "
                                  f"mode={mode!r}")
    if boundary not in BOUNDARIES:
        raise FilterArgumentError(
            f"Acceptable boundary flags are 'fill', 'circular' (or 'wrap'), and 'symmetric' (or "
            f"'symm'); got boundary={boundary!r}")
    fill = np.asarray(fillvalue)
    if fill.size != 1 or not isinstance(fill.reshape(()).item(), numbers.Number):
        raise FilterArgumentError(f"`fillvalue` must be scalar or an array with one element; "
                                  f"got {fillvalue!r}")
    return {"weights": weights, "mode": mode, "boundary": BOUNDARIES[boundary],
            "fillvalue": fill.reshape(()).item()}


def check_types(out_dtype) -> None:
    """scipy.signal's convolve2d computes in the result type; it has no bool or float16 loop."""
    if np.dtype(out_dtype).kind not in "iufc" or np.dtype(out_dtype) == np.float16:
        raise FilterArgumentError(
            f"convolve2d not available for this type: the inputs give {np.dtype(out_dtype)}; "
            f"convert them to an integer, float32/float64 or complex type first")


def fill_value(value, out_dtype):
    """``fillvalue`` as the value scipy.signal fills with in ``out_dtype``, or its error.

    scipy converts the fill value to complex and casts it to the result type, refusing a complex
    value for a real result and a value the integer type cannot hold (after truncation), as
    ``-1`` for ``uint8`` or ``nan`` for ``int32``.
    """
    kind = np.dtype(out_dtype).kind
    if kind == "c":
        return complex(value)
    if not np.iscomplexobj(value):
        if kind == "f":
            return float(value)
        number = float(value)
        if np.isfinite(number):
            info = np.iinfo(out_dtype)
            if info.min <= int(number) <= info.max:
                return int(number)
    raise FilterArgumentError(
        f"could not cast `fillvalue` directly to the output type (it was first converted to "
        f"complex): fillvalue={value!r} for a result of dtype {np.dtype(out_dtype)}; give a fill "
        f"value that {np.dtype(out_dtype)} can hold")


def result_dtype(x_dtype, *operand_dtypes, weights, **params) -> np.dtype:
    """``numpy.result_type(in1, in2)``, scipy.signal's output type."""
    return np.result_type(x_dtype, correlate1d._dtype_of(weights))


def halo(ndim, *, weights, mode, **params):
    """``weights.shape[k] // 2`` per axis, for ``mode='same'``: the only mode whose output
    blocks line up with the input's."""
    if mode != "same":
        raise HaloError(
            f"convolve2d with mode={mode!r} changes the array's shape, so its output blocks do "
            f"not line up with the input's; apply() on Dask arrays takes mode='same'. "
            f"chunkernels.signal.convolve2d computes 'full' and 'valid' on Dask arrays")
    return tuple(m // 2 for m in weights.shape)


def boundary(boundary="fill", **params):
    """Dask's boundary: the other end of the array for wrap, the kernel's own edge otherwise."""
    return "periodic" if BOUNDARIES.get(boundary) == "wrap" else "none"


def accumulator(out_dtype) -> np.dtype:
    """scipy.signal sums in the result type; integer sums wrap the same in 64 bits."""
    out_dtype = np.dtype(out_dtype)
    return out_dtype if out_dtype.kind == "f" else np.dtype(np.int64)


def window(n, m, mode):
    """``(start, size)`` of the output along an axis of ``n`` inputs and ``m`` taps: start is the
    input index that output 0 reads with the flipped weights' tap 0."""
    if mode == "full":
        return -(m - 1), n + m - 1
    if mode == "same":
        return -(m // 2), n
    return 0, n - m + 1


def result_shape(shape, *, weights, mode, **params):
    """The output's shape: scipy.signal's 'full', 'same' or 'valid' window ('valid' as scipy
    computes it, with the inputs swapped where the weights are the larger)."""
    if mode == "valid":
        return tuple(abs(n - m) + 1 for n, m in zip(shape, weights.shape))
    return tuple(window(n, m, mode)[1] for n, m in zip(shape, weights.shape))


def dispatch(x, *, weights, mode, boundary, fillvalue):
    """GPU path: correlation with the flipped weights over the mode's output window."""
    out_dtype = result_dtype(x.dtype, weights=weights)
    starts, shape = zip(*(window(n, m, mode) for n, m in zip(x.shape, weights.shape)))
    return correlate.correlate_gpu(x, weights, starts, shape, NDIMAGE_MODE[boundary], fillvalue,
                                   out_dtype, accumulator(out_dtype), flip=True)


def supports(x, *, weights, mode, **params):
    """Real inputs; for valid, an input at least as large as the weights (scipy swaps them
    otherwise, which the CPU reference does); weights whose tile fits in shared memory."""
    if weights.size == 0 or x.size == 0:
        return False, "an empty input is computed by the CPU reference"
    if mode == "valid" and any(n < m for n, m in zip(x.shape, weights.shape)):
        return False, (f"mode='valid' with in2 {weights.shape} larger than in1 {x.shape}: scipy "
                       f"swaps the inputs, which the CPU reference does")
    out_dtype = result_dtype(x.dtype, weights=weights)
    return correlate.nd_supports(x, weights, out_dtype, accumulator(out_dtype))


def cases(rng):
    """Random inputs for ``chunkernels check`` (mode 'same': the chunked mode)."""
    x = random_array(rng, (37, 29), "float64")
    for bd in ("fill", "wrap", "symm"):
        yield x, (), {"weights": rng.standard_normal((5, 4)), "mode": "same", "boundary": bd,
                      "fillvalue": 0.5}
    yield random_array(rng, (30, 20), "float32").T[::-1], (), {
        "weights": rng.standard_normal((3, 3)).astype(np.float32), "mode": "same"}
    yield random_array(rng, (24, 26), "int32"), (), {
        "weights": rng.integers(-3, 4, (3, 2)).astype(np.int32), "mode": "same", "boundary": "symm"}


SPEC = KernelSpec(
    name="convolve2d",
    summary="2-D convolution, full/same/valid, fill/wrap/symm; reference scipy.signal.convolve2d",
    cpu=reference,
    gpu=dispatch,
    kind="raw",
    source="correlate.cu",
    entries=(
        "correlate_nd<double, double, double, int>",
        "correlate_nd<float, float, float, long long>",
        "correlate_nd<unsigned char, unsigned char, long long, int>",
    ),
    dtypes=correlate1d.GPU_DTYPES,
    ndim=(2, 2),
    halo=halo,
    halo_rule="weights.shape[k] // 2 per axis (mode='same')",
    boundary=boundary,
    result_dtype=result_dtype,
    result_shape=result_shape,
    supports=supports,
    validate=validate,
    cases=cases,
)
