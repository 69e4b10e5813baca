"""uniform_filter and uniform_filter1d against scipy.ndimage: scipy's and dask-image's cases,
every mode and synonym with cval, per-axis sizes, origins (the extremes too) and modes, ``axes``,
even and odd sizes, integer and float data with scipy's rounding, output dtypes and arrays,
layouts, 0-size and size-1 axes, chunkings, chunking invariance, complex data, and scipy's and
dask-image's errors."""

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

ARR = np.array([[1., 0., 0.], [1., 1., 0.], [0., 0., 0.]])


@backends
def test_scipy_cases(backend):
    def run(fn, x, *args, **kwargs):
        return fn(device(backend, np.asarray(x)), *args, **kwargs)

    assert_close(run(ndimage.uniform_filter1d, [2, 4, 6], 2, origin=-1), np.array([3, 5, 6]))
    for size, expected in (([0], [1, 2, 3]), ([1], [1, 2, 3]), ([2], [1, 1, 2])):
        assert_close(run(ndimage.uniform_filter, [1, 2, 3], size), np.array(expected))
    assert_close(run(ndimage.uniform_filter, [2, 4, 6], [2]), np.array([2, 3, 5]))
    assert_close(run(ndimage.uniform_filter, np.zeros(0), [1]), np.zeros(0))
    # test_multiple_modes_uniform
    assert_close(run(ndimage.uniform_filter, ARR, 5, mode=["reflect", "wrap"]),
                 np.array([[0.32, 0.40, 0.48], [0.20, 0.28, 0.32], [0.28, 0.32, 0.40]]),
                 rtol=1e-7, atol=1e-7)
    assert_close(run(ndimage.uniform_filter, ARR, 5, mode="reflect"),
                 run(ndimage.uniform_filter, ARR, 5, mode=["reflect", "reflect"]))
    # test_multiple_modes_sequentially
    expected = ndi.uniform_filter1d(ndi.uniform_filter1d(ARR, 5, axis=0, mode="reflect"), 5,
                                    axis=1, mode="wrap")
    assert_close(run(ndimage.uniform_filter, ARR, 5, mode=["reflect", "wrap"]), expected)


@backends
@pytest.mark.parametrize("dtype_in, dtype_out", [
    ("uint8", "uint8"), ("int16", "float32"), ("int32", "int64"), ("uint64", "float64"),
    ("float32", "int8"), ("float64", "uint16"), ("int64", "int64"), ("float64", "float64")])
def test_scipy_uniform06(backend, dtype_in, dtype_out):
    x = np.array([[4, 8, 12], [16, 20, 24]], dtype=dtype_in)
    got = ndimage.uniform_filter(device(backend, x), [2, 2], output=dtype_out)
    assert_close(got, np.array([[4, 6, 10], [10, 12, 16]], dtype=dtype_out))


@backends
@pytest.mark.parametrize("mode", MODES + SYNONYMS)
def test_modes(backend, mode):
    x = np.random.default_rng(60).standard_normal((29, 31))
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, (4, 5), mode=mode, cval=2.0,
          halo=3)
    check(backend, ndimage.uniform_filter1d, ndi.uniform_filter1d, x, 6, 0, mode=mode, cval=2.0,
          halo=3)


@backends
@pytest.mark.parametrize("size", [2, 3, 4, 7])
def test_every_origin(backend, size):
    x = np.random.default_rng(61).standard_normal((18, 21))
    for origin in range(-(size // 2), (size - 1) // 2 + 1):
        check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, size, origin=origin,
              mode="nearest", halo=size // 2 + abs(origin) + 1)
        check(backend, ndimage.uniform_filter1d, ndi.uniform_filter1d, x, size, axis=-1,
              origin=origin, mode="wrap", halo=size // 2 + abs(origin) + 1)


@backends
@pytest.mark.parametrize("size, origin", [(2, 0), (3, 0), (3, 1), (3, (1, 0)), ((1, 2), 0),
                                          ((3, 2), (1, 0))])
def test_dask_image_compare(backend, size, origin):
    x = np.arange(100.0 * 110).reshape(100, 110)
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, size, origin=origin,
          chunks=[(50, 55)])


@backends
def test_per_axis_sizes_origins_modes_axes(backend):
    x = np.random.default_rng(62).standard_normal((8, 12, 10))
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, (3, 1, 6),
          origin=(-1, 0, 2), mode=("wrap", "reflect", "constant"), cval=-1.0, halo=5)
    for axes in itertools.permutations(range(3), 2):
        check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, (4, 3), axes=axes,
              origin=(1, -1), mode=("mirror", "nearest"), halo=4)
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, 5, axes=-1, halo=3)


