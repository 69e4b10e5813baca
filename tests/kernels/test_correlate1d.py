"""correlate1d against scipy.ndimage.correlate1d: scipy's own cases, every mode and synonym with
cval, even and odd weights with every origin (the extremes too), axes of 1-D to 3-D data, integer
and float data with scipy's rounding, output dtypes and arrays, view layouts, 0-size and size-1
axes, chunkings (one chunk, uneven, chunks smaller than the halo, wrap across many chunks),
chunking invariance, complex data (CPU reference), and the errors scipy raises."""

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from filtercheck import (MODES, SYNONYMS, backends, check, check_invariance, chunked_arrays,
                         device, layouts)
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkernels import CPUFallbackWarning, ndimage
from chunkernels.ndimage import FilterArgumentError, FilterAxisError, FilterTypeError
from chunkernels.testing import assert_close

# scipy's test_filters.py: (input, weights, keywords, expected)
SCIPY_CASES = [
    ([1, 2], [2], {}, [2, 4]),                                                   # correlate01
    ([1, 2, 3], [1], {}, [1, 2, 3]),                                             # correlate02
    ([1], [1, 1], {}, [2]),                                                      # correlate03
    ([1, 2], [1, 1], {}, [2, 3]),                                                # correlate04
    ([1, 2, 3], [1, 1], {}, [2, 3, 5]),                                          # correlate05
    ([1, 2, 3], [1, 2, 3], {}, [9, 14, 17]),                                     # correlate06
    ([1, 2, 3], [1, 2, 1], {}, [5, 8, 11]),                                      # correlate07
    ([1, 2, 3], [1, 2, -1], {}, [1, 2, 5]),                                      # correlate08
    ([1, 2, 3], [1, 1], {"origin": -1}, [3, 5, 6]),                              # correlate17
    ([[1, 2, 3], [2, 4, 6]], [1, 2, 1], {"axis": 0}, [[5, 10, 15], [7, 14, 21]]),  # 21
    ([[1, 2, 3], [2, 4, 6]], [1, 2, 1], {"axis": 0, "mode": "wrap"},
     [[6, 12, 18], [6, 12, 18]]),                                                # correlate22
    ([[1, 2, 3], [2, 4, 6]], [1, 2, 1], {"axis": 0, "mode": "nearest", "origin": -1},
     [[7, 14, 21], [8, 16, 24]]),                                                # correlate24
    ([[1, 2, 3], [2, 4, 6]], [1, 2, 1], {"axis": 0, "mode": "nearest", "origin": 1},
     [[4, 8, 12], [5, 10, 15]]),                                                 # correlate25
    ([1.0], [1.0] * 5, {"mode": "mirror"}, [5.0]),                               # correlate26
]

# scipy's test_extend01..04: correlate1d([1, 2, 3], weights, mode=mode, cval=0)
EXTEND = {
    (1, 0): {"nearest": [1, 1, 2], "wrap": [3, 1, 2], "reflect": [1, 1, 2], "mirror": [2, 1, 2],
             "constant": [0, 1, 2]},
    (1, 0, 0, 0, 0, 0, 0, 0): {"nearest": [1, 1, 1], "wrap": [3, 1, 2], "reflect": [3, 3, 2],
                               "mirror": [1, 2, 3], "constant": [0, 0, 0]},
    (0, 0, 1): {"nearest": [2, 3, 3], "wrap": [2, 3, 1], "reflect": [2, 3, 3], "mirror": [2, 3, 2],
                "constant": [2, 3, 0]},
    (0, 0, 0, 0, 0, 0, 0, 0, 1): {"nearest": [3, 3, 3], "wrap": [2, 3, 1], "reflect": [2, 1, 1],
                                  "mirror": [1, 2, 3], "constant": [0, 0, 0]},
}


@backends
@pytest.mark.parametrize("index", range(len(SCIPY_CASES)))
def test_scipy_cases(backend, index):
    data, weights, kwargs, expected = SCIPY_CASES[index]
    x = np.asarray(data)
    got = ndimage.correlate1d(device(backend, x), weights, **kwargs)
    assert_close(got, np.asarray(expected, dtype=x.dtype))
    check(backend, ndimage.correlate1d, ndi.correlate1d, x, weights, **kwargs)


@backends
@pytest.mark.parametrize("weights", list(EXTEND))
def test_scipy_extend(backend, weights):
    x = np.array([1, 2, 3])
    for mode, expected in EXTEND[weights].items():
        got = ndimage.correlate1d(device(backend, x), weights, 0, mode=mode, cval=0)
        assert_close(got, np.array(expected))
        check(backend, ndimage.correlate1d, ndi.correlate1d, x, weights, 0, mode=mode,
              chunks=[(1,), (2,)])


