"""spline_filter and spline_filter1d against scipy.ndimage: orders 0-5, every mode, axes, dtypes,
``output=``, view layouts, size-1, empty and 0-d inputs, chunkings (chunks far smaller than the
halo), chunking invariance, scipy's TestSpline and matrix-solution cases, the errors scipy raises,
and the halo derivation: the impulse response's closed form and its tail beyond the halo."""

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from filtercheck import backends, check, device, layouts
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkernels import ndimage
from chunkernels.kernels import spline_filter as spline_filter_kernel
from chunkernels.ndimage import InterpolationError
from chunkernels.testing import assert_close

MODES = ("mirror", "reflect", "grid-mirror", "nearest", "wrap", "grid-wrap", "constant",
         "grid-constant")


@backends
@pytest.mark.parametrize("order", range(2, 6))
@pytest.mark.parametrize("mode", MODES)
def test_spline_filter_modes_orders(backend, order, mode):
    x = np.random.default_rng(0).standard_normal((70, 45))
    check(backend, ndimage.spline_filter, ndi.spline_filter, x, order, mode=mode,
          chunks=[(10, 9), (35, 45), (3, 4), (70, 11)])


@backends
@pytest.mark.parametrize("order", range(6))
@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_spline_filter1d_orders_axes(backend, order, axis):
    x = np.random.default_rng(1).standard_normal((40, 33, 7))
    for mode in ("mirror", "grid-wrap", "reflect"):
        check(backend, ndimage.spline_filter1d, ndi.spline_filter1d, x, order, axis=axis,
              mode=mode, chunks=[(8, 11, 7), (40, 2, 3)])


@backends
@pytest.mark.parametrize("dtype", ["float32", "float64", "uint8", "int16", "int64", "bool"])
def test_input_dtypes(backend, dtype):
    """Any real input gives float64 coefficients (scipy's default output). Values of unit size:
    the tolerances are absolute, and order 5 amplifies rounding by its gain."""
    x = np.random.default_rng(2).integers(0, 10, (31, 26))
    x = (x > 4) if dtype == "bool" else x.astype(dtype)
    check(backend, ndimage.spline_filter, ndi.spline_filter, x, 3, chunks=[(7, 9)])
    check(backend, ndimage.spline_filter1d, ndi.spline_filter1d, x, 5, axis=0, chunks=[(7, 9)])


@backends
@pytest.mark.parametrize("output", [np.float32, "float64", np.dtype("float32")])
def test_output_dtype(backend, output):
    x = np.random.default_rng(3).random((29, 30))
    check(backend, ndimage.spline_filter, ndi.spline_filter, x, 3, output=output,
          chunks=[(10, 10), (3, 30)])
    check(backend, ndimage.spline_filter1d, ndi.spline_filter1d, x, 4, 0, output=output,
          chunks=[(10, 10)])


@backends
def test_output_array(backend):
    x = np.random.default_rng(4).random((12, 13))
    out = device(backend, np.zeros((12, 13)))
    got = ndimage.spline_filter(device(backend, x), 3, output=out)
    assert got is out
    assert_close(out, ndi.spline_filter(x, 3))
    out = device(backend, np.zeros((12, 13), np.float32))
    assert ndimage.spline_filter1d(device(backend, x), 2, axis=0, output=out) is out
    assert_close(out, ndi.spline_filter1d(x, 2, axis=0, output=np.float32), rtol=1e-6)
    with pytest.raises(RuntimeError, match="output shape not correct"):
        ndimage.spline_filter(device(backend, x), 3, output=device(backend, np.zeros((3, 3))))


def test_complex():
    x = np.random.default_rng(5).standard_normal((20, 17)) * (2 - 1j)
    check("numpy", ndimage.spline_filter, ndi.spline_filter, x, 3, mode="reflect",
          output=np.complex128, chunks=[(5, 6)])
    check("numpy", ndimage.spline_filter1d, ndi.spline_filter1d, x, 5, 0,
          output=np.complex128, chunks=[(5, 6)])


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(6))[index]
    check(backend, ndimage.spline_filter, ndi.spline_filter, x, 3, mode="reflect",
          chunks=[(7, 6), (23, 2)])


