"""gaussian_laplace against scipy.ndimage.gaussian_laplace: scipy's and dask-image's cases, every
mode and synonym with cval, per-axis sigma and modes (modes mixing 'wrap' with others make the
filtered axes one chunk), ``axes``, truncate and radius (one per input axis, as scipy passes it),
integer and float32 data and outputs (every pass and sum stored in the output dtype, as scipy's),
layouts, 0-d, 0-size and size-1 axes, chunks smaller than the halo, wrap across chunks, chunking
invariance, complex data (CPU reference), and scipy's errors."""

import itertools

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from filtercheck import (A35, ARR, MODES, SYNONYMS, TYPES, backends, check, check_comprehensions,
                         check_invariance, chunked_arrays, device, layouts, tolerances)
from hypothesis import given, settings
from hypothesis import strategies as st

import chunkernels
from chunkernels import CPUFallbackWarning, HaloError, ndimage
from chunkernels.testing import assert_close


@backends
@pytest.mark.parametrize("dtype", ["int32", "float32", "float64"])
def test_scipy_gaussian_laplace01_02(backend, dtype):
    x = A35.astype(dtype) * 100
    t = ndi.gaussian_filter(x, 1.0, [2, 0]) + ndi.gaussian_filter(x, 1.0, [0, 2])
    tol = tolerances(backend, dtype)
    assert_close(ndimage.gaussian_laplace(device(backend, x), 1.0), t, **tol)
    out = device(backend, np.zeros(x.shape, dtype))
    assert ndimage.gaussian_laplace(device(backend, x), 1.0, out) is out
    assert_close(out, t, **tol)


@backends
@pytest.mark.parametrize("dtype", TYPES)
def test_scipy_generic_laplace01(backend, dtype):
    """scipy's generic_laplace with a Gaussian second derivative is gaussian_laplace."""
    def derivative2(input, axis, output, mode, cval, a, b):
        order = [0] * input.ndim
        order[axis] = 2
        return ndi.gaussian_filter(input, [a, b / 2.0], order, output, mode, cval)

    x = A35.astype(dtype)
    expected = ndi.generic_laplace(x, derivative2, extra_arguments=(1.0,),
                                   extra_keywords={"b": 2.0})
    out = device(backend, np.zeros(x.shape, dtype))
    ndimage.gaussian_laplace(device(backend, x), 1.0, out)
    assert_close(out, expected, **tolerances(backend, dtype))


@backends
def test_scipy_multiple_modes(backend):
    expected = np.array([[-0.28438687, 0.01559809, 0.19773499],
                         [-0.36630503, -0.20069774, 0.07483620],
                         [0.15849176, 0.18495566, 0.21934094]])
    got = ndimage.gaussian_laplace(device(backend, ARR), 1, mode=["reflect", "wrap"])
    assert_close(got, expected, rtol=0, atol=1e-7)
    assert_close(ndimage.gaussian_laplace(device(backend, ARR), 1, mode="reflect"),
                 ndimage.gaussian_laplace(device(backend, ARR), 1, mode=["reflect", "reflect"]),
                 **tolerances(backend, ARR.dtype))


@backends
def test_scipy_derivative_filter_axes(backend):
    """scipy's test_derivative_filter_axes: filtering ``axes`` is filtering each slice."""
    x = np.arange(6.0 * 8 * 12).reshape(6, 8, 12)
    tol = tolerances(backend, x.dtype)
    got = ndimage.gaussian_laplace(device(backend, x), 0.5, axes=(1, 2))
    assert_close(got, np.stack([ndi.gaussian_laplace(x[i], 0.5) for i in range(6)]), **tol)
    got = ndimage.gaussian_laplace(device(backend, x), 0.5, axes=(0, -1))
    assert_close(got, np.stack([ndi.gaussian_laplace(x[:, i], 0.5) for i in range(8)], 1), **tol)
    got = ndimage.gaussian_laplace(device(backend, x), 0.5, axes=1)
    assert_close(got, np.stack([np.stack([ndi.gaussian_laplace(x[i, :, j], 0.5)
                                          for j in range(12)], -1) for i in range(6)]), **tol)
    for axes in [(1, 2), (2, 0), (1,), ()]:
        check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 0.7, axes=axes,
              chunks=[(3, 3, 5)])


#: scipy and dask-image test both Gaussian derivative filters alike: these cases run for both
GAUSSIAN_DERIVATIVES = pytest.mark.parametrize("name", ["gaussian_laplace",
                                                        "gaussian_gradient_magnitude"])


@GAUSSIAN_DERIVATIVES
def test_scipy_gaussian_truncate(name):
    """scipy's test_gaussian_truncate: the filter spans 2 * int(truncate * sigma + 0.5) + 1."""
    x = np.zeros(51)
    x[25] = 1
    fn = getattr(ndimage, name)
    for y in (fn(x, sigma=2, truncate=3.5),
              fn(da.from_array(x, chunks=10), sigma=2, truncate=3.5).compute()):
        nonzero = np.nonzero(y != 0)[0]
        assert nonzero.max() - nonzero.min() + 1 == 15


