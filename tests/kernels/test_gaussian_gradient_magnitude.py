"""gaussian_gradient_magnitude against scipy.ndimage.gaussian_gradient_magnitude: scipy's and
dask-image's cases, every mode and synonym with cval, per-axis sigma (one per input axis, also
with ``axes``, as scipy smooths every axis) and modes (modes mixing 'wrap' with others make the
axes one chunk), truncate and radius, integer outputs (squares and sums wrapping, the root taken
in NumPy's dtype and truncated, wrapped signed sums included, as scipy's), float32, layouts, 0-d,
0-size and size-1 axes, chunks smaller than the halo, wrap across chunks, chunking invariance,
complex data (CPU reference), and scipy's errors. scipy's truncate test and dask-image's
comparisons, which test both Gaussian derivative filters alike, are in test_gaussian_laplace.py."""

import itertools

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from filtercheck import (A35, ARR, MODES, SYNONYMS, TYPES, backends, check, check_invariance,
                         chunked_arrays, device, layouts, tolerances)
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkernels import CPUFallbackWarning, ndimage
from chunkernels.testing import assert_close


def _scipy_expected(x):
    """scipy's test_gaussian_gradient_magnitude01/02: the root of the terms' squares."""
    t1 = ndi.gaussian_filter(x, 1.0, [1, 0])
    t2 = ndi.gaussian_filter(x, 1.0, [0, 1])
    squares = t1 * t1 + t2 * t2
    return np.sqrt(squares.astype(np.float64) if x.dtype.kind == "i" else squares).astype(x.dtype)


@backends
@pytest.mark.parametrize("dtype", ["int32", "float32", "float64"])
def test_scipy_gaussian_gradient_magnitude01_02(backend, dtype):
    x = A35.astype(dtype) * 100
    expected = _scipy_expected(x)
    assert_close(ndimage.gaussian_gradient_magnitude(device(backend, x), 1.0), expected,
                 rtol=1e-6, atol=1e-6)
    out = device(backend, np.zeros(x.shape, dtype))
    assert ndimage.gaussian_gradient_magnitude(device(backend, x), 1.0, out) is out
    assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_scipy_complex_by_the_cpu_reference(dtype):
    x = A35.astype(dtype) * 100
    assert_close(ndimage.gaussian_gradient_magnitude(x, 1.0), _scipy_expected(x), rtol=1e-6,
                 atol=1e-6)
    dx = da.from_array(x, chunks=2)
    assert_close(ndimage.gaussian_gradient_magnitude(dx, 1.0).compute(),
                 ndi.gaussian_gradient_magnitude(x, 1.0))


@pytest.mark.gpu
def test_complex_falls_back_to_the_cpu_reference_on_the_gpu():
    x = (A35 + 1j * A35[::-1]).astype(np.complex128)
    with pytest.warns(CPUFallbackWarning):
        got = ndimage.gaussian_gradient_magnitude(device("cupy", x), 1.0)
    assert_close(got, ndi.gaussian_gradient_magnitude(x, 1.0))


@backends
def test_scipy_generic_gradient_magnitude01(backend):
    """scipy's generic_gradient_magnitude with a Gaussian first derivative is this filter."""
    def derivative(input, axis, output, mode, cval, a, b):
        order = [0] * input.ndim
        order[axis] = 1
        return ndi.gaussian_filter(input, [a, b / 2.0], order, output, mode, cval)

    x = A35.astype(np.float64)
    expected = ndi.generic_gradient_magnitude(x, derivative, extra_arguments=(1.0,),
                                              extra_keywords={"b": 2.0})
    assert_close(ndimage.gaussian_gradient_magnitude(device(backend, x), 1.0), expected,
                 **tolerances(backend, x.dtype))


@backends
def test_scipy_multiple_modes(backend):
    expected = np.array([[0.04928965, 0.09745625, 0.06405368],
                         [0.23056905, 0.14025305, 0.04550846],
                         [0.19894369, 0.14950060, 0.06796850]])
    got = ndimage.gaussian_gradient_magnitude(device(backend, ARR), 1, mode=["reflect", "wrap"])
    assert_close(got, expected, rtol=0, atol=1e-7)
    mode2 = ndimage.gaussian_gradient_magnitude(device(backend, ARR), 1, mode=["reflect"] * 2)
    assert_close(ndimage.gaussian_gradient_magnitude(device(backend, ARR), 1, mode="reflect"),
                 mode2, **tolerances(backend, ARR.dtype))