@backends
@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (1,), (2,), (3, 1, 4), (0, 5), (4, 0)])
@pytest.mark.parametrize("mode", ["mirror", "reflect", "grid-wrap"])
def test_size_one_and_empty_axes(backend, shape, mode):
    x = np.random.default_rng(7).standard_normal(shape)
    for order in (2, 3, 5):
        check(backend, ndimage.spline_filter, ndi.spline_filter, x, order, mode=mode,
              chunks=[tuple(max(1, n // 2) for n in shape)])


@backends
@pytest.mark.parametrize("order", range(2, 6))
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8"])
def test_scipy_test_spline(backend, order, dtype):
    """scipy's TestSpline: ones stay ones, 0-d included."""
    for shape in ((), (1,), (4,), (4, 4)):
        data = device(backend, np.ones(shape, dtype=dtype))
        out = ndimage.spline_filter(data, order=order)
        assert out.dtype == np.float64 and out.shape == shape
        np.testing.assert_array_almost_equal(_host(out), np.ones(shape))
    out = ndimage.spline_filter(device(backend, np.ones((), dtype=dtype)), order, output=dtype)
    assert out.dtype == np.dtype(dtype) and _host(out) == 1


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _knot_matrix(n, order, mode):
    """scipy's make_spline_knot_matrix: the B-spline sampled at the knots, folded by ``mode``."""
    knots = {0: [1], 1: [1], 2: [6, 1], 3: [4, 1], 4: [230, 76, 1], 5: [66, 26, 1]}[order]
    matrix = np.zeros((n, n))
    for diag, value in enumerate(knots):
        i = np.arange(diag, n)
        matrix[i, i - diag] = value
        matrix[i - diag, i] = value
    start, step = {"mirror": (1, 1), "reflect": (0, 1), "grid-wrap": (-1, -1)}[mode]
    for row in range(len(knots) - 1):
        for idx, value in enumerate(knots[row + 1:]):
            matrix[row, start + step * idx] += value
            matrix[-row - 1, -start - 1 - step * idx] += value
    return matrix / (knots[0] + 2 * sum(knots[1:]))


@pytest.mark.parametrize("order", range(6))
@pytest.mark.parametrize("mode", ["mirror", "grid-wrap", "reflect"])
def test_scipy_matrix_solution(order, mode):
    """scipy's test_spline_filter_vs_matrix_solution, on chunks of 7 (far inside the halo)."""
    eye = da.from_array(np.eye(100), chunks=7)
    matrix = _knot_matrix(100, order, mode)
    axis0 = ndimage.spline_filter1d(eye, axis=0, order=order, mode=mode).compute()
    axis1 = ndimage.spline_filter1d(eye, axis=1, order=order, mode=mode).compute()
    np.testing.assert_almost_equal(np.eye(100), axis0 @ matrix)
    np.testing.assert_almost_equal(np.eye(100), axis1 @ matrix.T)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_chunking_invariance(data):
    shape = tuple(data.draw(st.integers(1, 60)) for _ in range(data.draw(st.integers(1, 2))))
    chunks = tuple(data.draw(st.integers(1, n)) for n in shape)
    order = data.draw(st.integers(2, 5))
    mode = data.draw(st.sampled_from(MODES))
    x = np.random.default_rng(8).standard_normal(shape)
    got = ndimage.spline_filter(da.from_array(x, chunks=chunks), order, mode=mode)
    assert_close(got.compute(), ndi.spline_filter(x, order, mode=mode))


# -- the halo ---------------------------------------------------------------------------------


@pytest.mark.parametrize("order", range(2, 6))
def test_impulse_response_closed_form(order):
    """One geometric sequence per pole reproduces scipy's impulse response."""
    n = 301
    delta = np.zeros(n)
    delta[n // 2] = 1.0
    h = ndi.spline_filter1d(delta, order, mode="mirror")
    k = np.abs(np.arange(n) - n // 2)
    model = sum(c * z**k for c, z in spline_filter_kernel.impulse_response(order))
    np.testing.assert_allclose(model, h, rtol=0, atol=1e-13)
    if order == 3:
        np.testing.assert_allclose(model, np.sqrt(3) * (np.sqrt(3) - 2.0) ** k, atol=1e-15)


@pytest.mark.parametrize("order", range(2, 6))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_halo_is_the_smallest_past_which_the_tail_is_below_eps(order, dtype):
    n = 501
    delta = np.zeros(n)
    delta[n // 2] = 1.0
    h = np.abs(ndi.spline_filter1d(delta, order, mode="mirror"))
    eps = np.finfo(dtype).eps
    d = spline_filter_kernel.depth(order, dtype)
    assert 2 * h[n // 2 + d + 1:].sum() <= eps < 2 * h[n // 2 + d:].sum()
    assert spline_filter_kernel.SPEC.depth(2, {"order": order, "axes": (1,), "mode": "mirror",
                                               "dtype": np.dtype(dtype)}) == (0, d)
    assert {(3, "float32"): 13, (3, "float64"): 28}.get((order, dtype), d) == d


@pytest.mark.parametrize("order", range(2, 6))
def test_chunks_with_the_halo_are_within_eps_of_the_whole_axis(order):
    """Worst case for the truncation: alternating signs (the mirrored samples differ most),
    chunks exactly the halo wide. The chunked coefficients differ from scipy's by rounding only
    (a few eps of the coefficients, which the filter makes up to 7.5 times larger at this
    frequency); a halo one pole-decay short would not."""
    x = np.where(np.arange(400) % 2, 1.0, -1.0) * (0.5 + np.random.default_rng(9).random(400))
    d = spline_filter_kernel.depth(order)
    expected = ndi.spline_filter1d(x, order)
    got = ndimage.spline_filter1d(da.from_array(x, chunks=d), order).compute()
    assert np.abs(got - expected).max() <= 8 * np.finfo(float).eps * np.abs(expected).max()


@pytest.mark.parametrize("mode", ["mirror", "reflect", "nearest"])
def test_depth_sets_the_halo(mode):
    """dask-image's ``depth``: with no halo each chunk is filtered on its own (as SciPy
    filters it alone); with a halo of 24 the result is within dask-image's 1e-6 of SciPy's; the
    default is exact; the dict and per-axis forms name the same halos; whole arrays ignore it."""
    rng = np.random.default_rng(23)
    x = rng.random((64, 48))
    dx = da.from_array(x, chunks=(32, 16))
    by_chunk = np.block([[ndi.spline_filter(x[i:i + 32, j:j + 16], 3, mode=mode)
                          for j in range(0, 48, 16)] for i in range(0, 64, 32)])
    assert_close(ndimage.spline_filter(dx, 3, mode=mode, depth=0).compute(), by_chunk)
    expected = ndi.spline_filter(x, 3, mode=mode)
    near = ndimage.spline_filter(dx, 3, mode=mode, depth=24).compute()
    assert np.abs(near - expected).max() < 1e-6
    assert np.abs(ndimage.spline_filter(dx, 3, mode=mode, depth=4).compute() - expected).max() \
        > 1e-6  # a short halo is an approximation, not the default's exact result
    assert_close(ndimage.spline_filter(dx, 3, mode=mode).compute(), expected)
    for same in ({0: 24, 1: 24}, [24, 24], (24, 24)):
        assert_close(ndimage.spline_filter(dx, 3, mode=mode, depth=same).compute(), near)
    along_rows = ndimage.spline_filter1d(dx, 3, axis=0, mode=mode, depth=0).compute()
    assert_close(along_rows, np.concatenate([ndi.spline_filter1d(x[:32], 3, axis=0, mode=mode),
                                             ndi.spline_filter1d(x[32:], 3, axis=0, mode=mode)]))
    assert_close(ndimage.spline_filter(x, 3, mode=mode, depth=0), expected)  # whole: exact


@pytest.mark.parametrize("fn, depth, match", [
    ("spline_filter1d", (16, 32), "depth must be one integer"),
    ("spline_filter1d", [18], "depth must be one integer"),
    ("spline_filter1d", -1, "at least 0"),
    ("spline_filter", (1, 2, 3), "one halo per axis of the 2-d input, got 3"),
    ("spline_filter", -2, "at least 0"),
    ("spline_filter", 2.5, "integers"),
    ("spline_filter", {3: 4}, "axis 3 is out of bounds"),
])
def test_depth_errors(fn, depth, match):
    x = np.zeros((8, 6))
    for a in (x, da.from_array(x, chunks=4)):
        with pytest.raises((ValueError, np.exceptions.AxisError), match=match):
            getattr(ndimage, fn)(a, 3, depth=depth)


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fn, args, match", [
    ("spline_filter", (3.0, 6), "spline order not supported"),
    ("spline_filter", (3.0, 1), "spline order not supported"),
    ("spline_filter1d", (3.0, -1), "spline order not supported"),
    ("spline_filter1d", (3.0, 6), "spline order not supported"),
])
def test_scipy_order_errors(fn, args, match):
    x = np.ones((5, 4)) * args[0]
    with pytest.raises(RuntimeError, match=match):
        getattr(ndi, fn)(x, args[1])
    with pytest.raises(InterpolationError, match=match):
        getattr(ndimage, fn)(x, args[1])
    with pytest.raises(InterpolationError, match=match):
        getattr(ndimage, fn)(da.from_array(x), args[1])


def test_mode_and_axis_errors():
    x = np.zeros((5, 4))
    with pytest.raises(RuntimeError, match="boundary mode not supported"):
        ndi.spline_filter(x, 3, mode="bogus")
    with pytest.raises(InterpolationError, match="boundary mode not supported.*'bogus'"):
        ndimage.spline_filter(x, 3, mode="bogus")
    with pytest.raises(np.exceptions.AxisError):
        ndi.spline_filter1d(x, 3, axis=2)
    with pytest.raises(np.exceptions.AxisError):
        ndimage.spline_filter1d(da.from_array(x), 3, axis=2)


@pytest.mark.gpu
def test_gpu_float32_coefficients_within_1e5():
    """float32 coefficients computed in float32 on the device: the zoom's prefilter."""
    import cupy as cp

    x = np.random.default_rng(10).random((50, 40, 30)).astype(np.float32)
    got = ndimage.spline_filter(cp.asarray(x), 3, output=np.float32)
    expected = ndi.spline_filter(x.astype(np.float64), 3)
    assert np.abs(got.get() - expected).max() <= 1e-5


@pytest.mark.parametrize("fn", ["spline_filter", "spline_filter1d"])
@pytest.mark.parametrize("output", ["int16", np.uint8, np.int32])
def test_integer_output_truncates_the_coefficients_not_the_samples(fn, output):
    """scipy filters the first axis from the input itself and stores the result in the
    (integer) output: the coefficients are truncated, not the samples before filtering."""
    x = np.random.default_rng(19).standard_normal((9, 11)) * 20 + 40
    expected = getattr(ndi, fn)(x, 3, output=output)
    assert not np.array_equal(expected, getattr(ndi, fn)(x.astype(output), 3, output=output))
    np.testing.assert_array_equal(getattr(ndimage, fn)(x, 3, output=output), expected)
    out = np.zeros(x.shape, output)
    assert getattr(ndimage, fn)(x, 3, output=out) is out
    np.testing.assert_array_equal(out, expected)
    got = getattr(ndimage, fn)(da.from_array(x, chunks=(5, 4)), 3, output=output).compute()
    np.testing.assert_array_equal(got, expected)