@GAUSSIAN_DERIVATIVES
@pytest.mark.parametrize("sigma, truncate", [(1.0, 2.0), (1.0, 4.0), (2.0, 2.0), (2.0, 4.0),
                                             ((1.0, 2.0), 4.0)])
def test_dask_image_compare(name, sigma, truncate):
    """dask-image's test_gaussian_filters_compare."""
    a = np.arange(100.0 * 110).reshape(100, 110)
    check("numpy", getattr(ndimage, name), getattr(ndi, name), a, sigma, truncate=truncate,
          whole=False, chunks=[(50, 55)])


@GAUSSIAN_DERIVATIVES
def test_dask_image_shape_type_and_comprehensions(name):
    check_comprehensions(getattr(ndimage, name), getattr(ndi, name), 1.0, truncate=4.0)


@backends
@pytest.mark.parametrize("mode", MODES + SYNONYMS)
def test_modes(backend, mode):
    x = np.random.default_rng(101).standard_normal((21, 18))
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 1.3, mode=mode, cval=0.75,
          chunks=[(7, 6), (2, 18)])


@backends
def test_per_axis_sigma_modes_radius_truncate(backend):
    x = np.random.default_rng(102).standard_normal((13, 16, 11))
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, (1.0, 0.6, 1.8),
          mode=("nearest", "constant", "mirror"), cval=-1.0, chunks=[(4, 5, 6), (13, 3, 2)])
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, (2.0, 1.0),
          mode=("wrap", "wrap"), axes=(2, 0), truncate=1.5, chunks=[(2, 16, 3)])
    # radius goes to scipy's gaussian_filter of every axis: one per axis of the input
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 1.5, axes=(0, 1),
          radius=(2, 4, 9), chunks=[(5, 3, 11)])


@backends
def test_mixed_wrap_modes_make_the_axes_one_chunk(backend):
    """Each term filters every filtered axis with its own mode: 'wrap' mixed with others needs
    the whole axis, so those axes become one chunk (the others keep theirs)."""
    x = np.random.default_rng(103).standard_normal((12, 14, 10))
    modes = ("reflect", "wrap")
    expected = ndi.gaussian_laplace(x, 1.0, mode=list(modes), axes=(0, 2))
    dx = da.from_array(device(backend, x), chunks=(4, 5, 3), asarray=False)
    got = ndimage.gaussian_laplace(dx, 1.0, mode=modes, axes=(0, 2))
    assert got.chunks == ((12,), dx.chunks[1], (10,))
    assert_close(got.compute(), expected, **tolerances(backend, x.dtype))
    with pytest.raises(HaloError, match=r"x = x.rechunk\(\{0: 12, 2: 10\}\)"):
        chunkernels.apply(dx, "gaussian_laplace", sigma=1.0, mode=modes, axes=(0, 2))
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 1.0,
          mode=("constant", "nearest", "wrap"), cval=2.0, chunks=[(5, 5, 5)])


@backends
@pytest.mark.parametrize("dtype", TYPES)
def test_dtypes_round_as_scipy(backend, dtype):
    """Each pass truncates into the output dtype and the sums wrap there, as scipy's."""
    rng = np.random.default_rng(104)
    x = (rng.integers(0, 100, (14, 15)) if np.dtype(dtype).kind in "iu"
         else rng.standard_normal((14, 15))).astype(dtype)
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 1.0, chunks=[(5, 4)])
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 0.8, output=np.float32,
          chunks=[(14, 2)])
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 1.2, output=np.int16,
          chunks=[(3, 15)])


@backends
def test_output_array(backend):
    x = np.random.default_rng(105).integers(0, 255, (12, 13)).astype(np.uint8)
    out = device(backend, np.zeros((12, 13), np.float64))
    assert ndimage.gaussian_laplace(device(backend, x), 1.5, output=out) is out
    assert_close(out, ndi.gaussian_laplace(x, 1.5, output=np.float64))


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(106), dtype="float32")[index]
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, (1.2, 0.7),
          mode=("mirror", "nearest"), chunks=[(6, 5)])


@backends
@pytest.mark.parametrize("shape", [(1, 7), (7, 1), (0, 4), (1,), (0,), (2, 1, 3), ()])
def test_size_one_empty_and_0d(backend, shape):
    x = np.random.default_rng(107).standard_normal(shape)
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 1.0, mode="reflect",
          chunks=[tuple(max(1, n // 2) for n in shape)])


@backends
def test_zero_sigma_sums_copies_as_scipy(backend):
    """sigma 0 filters nothing: each term is the input, and the sum is ndim times it."""
    x = np.random.default_rng(108).integers(0, 9, (6, 7)).astype(np.int16)
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 0.0, chunks=[(2, 3)])
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, (0.0, 1.0),
          chunks=[(2, 3)])


@backends
def test_chunks_smaller_than_the_halo_and_wrap_across_chunks(backend):
    x = np.random.default_rng(109).standard_normal((30, 26))
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 2.5, mode="wrap",
          chunks=[(3, 4), (1, 26), (30, 2)])