@backends
def test_scipy_derivative_filter_axes(backend):
    """scipy's test_derivative_filter_axes: the gradient along ``axes`` of each slice (sigma 1.0,
    which also smooths the other axes, as scipy's does)."""
    x = np.arange(6.0 * 8 * 12).reshape(6, 8, 12)
    tol = tolerances(backend, x.dtype)
    f = ndi.gaussian_gradient_magnitude
    got = ndimage.gaussian_gradient_magnitude(device(backend, x), 1.0, axes=(1, 2))
    assert_close(got, f(x, 1.0, axes=(1, 2)), **tol)
    # scipy's comparison, which holds for its data, linear along the smoothed axis 0
    assert_close(got, np.stack([f(x[i], 1.0) for i in range(6)]), rtol=1e-7, atol=1e-12)
    got = ndimage.gaussian_gradient_magnitude(device(backend, x), 1.0, axes=(0, -1))
    assert_close(got, f(x, 1.0, axes=(0, -1)), **tol)
    got = ndimage.gaussian_gradient_magnitude(device(backend, x), (0.0, 1.0, 1.0), axes=(1, 2))
    assert_close(got, np.stack([f(x[i], 1.0) for i in range(6)]), **tol)
    for axes in [(1, 2), (2, 0), (1,), ()]:
        check(backend, ndimage.gaussian_gradient_magnitude, f, x, 0.9, axes=axes,
              chunks=[(3, 3, 5)])


@backends
@pytest.mark.parametrize("mode", MODES + SYNONYMS)
def test_modes(backend, mode):
    x = np.random.default_rng(111).standard_normal((19, 22))
    check(backend, ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, x, 1.4,
          mode=mode, cval=-0.5, chunks=[(6, 7), (19, 2)])


@backends
def test_per_axis_sigma_modes_radius_truncate(backend):
    x = np.random.default_rng(112).standard_normal((12, 15, 10))
    f = ndi.gaussian_gradient_magnitude
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, (1.0, 0.6, 1.8),
          mode=("nearest", "constant", "mirror"), cval=1.0, chunks=[(4, 5, 6), (12, 3, 2)])
    # sigma per axis of the input with axes: the unfiltered axis 1 is smoothed too
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, (2.0, 1.0, 0.0),
          mode=("wrap", "wrap"), axes=(2, 0), truncate=1.5, chunks=[(2, 4, 3)])
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, 1.5, axes=(0, 1),
          radius=(2, 4, 9), chunks=[(5, 3, 10)])


@backends
def test_mixed_wrap_modes_make_the_axes_one_chunk(backend):
    """Every axis with a sigma is filtered by every term with the term's mode: 'wrap' mixed with
    others needs the whole axis there; an axis without sigma keeps its chunks."""
    x = np.random.default_rng(113).standard_normal((12, 14, 10))
    dx = da.from_array(device(backend, x), chunks=(4, 5, 3), asarray=False)
    got = ndimage.gaussian_gradient_magnitude(dx, (1.0, 0.0, 1.2), mode=("wrap", "mirror"),
                                              axes=(0, 2))
    assert got.chunks == ((12,), dx.chunks[1], (10,))
    assert_close(got.compute(), ndi.gaussian_gradient_magnitude(
        x, (1.0, 0.0, 1.2), mode=["wrap", "mirror"], axes=(0, 2)), **tolerances(backend, x.dtype))


@backends
@pytest.mark.parametrize("dtype", TYPES)
def test_dtypes_round_as_scipy(backend, dtype):
    """Each pass truncates into the output dtype, squares and sums wrap there (unsigned ones),
    the root is taken in NumPy's dtype for it and truncated, as scipy's."""
    rng = np.random.default_rng(114)
    # signed data small enough that no square or sum wraps (that case: test_wrapped_sums)
    x = (rng.integers(0, 9 if dtype == "int8" else 200, (14, 15))
         if np.dtype(dtype).kind in "iu" else rng.standard_normal((14, 15)) * 50).astype(dtype)
    f = ndi.gaussian_gradient_magnitude
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, 1.0, chunks=[(5, 4)])
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, 0.8, output=np.float32,
          chunks=[(14, 2)])
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, 1.2, output=np.uint16,
          chunks=[(3, 15)])