@backends
@pytest.mark.parametrize("mode", MODES + SYNONYMS)
@pytest.mark.parametrize("size", [4, 7])
def test_modes(backend, mode, size):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((31, 27))
    w = rng.standard_normal(size)
    for axis in (0, 1):
        check(backend, ndimage.correlate1d, ndi.correlate1d, x, w, axis, mode=mode, cval=-0.7,
              halo=size)


@backends
@pytest.mark.parametrize("size", [1, 2, 5, 6])
def test_every_origin(backend, size):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 18))
    w = rng.standard_normal(size)
    for origin in range(-(size // 2), (size - 1) // 2 + 1):
        for mode in ("reflect", "constant", "wrap"):
            check(backend, ndimage.correlate1d, ndi.correlate1d, x, w, -1, mode=mode, cval=2.0,
                  origin=origin, halo=size // 2 + abs(origin) + 1)


@backends
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_3d_axes(backend, axis):
    x = np.random.default_rng(2).standard_normal((9, 11, 13))
    check(backend, ndimage.correlate1d, ndi.correlate1d, x, [0.5, -1.0, 2.0, 0.25], axis,
          mode="mirror", origin=1, halo=4)


@backends
def test_1d(backend):
    x = np.random.default_rng(3).standard_normal(57)
    check(backend, ndimage.correlate1d, ndi.correlate1d, x, np.arange(9.0) - 3, mode="wrap",
          halo=5)


@backends
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16", "int32", "uint32",
                                   "int64", "uint64", "float32", "float64"])
def test_dtypes_round_as_scipy(backend, dtype):
    """scipy sums in float64 and stores with a C cast (truncation toward zero)."""
    rng = np.random.default_rng(4)
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal((25, 23)).astype(dtype)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -100), min(info.max, 100), (25, 23)).astype(dtype)
    weights = [0.3, 0.9, 0.45]  # non-negative: results stay in range for unsigned data
    check(backend, ndimage.correlate1d, ndi.correlate1d, x, weights, 0, halo=2)
    check(backend, ndimage.correlate1d, ndi.correlate1d, x, weights, 1, output=np.float64,
          halo=2)


@backends
def test_output_dtype_and_array(backend):
    x = np.random.default_rng(5).integers(0, 200, (21, 19)).astype(np.uint8)
    for output in (np.float32, "float64", np.dtype(np.int16), np.uint8):
        check(backend, ndimage.correlate1d, ndi.correlate1d, x, [1.5, -0.5, 2.25], 1,
              output=output, halo=2)
    out = device(backend, np.zeros((21, 19), np.float32))
    got = ndimage.correlate1d(device(backend, x), [1.5, -0.5, 2.25], 1, output=out)
    assert got is out
    assert_close(out, ndi.correlate1d(x, [1.5, -0.5, 2.25], 1, output=np.float32),
                 rtol=1e-6, atol=1e-5)
    view = device(backend, np.zeros((2, 21, 19)))[1]  # an output that is a view, as scipy's tests
    ndimage.correlate1d(device(backend, x), [1, 2], 0, output=view)
    assert_close(view, ndi.correlate1d(x, [1, 2], 0, output=np.float64))


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(6))[index]
    for axis in (0, 1):
        check(backend, ndimage.correlate1d, ndi.correlate1d, x, [1.0, -2.0, 0.5, 3.0], axis,
              mode="nearest", origin=-1, halo=3)


@backends
@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (0, 5), (3, 0), (1,), (0,), (2, 3, 1)])
def test_size_one_and_empty_axes(backend, shape):
    x = np.random.default_rng(7).standard_normal(shape)
    for axis in range(len(shape)):
        check(backend, ndimage.correlate1d, ndi.correlate1d, x, [1.0, 2.0, -1.0, 0.5], axis,
              mode="mirror", halo=3)


@backends
@pytest.mark.parametrize("mode", MODES)
def test_weights_longer_than_the_axis(backend, mode):
    """Extensions longer than the axis repeat the boundary pattern (reflect of reflect)."""
    x = np.random.default_rng(8).standard_normal((3, 5))
    w = np.random.default_rng(9).standard_normal(11)
    check(backend, ndimage.correlate1d, ndi.correlate1d, x, w, 1, mode=mode, cval=1.5,
          chunks=[(3, 5), (2, 2), (1, 3)])


