"""laplace against scipy.ndimage.laplace: scipy's cases, every mode and synonym with cval and
per-axis modes, ``axes``, 0-D to 3-D data, integer and float data (each axis' term stored in the
output dtype and added there, as scipy adds them), output dtypes and arrays, layouts, 0-size and
size-1 axes, chunkings, chunking invariance, complex data (CPU reference), and scipy's errors."""

import itertools

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from filtercheck import (MODES, SYNONYMS, backends, check, check_invariance, chunked_arrays,
                         device, layouts)
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkernels import CPUFallbackWarning, ndimage
from chunkernels.testing import assert_close

A35 = np.array([[3, 2, 5, 1, 4], [5, 8, 3, 7, 1], [5, 6, 9, 3, 5]])
ARR = np.array([[1., 0., 0.], [1., 1., 0.], [0., 0., 0.]])


@backends
@pytest.mark.parametrize("dtype", ["int32", "float32", "float64"])
def test_scipy_laplace01_02(backend, dtype):
    x = A35.astype(dtype) * 100
    t = ndi.correlate1d(x, [1, -2, 1], 0) + ndi.correlate1d(x, [1, -2, 1], 1)
    assert_close(ndimage.laplace(device(backend, x)), t)
    out = device(backend, np.zeros(x.shape, dtype))
    assert ndimage.laplace(device(backend, x), output=out) is out
    assert_close(out, t)


@backends
def test_scipy_multiple_modes(backend):
    assert_close(ndimage.laplace(device(backend, ARR), mode=["reflect", "wrap"]),
                 np.array([[-2., 2., 1.], [-2., -3., 2.], [1., 1., 0.]]))
    assert_close(ndimage.laplace(device(backend, ARR), mode="reflect"),
                 ndimage.laplace(device(backend, ARR), mode=["reflect", "reflect"]))


@backends
@pytest.mark.parametrize("mode", MODES + SYNONYMS)
def test_modes(backend, mode):
    x = np.random.default_rng(80).standard_normal((22, 27))
    check(backend, ndimage.laplace, ndi.laplace, x, mode=mode, cval=-4.0, halo=1)


@backends
def test_axes(backend):
    """scipy's test_derivative_filter_axes: axes filter only those axes."""
    x = np.arange(6.0 * 8 * 12).reshape(6, 8, 12) ** 1.5
    for axes in [(1, 2), (0, -1), (1,), (2, 0), None, ()]:
        check(backend, ndimage.laplace, ndi.laplace, x, axes=axes, halo=1)
    out = ndimage.laplace(device(backend, x), axes=(1, 2))
    assert_close(out, np.stack([ndi.laplace(x[i]) for i in range(6)]))
    check(backend, ndimage.laplace, ndi.laplace, x, axes=(2, 0), mode=("wrap", "constant"),
          cval=1.0, halo=1)


@backends
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32",
                                   "int64", "uint64", "float32"])
def test_dtypes_as_scipy(backend, dtype):
    """Integer terms wrap in the output dtype as scipy's do (uint8 differences included)."""
    rng = np.random.default_rng(81)
    x = (rng.integers(0, 100, (17, 21)) if np.dtype(dtype).kind in "iu"
         else rng.standard_normal((17, 21))).astype(dtype)
    check(backend, ndimage.laplace, ndi.laplace, x, halo=1)
    check(backend, ndimage.laplace, ndi.laplace, x, output=np.float64, halo=1)


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(82), dtype="float32")[index]
    check(backend, ndimage.laplace, ndi.laplace, x, mode=("nearest", "mirror"), halo=1)


@backends
@pytest.mark.parametrize("shape", [(1, 7), (7, 1), (0, 4), (1,), (0,), (2, 1, 3), ()])
def test_size_one_empty_and_0d(backend, shape):
    x = np.random.default_rng(83).standard_normal(shape)
    check(backend, ndimage.laplace, ndi.laplace, x, mode="reflect", halo=1,
          chunks=None if shape else [()])


@backends
def test_3d_and_wrap_across_many_chunks(backend):
    x = np.random.default_rng(84).standard_normal((9, 10, 11))
    check(backend, ndimage.laplace, ndi.laplace, x, mode="wrap",
          chunks=[(1, 2, 3), (9, 1, 11), (4, 5, 6)])


@backends
def test_complex(backend):
    x = (A35 + 1j * A35[:, ::-1]).astype(np.complex64) * 100
    t = ndi.correlate1d(x, [1, -2, 1], 0) + ndi.correlate1d(x, [1, -2, 1], 1)
    if backend == "cupy":
        with pytest.warns(CPUFallbackWarning):
            got = ndimage.laplace(device(backend, x))
    else:
        got = ndimage.laplace(x)
    assert_close(got, t)


@settings(max_examples=30, deadline=None)
@given(case=chunked_arrays(max_dims=3), data=st.data())
def test_chunking_invariance(case, data):
    x, chunks = case
    axes = data.draw(st.sampled_from([None] + [c for n in range(1, x.ndim + 1)
                                                for c in itertools.combinations(range(x.ndim), n)]))
    count = x.ndim if axes is None else len(axes)
    mode = tuple(data.draw(st.sampled_from(MODES)) for _ in range(count))
    check_invariance(ndimage.laplace, ndi.laplace, x, chunks, mode=mode, cval=1.0, axes=axes)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"axes": (1, 1)}, ValueError, "axes must be unique"),
    ({"axes": (3,)}, ValueError, "out of range"),
    ({"axes": (0.5,)}, TypeError, "cannot be interpreted as an integer"),
    ({"mode": ["wrap"]}, RuntimeError, "sequence argument must have length"),
    ({"mode": "bogus"}, RuntimeError, "boundary mode not supported"),
    ({"output": np.float16}, RuntimeError, "float16 not supported"),
])
def test_errors_before_any_work(kwargs, error, match):
    a = np.arange(6.0 * 8 * 12).reshape(6, 8, 12)
    for x in (a, da.from_array(a, chunks=4)):
        with pytest.raises(error, match=match):
            ndimage.laplace(x, **kwargs)


@pytest.mark.parametrize("fn, args", [("laplace", ()), ("gaussian_laplace", (1.0,)),
                                      ("gaussian_gradient_magnitude", (1.0,))])
def test_no_axes_read_no_mode(fn, args):
    """scipy's generic_laplace and generic_gradient_magnitude copy the input when ``axes`` is
    empty, without reading ``mode``: a sequence of any length (or an unknown name) is accepted."""
    x = np.random.default_rng(15).standard_normal((5, 6))
    for mode in (("wrap", "reflect"), "foo"):
        expected = getattr(ndi, fn)(x, *args, mode=mode, axes=())
        for xin in (x, da.from_array(x, chunks=2)):
            got = getattr(ndimage, fn)(xin, *args, mode=mode, axes=())
            np.testing.assert_array_equal(np.asarray(got), expected)