@backends
@pytest.mark.parametrize("dtype", ["int16", "int32", "int64", "uint8", "uint32"])
def test_wrapped_sums(backend, dtype):
    """Squares and sums that wrap in the output dtype, signed ones below zero (whose NaN root
    scipy casts to 0 for 16-bit and to the minimum for 32- and 64-bit integers)."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(115).integers(0, info.max // 2, (16, 15)).astype(dtype)
    with np.errstate(invalid="ignore"):
        expected = ndi.gaussian_gradient_magnitude(x, 1.0)
        if info.min < 0:
            assert (expected == (info.min if info.bits >= 32 else 0)).any()
        check(backend, ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, x,
              1.0, chunks=[(5, 6)])


@backends
def test_output_array(backend):
    x = np.random.default_rng(116).integers(0, 255, (12, 13)).astype(np.uint8)
    out = device(backend, np.zeros((12, 13), np.float64))
    assert ndimage.gaussian_gradient_magnitude(device(backend, x), 1.5, output=out) is out
    assert_close(out, ndi.gaussian_gradient_magnitude(x, 1.5, output=np.float64))


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(117), dtype="float32")[index]
    check(backend, ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, x,
          (1.2, 0.7), mode=("mirror", "nearest"), chunks=[(6, 5)])


@backends
@pytest.mark.parametrize("shape", [(1, 7), (7, 1), (0, 4), (1,), (0,), (2, 1, 3), ()])
def test_size_one_empty_and_0d(backend, shape):
    x = np.random.default_rng(118).standard_normal(shape)
    check(backend, ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, x, 1.0,
          mode="reflect", chunks=[tuple(max(1, n // 2) for n in shape)])


@backends
def test_zero_sigma_and_no_axes(backend):
    """sigma 0: each term is the input, squared; no axes: the input, copied (no root)."""
    x = np.random.default_rng(119).integers(0, 9, (6, 7)).astype(np.int16)
    f = ndi.gaussian_gradient_magnitude
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, 0.0, chunks=[(2, 3)])
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, (0.0, 1.0), chunks=[(2, 3)])
    check(backend, ndimage.gaussian_gradient_magnitude, f, x, 1.0, axes=(), output=np.float32,
          chunks=[(2, 3)])


@backends
def test_chunks_smaller_than_the_halo_and_wrap_across_chunks(backend):
    x = np.random.default_rng(120).standard_normal((28, 25))
    check(backend, ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, x, 2.5,
          mode="wrap", chunks=[(3, 4), (1, 25), (28, 2)])


@settings(max_examples=30, deadline=None)
@given(case=chunked_arrays(max_dims=3), data=st.data())
def test_chunking_invariance(case, data):
    x, chunks = case
    axes = data.draw(st.sampled_from([None] + [c for n in range(1, x.ndim + 1)
                                                for c in itertools.combinations(range(x.ndim), n)]))
    count = x.ndim if axes is None else len(axes)
    sigma = tuple(data.draw(st.floats(0.3, 2.5)) for _ in range(x.ndim))
    mode = tuple(data.draw(st.sampled_from(MODES)) for _ in range(count))
    check_invariance(ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, x,
                     chunks, sigma, mode=mode, cval=1.0, axes=axes)


@pytest.mark.parametrize("args, kwargs, error, match", [
    (([[1.0]],), {}, RuntimeError, "sequence argument must have length"),  # dask-image's cases
    (([1.0],), {}, RuntimeError, "sequence argument must have length"),
    ((1.0 + 0.0j,), {}, TypeError, "sigma must be a real number"),
    ((1.0,), {"truncate": 4.0 + 0.0j}, TypeError, "truncate must be a real number"),
    ((1.0,), {"axes": (1, 1)}, ValueError, "axes must be unique"),          # scipy's
    ((1.0,), {"axes": (2,)}, ValueError, "out of range"),
    (((1.0,),), {"axes": (0,)}, RuntimeError, "sequence argument.*sigma"),  # one per input axis
    ((1.0,), {"mode": ["wrap"] * 3}, RuntimeError, "sequence argument.*mode"),
    ((1.0,), {"mode": "bogus"}, RuntimeError, "boundary mode not supported"),
    ((1.0,), {"radius": -1}, ValueError, "Radius must be a nonnegative integer"),
    ((1.0,), {"output": "U4"}, RuntimeError, "output must have numeric dtype"),
    ((1.0,), {"order": 1}, TypeError, "unexpected keyword argument 'order'"),
])
def test_errors_before_any_work(args, kwargs, error, match):
    a = np.arange(140.0).reshape(10, 14)
    for x in (a, da.from_array(a, chunks=(5, 7))):
        with pytest.raises(error, match=match):
            ndimage.gaussian_gradient_magnitude(x, *args, **kwargs)


@backends
@pytest.mark.parametrize("mode", MODES)
def test_radius_a_few_times_the_array_folds_onto_it(references_fold, backend, mode):
    """Issue #20: the terms' Gaussians fold onto the array where they are wider than it; the
    squares and the root stay SciPy's (integer outputs included)."""
    x = np.random.default_rng(91).standard_normal((7, 5))
    check(backend, ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, x,
          (6.0, 4.0), mode=mode, cval=0.3, chunks=[(7, 5), (3, 2)])
    xi = (x * 1000).astype(np.int32)
    expected = ndi.gaussian_gradient_magnitude(xi, 5.0, mode=mode)
    for data in (xi, da.from_array(xi, chunks=(3, 2))):
        got = np.asarray(ndimage.gaussian_gradient_magnitude(data, 5.0, mode=mode))
        assert got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, atol=1)