@backends
def test_wrap_across_many_chunks(backend):
    x = np.random.default_rng(10).standard_normal((64, 48))
    w = np.random.default_rng(11).standard_normal(9)
    for axis in (0, 1):
        check(backend, ndimage.correlate1d, ndi.correlate1d, x, w, axis, mode="wrap",
              origin=-3, chunks=[(8, 8), (5, 13), (16, 3), (64, 2)])


@backends
def test_complex(backend):
    """Complex data or weights: scipy's real-component formulation, on the CPU reference."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((12, 10)) + 1j * rng.standard_normal((12, 10))
    w = np.array([1, 1 + 1j, 0.5j])
    cases = [(x, w, {}), (x.real, w, {}), (x, w.real, {"mode": "constant", "cval": 2 - 1j}),
             (x.astype(np.complex64), w, {"output": np.complex128})]
    for data, weights, kwargs in cases:
        if backend == "cupy":
            with pytest.warns(CPUFallbackWarning, match="complex|dtype complex"):
                check(backend, ndimage.correlate1d, ndi.correlate1d, data, weights, 0, halo=2,
                      **kwargs)
        else:
            check(backend, ndimage.correlate1d, ndi.correlate1d, data, weights, 0, halo=2,
                  **kwargs)


def test_complex_output_rules():
    """A real output dtype is promoted with scipy's warning; a real output array is refused."""
    x = np.arange(6.0)
    w = [1, 1 + 1j]
    with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
        got = ndimage.correlate1d(x, w, output=np.float32)
    assert got.dtype == np.complex64
    with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
        expected = ndi.correlate1d(x, w, output=np.float32)
    assert_close(got, expected)
    with pytest.warns(UserWarning, match="promoting"):
        lazy = ndimage.correlate1d(da.from_array(x, chunks=2), w, output=np.float32)
    assert lazy.dtype == np.complex64
    assert_close(lazy.compute(), expected)
    with pytest.raises(RuntimeError, match="output must have complex dtype"):
        ndimage.correlate1d(x, w, output=np.zeros(6))
    with pytest.raises(RuntimeError, match="output must have complex dtype"):
        ndimage.correlate1d(x, w, output="float64")
    with pytest.raises((ValueError, TypeError), match="complex-valued cval"):
        ndimage.correlate1d(x, w, mode="constant", cval=5 + 1j, output=np.complex64)


def test_lists_and_0d_weights_types():
    assert_close(ndimage.correlate1d([2, 8, 0, 4, 1, 9, 9, 0], weights=[1, 3]),
                 np.array([8, 26, 8, 12, 7, 28, 36, 9]))