@backends
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex(backend, dtype):
    """scipy's gaussian_laplace01 for complex types: the CPU reference computes them."""
    x = (A35 + 1j * A35[::-1]).astype(dtype) * 100
    t = ndi.gaussian_filter(x, 1.0, [2, 0]) + ndi.gaussian_filter(x, 1.0, [0, 2])
    if backend == "cupy":
        with pytest.warns(CPUFallbackWarning):
            got = ndimage.gaussian_laplace(device(backend, x), 1.0)
    else:
        got = ndimage.gaussian_laplace(x, 1.0)
    assert_close(got, t)


@settings(max_examples=30, deadline=None)
@given(case=chunked_arrays(max_dims=3), data=st.data())
def test_chunking_invariance(case, data):
    x, chunks = case
    axes = data.draw(st.sampled_from([None] + [c for n in range(1, x.ndim + 1)
                                                for c in itertools.combinations(range(x.ndim), n)]))
    count = x.ndim if axes is None else len(axes)
    sigma = tuple(data.draw(st.floats(0.3, 2.5)) for _ in range(count))
    mode = tuple(data.draw(st.sampled_from(MODES)) for _ in range(count))
    check_invariance(ndimage.gaussian_laplace, ndi.gaussian_laplace, x, chunks, sigma,
                     mode=mode, cval=1.0, axes=axes)


@pytest.mark.parametrize("args, kwargs, error, match", [
    (([[1.0]],), {}, RuntimeError, "sequence argument must have length"),  # dask-image's cases
    (([1.0],), {}, RuntimeError, "sequence argument must have length"),
    ((1.0 + 0.0j,), {}, TypeError, "sigma must be a real number"),
    ((1.0,), {"truncate": 4.0 + 0.0j}, TypeError, "truncate must be a real number"),
    ((1.0,), {"axes": (1, 1)}, ValueError, "axes must be unique"),          # scipy's
    ((1.0,), {"axes": (2,)}, ValueError, "out of range"),
    (((1.0, 2.0),), {"axes": (0,)}, RuntimeError, "sequence argument.*sigma"),
    ((1.0,), {"axes": (0,), "radius": (2,)}, RuntimeError, "sequence argument.*radius"),
    ((1.0,), {"mode": ["wrap"]}, RuntimeError, "sequence argument.*mode"),
    ((1.0,), {"mode": "bogus"}, RuntimeError, "boundary mode not supported"),
    ((1.0,), {"radius": -1}, ValueError, "Radius must be a nonnegative integer"),
    ((1.0,), {"radius": 1.5}, ValueError, "Radius must be a nonnegative integer"),
    ((1.0,), {"output": np.float16}, RuntimeError, "float16 not supported"),
    ((1.0,), {"order": 1}, TypeError, "unexpected keyword argument 'order'"),
])
def test_errors_before_any_work(args, kwargs, error, match):
    a = np.arange(140.0).reshape(10, 14)
    for x in (a, da.from_array(a, chunks=(5, 7))):
        with pytest.raises(error, match=match):
            ndimage.gaussian_laplace(x, *args, **kwargs)


@pytest.mark.parametrize("axes", [(1, 0), (0, 1), (2, 0, 1), (1, 2), (2, 0)])
def test_sigma_order_with_axes_as_scipy(axes):
    """scipy's gaussian_laplace gives sigma[i] to axes[i] only when some axes are not filtered;
    when every axis is, sigma[i] is axis i's whatever the order of ``axes``."""
    x = np.random.default_rng(17).standard_normal((9, 10, 8) if len(axes) == 3 or 2 in axes
                                                   else (9, 10))
    sigma = (0.8, 1.6, 1.2)[:len(axes)]
    expected = ndi.gaussian_laplace(x, sigma, axes=axes)
    for xin in (x, da.from_array(x, chunks=3), da.from_array(x, chunks=5)):
        assert_close(np.asarray(ndimage.gaussian_laplace(xin, sigma, axes=axes)), expected)


@backends
@pytest.mark.parametrize("mode", MODES)
def test_radius_a_few_times_the_array_folds_onto_it(references_fold, backend, mode):
    """Issue #20: the terms' Gaussians fold onto the array where they are wider than it."""
    x = np.random.default_rng(90).standard_normal((7, 5))
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, (6.0, 4.0), mode=mode,
          cval=0.3, chunks=[(7, 5), (3, 2)])
    check(backend, ndimage.gaussian_laplace, ndi.gaussian_laplace, x, 6.0, mode=mode, axes=(1,),
          chunks=[(2, 5)])