def test_axes_kwargs_as_arrays():
    """scipy's test_filter_axes_kwargs: per-axis arguments given as NumPy arrays."""
    x = np.arange(6 * 8 * 12, dtype=np.float64).reshape(6, 8, 12)
    kwargs = {"origin": np.array([-1, 0, 1]), "mode": np.array(["reflect", "nearest",
                                                                 "constant"])}
    for axes in itertools.combinations(range(-3, 3), 2):
        axes = np.array(axes)
        reduced = {k: v[axes] for k, v in kwargs.items()}
        if len(set(axes % 3)) != 2:
            with pytest.raises(ValueError, match="axes must be unique"):
                ndimage.uniform_filter(x, [3, 3], axes=axes, **reduced)
            continue
        expected = ndi.uniform_filter(x, [3, 3], axes=axes, **reduced)
        assert_close(ndimage.uniform_filter(x, [3, 3], axes=axes, **reduced), expected)
        assert_close(ndimage.uniform_filter(da.from_array(x, chunks=4), [3, 3], axes=axes,
                                            **reduced).compute(), expected)


@backends
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32",
                                   "int64", "uint64", "float32"])
def test_dtypes_round_as_scipy(backend, dtype):
    """scipy's mean of integers truncates: sums are exact and divided once."""
    rng = np.random.default_rng(63)
    x = rng.integers(0, 100, (23, 22)).astype(dtype)
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, (3, 4), halo=3)
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, 5, output=np.float64, halo=3)


@backends
def test_roundoff_gh6930(backend):
    """scipy's test_uniform_filter1d_roundoff_errors."""
    x = np.repeat([0, 1, 0], [9, 9, 9])
    for size in range(3, 10):
        out = ndimage.uniform_filter1d(device(backend, x), size)
        assert int(out.sum()) == 10 - size
        check(backend, ndimage.uniform_filter1d, ndi.uniform_filter1d, x, size, halo=size)


@backends
def test_output_array(backend):
    x = np.random.default_rng(64).standard_normal((14, 13))
    out = device(backend, np.zeros((14, 13), np.float32))
    assert ndimage.uniform_filter(device(backend, x), 3, output=out) is out
    assert_close(out, ndi.uniform_filter(x, 3, output=np.float32), rtol=1e-6, atol=1e-6)


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(65))[index]
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, (5, 2), origin=(2, -1),
          mode=("reflect", "wrap"), halo=5)


@backends
@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (0, 5), (1,), (0,), (2, 1, 3), ()])
def test_size_one_empty_and_0d(backend, shape):
    x = np.random.default_rng(66).standard_normal(shape)
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, 3, mode="mirror", halo=2,
          chunks=None if shape else [()])


@backends
def test_wrap_across_many_chunks_and_size_beyond_the_array(backend):
    x = np.random.default_rng(67).standard_normal((48, 30))
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, (9, 11), mode="wrap",
          chunks=[(6, 5), (48, 3), (7, 30)])
    for mode in MODES:
        check(backend, ndimage.uniform_filter, ndi.uniform_filter, x[:3, :4], 9, mode=mode,
              cval=0.5, chunks=[(1, 2), (3, 4)])


@backends
def test_complex(backend):
    """scipy's uniform01_complex and uniform06_complex; CuPy blocks use the CPU reference."""
    def run(*args, **kwargs):
        if backend == "cupy":
            with pytest.warns(CPUFallbackWarning):
                return ndimage.uniform_filter1d(*args, **kwargs)
        return ndimage.uniform_filter1d(*args, **kwargs)

    out = run(device(backend, np.array([2 + 1j, 4 + 2j, 6 + 3j])), 2, origin=-1)
    assert_close(out, np.array([3 + 1.5j, 5 + 2.5j, 6 + 3j]))
    x = np.array([[4, 8 + 5j, 12], [16, 20, 24]], dtype=np.complex64)
    expected = ndi.uniform_filter(x, [2, 2], output=np.complex128)
    assert_close(expected.real, np.array([[4, 6, 10], [10, 12, 16]], dtype=np.float64))
    assert_close(ndimage.uniform_filter(x, [2, 2], output=np.complex128), expected)
    # as scipy: a real dtype given as a type becomes complex (with a warning), as a string or
    # an array it is refused
    with pytest.raises(RuntimeError, match="output must have complex dtype"):
        ndimage.uniform_filter(x, 2, output="float64")
    with pytest.raises(RuntimeError, match="output must have complex dtype"):
        ndimage.uniform_filter(x, 2, output=np.zeros(x.shape))