@settings(max_examples=30, deadline=None)
@given(case=chunked_arrays(max_dims=3), size=st.integers(1, 8), data=st.data())
def test_chunking_invariance(case, size, data):
    x, chunks = case
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    origin = data.draw(st.integers(-(size // 2), (size - 1) // 2))
    mode = data.draw(st.sampled_from(MODES))
    weights = np.arange(1.0, size + 1)
    check_invariance(ndimage.correlate1d, ndi.correlate1d, x, chunks, weights, axis,
                     mode=mode, cval=3.0, origin=origin)


@pytest.mark.parametrize("args, kwargs, error, match", [
    (([],), {}, FilterArgumentError, "no filter weights given"),
    (([[1, 2]],), {}, RuntimeError, "no filter weights given"),
    (([1, 2, 3],), {"mode": "bogus"}, RuntimeError, "boundary mode not supported.*'bogus'"),
    (([1, 2, 3],), {"mode": ["reflect"]}, RuntimeError, "boundary mode not supported"),
    (([1, 1, 2, 0],), {"origin": 2}, ValueError, r"Invalid origin.*accepted: -2 to 1"),
    (([1, 2, 3],), {"origin": -2}, ValueError, "Invalid origin"),
    (([1, 2, 3],), {"origin": 0.0}, TypeError, "cannot be interpreted as an integer"),
    (([1, 2, 3],), {"axis": 2}, np.exceptions.AxisError, "out of range"),
    (([1, 2, 3],), {"axis": 1.0}, TypeError, "cannot be interpreted as an integer"),
    (([1, 2, 3],), {"output": "U3"}, RuntimeError, "output must have numeric dtype"),
    (([1, 2, 3],), {"output": np.float16}, RuntimeError, "float16 not supported"),
    (([1, 2, 3],), {"cval": 1j, "mode": "constant"}, TypeError, "complex-valued cval"),
    ((["a", "b"],), {}, FilterArgumentError, "weights must be numeric"),
])
def test_errors_before_any_work(args, kwargs, error, match):
    for x in (np.zeros((6, 5)), da.zeros((6, 5), chunks=2)):
        with pytest.raises(error, match=match):
            ndimage.correlate1d(x, *args, **kwargs)


@pytest.mark.parametrize("axis, shape", [(1.0, (4,)), (2.5, (4,)), (-2.0, (4,)), (0.0, (4,)),
                                         (-1.0, (4,)), (1.0, (3, 4)), (True, (4,)), (True, (3, 4))])
@pytest.mark.parametrize("name, args", [("correlate1d", ([1, 2, 1],)), ("uniform_filter1d", (3,)),
                                        ("gaussian_filter1d", (1.0,))])
def test_a_float_axis_fails_as_in_scipy(axis, shape, name, args):
    """scipy checks a single axis's range before its type: a float out of range is an
    AxisError, one in range a TypeError (a bool is an integer)."""
    x = np.arange(np.prod(shape), dtype=float).reshape(shape)
    try:
        want = getattr(ndi, name)(x, *args, axis=axis)
    except (TypeError, ValueError) as exc:  # AxisError is a ValueError
        error = np.exceptions.AxisError if isinstance(exc, np.exceptions.AxisError) else TypeError
        for data in (x, da.from_array(x, chunks=2)):
            with pytest.raises(error):
                getattr(ndimage, name)(data, *args, axis=axis)
    else:
        assert_close(getattr(ndimage, name)(x, *args, axis=axis), want)


def test_error_classes():
    with pytest.raises(FilterAxisError):
        ndimage.correlate1d(np.zeros(4), [1], axis=-2)
    with pytest.raises(FilterTypeError):
        ndimage.correlate1d(np.zeros(4), [1], origin=1 + 0j)
    with pytest.raises(RuntimeError, match="float16 not supported"):
        ndimage.correlate1d(np.zeros(4, np.float16), [1])
    with pytest.raises(RuntimeError, match="output shape not correct"):
        ndimage.correlate1d(np.zeros(4), [1], output=np.zeros(5))
    with pytest.raises(TypeError, match="Dask input"):
        ndimage.correlate1d(da.zeros(4, chunks=2), [1], output=np.zeros(4))


@pytest.mark.parametrize("fn, args", [("correlate1d", ([1, 2, 3],)), ("gaussian_filter", (1.5,)),
                                      ("uniform_filter", (3,)), ("sobel", ())])
def test_output_that_is_no_dtype_is_a_type_error(fn, args):
    """scipy's numpy.dtype(output) raises TypeError for an output that names no dtype."""
    x = np.arange(20.0).reshape(4, 5)
    with pytest.raises(TypeError, match="not understood"):
        getattr(ndi, fn)(x, *args, output="foo")
    for xin in (x, da.from_array(x, chunks=2)):
        with pytest.raises(TypeError, match="is not a dtype"):
            getattr(ndimage, fn)(xin, *args, output="foo")


@pytest.mark.parametrize("output", [np.float16, np.dtype("int16"), bool])
def test_complex_data_promotes_any_real_output_type(output):
    """scipy promotes a real output type for complex data before checking it: float16, which the
    filters do not write, becomes complex64."""
    x = np.random.default_rng(12).standard_normal((6, 7)) * (1 - 2j)
    with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
        expected = ndi.correlate1d(x, [1, 2, 3], output=output)
    for xin in (x, da.from_array(x, chunks=(2, 3))):
        with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
            got = ndimage.correlate1d(xin, [1, 2, 3], output=output)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(np.asarray(got), expected)


@backends
@pytest.mark.parametrize("mode", MODES)
def test_weights_a_few_times_the_axis_fold_onto_it(references_fold, backend, mode):
    """Issue #20: weights reaching several times beyond the axis fold onto its own values (the
    mode's period, or its edge), every origin giving SciPy's result."""
    x = np.random.default_rng(80).standard_normal((4, 6))
    w = np.random.default_rng(81).standard_normal(41)
    for origin in (-20, -7, 0, 13, 19):
        check(backend, ndimage.correlate1d, ndi.correlate1d, x, w, 0, mode=mode, cval=1.5,
              origin=origin, chunks=[(4, 6), (1, 3)])
        check(backend, ndimage.convolve1d, ndi.convolve1d, x, w[:-1], 1, mode=mode, cval=1.5,
              origin=origin, chunks=[(2, 5)])