@pytest.mark.parametrize("fn", ["uniform_filter", "uniform_filter1d"])
@pytest.mark.parametrize("output", [np.float64, np.float32, np.dtype("int16"), np.float16])
def test_complex_input_promotes_a_real_output_dtype(fn, output):
    """scipy's uniform_filter and uniform_filter1d make a real output dtype complex for complex
    data, with a warning (float16 too: complex64, which the filters write)."""
    x = np.random.default_rng(11).standard_normal((7, 6)) * (1 + 0.5j)
    with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
        expected = getattr(ndi, fn)(x, 3, output=output)
    for chunks in (None, (2, 4), (1, 3)):
        xin = x if chunks is None else da.from_array(x, chunks=chunks)
        with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
            got = getattr(ndimage, fn)(xin, 3, output=output)
        assert got.dtype == expected.dtype
        assert_close(np.asarray(got), expected, err_msg=f"chunks {chunks}")


@settings(max_examples=30, deadline=None)
@given(case=chunked_arrays(max_dims=3), data=st.data())
def test_chunking_invariance(case, data):
    x, chunks = case
    size = tuple(data.draw(st.integers(0, 7)) for _ in range(x.ndim))
    origin = tuple(data.draw(st.integers(-(s // 2), max((s - 1) // 2, 0))) if s > 1 else 0
                   for s in size)
    mode = tuple(data.draw(st.sampled_from(MODES)) for _ in range(x.ndim))
    check_invariance(ndimage.uniform_filter, ndi.uniform_filter, x, chunks, size,
                     origin=origin, mode=mode, cval=4.0)


@pytest.mark.parametrize("size, kwargs, error, match", [
    ("3", {}, TypeError, "size must be a real number"),
    (3, {"origin": 0.0}, TypeError, "cannot be interpreted as an integer"),  # dask-image's case
    ([3], {}, RuntimeError, "sequence argument must have length"),
    (3, {"origin": [0]}, RuntimeError, "sequence argument must have length"),
    ([[3]], {}, RuntimeError, "sequence argument must have length"),
    (3, {"origin": [[0]]}, RuntimeError, "sequence argument must have length"),
    (3, {"origin": 2}, ValueError, "Invalid origin"),                 # scipy's valid origins
    (2, {"origin": 1}, ValueError, "Invalid origin"),
    (3, {"mode": "bogus"}, RuntimeError, "boundary mode not supported"),
    (3, {"mode": ["wrap"]}, RuntimeError, "sequence argument must have length"),
    (3, {"axes": (0, 0)}, ValueError, "axes must be unique"),
    (3, {"axes": (2,)}, ValueError, "out of range"),
    (3, {"axes": (1.5,)}, TypeError, "cannot be interpreted as an integer"),
    (3, {"output": np.float16}, RuntimeError, "float16 not supported"),
])
def test_errors_before_any_work(size, kwargs, error, match):
    a = np.arange(140.0).reshape(10, 14)
    for x in (a, da.from_array(a, chunks=(5, 7))):
        with pytest.raises(error, match=match):
            ndimage.uniform_filter(x, size, **kwargs)


@pytest.mark.parametrize("size", [3.0, 3.5, 2.9, np.float32(4), 0.0, -1, (2.5, 3)])
def test_real_sizes_truncate_as_scipy(size):
    """scipy.ndimage.uniform_filter takes any real size and truncates it with int() (dask-image's
    tests expect a TypeError for 3.0; scipy, which defines the result, accepts it)."""
    a = np.random.default_rng(9).standard_normal((10, 14))
    assert_close(ndimage.uniform_filter(a, size), ndi.uniform_filter(a, size))
    got = ndimage.uniform_filter(da.from_array(a, chunks=(5, 7)), size)
    assert_close(got.compute(), ndi.uniform_filter(a, size))


def test_uniform_filter1d_errors():
    x = np.arange(5.0)
    with pytest.raises(RuntimeError, match="incorrect filter size"):
        ndimage.uniform_filter1d(x, 0)
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        ndimage.uniform_filter1d(x, 3.0)
    with pytest.raises(ValueError, match="Invalid origin"):
        ndimage.uniform_filter1d(x, 3, origin=2)
    with pytest.raises(np.exceptions.AxisError):
        ndimage.uniform_filter1d(x, 3, axis=1)
    with pytest.raises(RuntimeError, match="float16 not supported"):
        ndimage.uniform_filter1d(x.astype(np.float16), 3)


def test_shapes_and_identity_on_dask():
    d = da.from_array(np.arange(140.0).reshape(10, 14), chunks=(5, 7))
    out = ndimage.uniform_filter(d, 1, origin=0)
    assert all(type(s) is int for s in out.shape)
    assert_close(out.compute(), d.compute())
    stacked = da.stack([ndimage.uniform_filter(d[i:i + 2], 3) for i in (0, 2)])
    assert_close(stacked.compute(), np.stack([ndi.uniform_filter(d[i:i + 2].compute(), 3)
                                              for i in (0, 2)]))


@pytest.mark.parametrize("fn, args, kwargs", [
    ("uniform_filter", ((1, 3),), {}), ("uniform_filter", (3,), {"axes": ()}),
    ("gaussian_filter", ((0.0, 1.5),), {}), ("gaussian_filter", ((1e-16, 1.5),), {}),
])
def test_mode_read_only_on_filtered_axes(fn, args, kwargs):
    """scipy checks the mode of an axis only where it filters it: an unknown mode on an axis of
    size 1 (or sigma <= 1e-15) is accepted, a sequence of the wrong length is not."""
    x = np.random.default_rng(16).standard_normal((6, 7))
    mode = ["foo", "wrap"][:len(kwargs.get("axes", (0, 1)))]
    expected = getattr(ndi, fn)(x, *args, mode=mode, **kwargs)
    for xin in (x, da.from_array(x, chunks=(2, 3))):
        assert_close(np.asarray(getattr(ndimage, fn)(xin, *args, mode=mode, **kwargs)), expected)
    with pytest.raises(RuntimeError, match="sequence argument must have length"):
        getattr(ndi, fn)(x, *args, mode=["foo"] * 3, **kwargs)
    with pytest.raises(RuntimeError, match="sequence argument must have length"):
        getattr(ndimage, fn)(x, *args, mode=["foo"] * 3, **kwargs)


@backends
@pytest.mark.parametrize("mode", MODES)
def test_sizes_a_few_times_the_array_fold_onto_it(references_fold, backend, mode):
    """Issue #20: a filter longer than its axis folds onto the array's own values (counts of the
    unit weights per tap, exact integers): SciPy's result on 7 x 5 samples, sizes 3 to 6 times
    the axis, with origins."""
    x = np.random.default_rng(70).standard_normal((7, 5))
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, x, (23, 31), mode=mode, cval=0.5,
          origin=(4, -9), chunks=[(7, 5), (3, 2), (1, 5)])
    check(backend, ndimage.uniform_filter1d, ndi.uniform_filter1d, x, 40, 1, mode=mode,
          cval=-2.0, origin=7, chunks=[(7, 1)])
    xi = (x * 40).astype(np.int32)  # integer sums are exact: the means truncate as SciPy's
    check(backend, ndimage.uniform_filter, ndi.uniform_filter, xi, 26, mode=mode,
          chunks=[(3, 2)])


@pytest.mark.parametrize("mode", MODES)
def test_a_size_of_a_billion_is_computed_at_once(mode):
    """Issue #20: the filter's length no longer sets the work: a billion taps fold onto 2n + 1."""
    x = np.random.default_rng(71).random((20, 24))
    expected = x.mean() if mode in ("reflect", "wrap") else None
    for data in (x, da.from_array(x, chunks=10)):
        got = np.asarray(ndimage.uniform_filter(data, 10**9, mode=mode, cval=0.25))
        assert got.shape == x.shape and np.all(np.isfinite(got))
        if expected is not None:
            assert_close(got, np.full(x.shape, expected), rtol=1e-7)
