"""zoom and resize against scipy.ndimage.zoom: every mode, both grid modes, spline orders 0-5,
factors below, above and at 1, per-axis factors, shapes that round, 1-D to 4-D, size-1 and empty
axes, view layouts, integer and complex data, ``output=``, ``prefilter=False``, many chunkings
(uneven, one sample wide), chunking invariance, how output blocks are planned, scipy's own
TestZoom cases and the errors scipy raises. GPU: the same against the CuPy path, the issue's float32
bound, and a bounded number of compiled functions for any number of uneven chunk shapes."""

import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from filtercheck import backends, check, device, layouts
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkernels import ndimage
from chunkernels.kernels import zoom as zoom_kernel
from chunkernels.ndimage import InterpolationError
from chunkernels.testing import assert_close

#: Every edge mode scipy.ndimage.zoom takes.
MODES = ("constant", "nearest", "reflect", "mirror", "wrap", "grid-constant", "grid-mirror",
         "grid-wrap")
#: scipy warns when grid_mode=True meets these (the grid-* forms are meant).
quiet_grid_warning = pytest.mark.filterwarnings("ignore:It is recommended to use mode")
CHUNKS_2D = [(4, 5), (11, 3), (1, 2), (6, 14)]


@backends
@quiet_grid_warning
@pytest.mark.parametrize("order", range(6))
@pytest.mark.parametrize("grid_mode", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_modes_orders_grid_modes(backend, mode, grid_mode, order):
    x = np.random.default_rng(0).standard_normal((11, 14))
    check(backend, ndimage.zoom, ndi.zoom, x, (1.7, 0.6), order=order, mode=mode,
          grid_mode=grid_mode, cval=0.3, chunks=CHUNKS_2D)


@backends
@pytest.mark.parametrize("factors", [0.3, 0.5, 0.999, 1.0, 1.01, 2.0, 3.3, (1.0, 2.5),
                                     (0.45, 1.0), (4.0, 0.25)])
@pytest.mark.parametrize("order", [0, 1, 3])
def test_factors(backend, factors, order):
    x = np.random.default_rng(1).standard_normal((13, 10))
    check(backend, ndimage.zoom, ndi.zoom, x, factors, order=order, mode="mirror",
          chunks=[(5, 4), (2, 3), (13, 1)])


@backends
@pytest.mark.parametrize("shape, factors", [
    ((17,), 2.3), ((9,), 0.4), ((6, 7, 8), (1.5, 0.7, 2.0)), ((5, 4, 3, 6), (2.0, 0.5, 1.7, 1.0)),
    ((4, 5, 6, 3), 1.4),
])
@pytest.mark.parametrize("order", [0, 1, 3])
@pytest.mark.parametrize("mode", ["reflect", "grid-constant", "wrap"])
def test_dims(backend, shape, factors, order, mode):
    x = np.random.default_rng(2).standard_normal(shape)
    check(backend, ndimage.zoom, ndi.zoom, x, factors, order=order, mode=mode, cval=-2.0,
          chunks=[tuple(max(1, n // 2) for n in shape), tuple(max(1, n // 3) for n in shape)])


@backends
@pytest.mark.parametrize("shape, factors, expected", [
    ((3, 11, 25), (4.0 / 3, 15.0 / 11, 29.0 / 25), (4, 15, 29)),  # scipy's roundoff case
    ((5, 7, 3), 0.5, (2, 4, 2)),  # Python's round: half to even
    ((10, 9), (0.04, 0.01), (0, 0)),
    ((8, 8), 1 / 8, (1, 1)),
])
def test_output_shape_rounds_as_scipy(backend, shape, factors, expected):
    x = np.random.default_rng(3).random(shape)
    got = ndimage.zoom(device(backend, x), factors)
    assert got.shape == expected == ndi.zoom(x, factors).shape
    assert_close(got, ndi.zoom(x, factors))
    lazy = ndimage.zoom(da.from_array(device(backend, x), chunks=3), factors)
    assert lazy.shape == expected
    assert_close(lazy.compute(), ndi.zoom(x, factors))


@backends
@quiet_grid_warning
@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (1,), (2,), (1, 1, 5)])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("grid_mode", [False, True])
def test_size_one_axes(backend, shape, mode, grid_mode):
    x = np.random.default_rng(4).standard_normal(shape)
    for order in (0, 1, 3, 5):
        check(backend, ndimage.zoom, ndi.zoom, x, 2.4, order=order, mode=mode,
              grid_mode=grid_mode, cval=1.5, chunks=[tuple(max(1, n // 2) for n in shape)])


@backends
@pytest.mark.parametrize("shape, factors", [((0, 5), 2.0), ((3, 0), 0.5), ((4, 6), 0.05),
                                            ((0,), 3.0)])
@pytest.mark.parametrize("mode", ["constant", "mirror", "reflect", "wrap", "grid-wrap"])
def test_empty(backend, shape, factors, mode):
    """Empty inputs and outputs. (scipy itself raises from numpy.pad for an empty input under
    'nearest' and 'grid-constant', whose prefilter pads: chunkernels returns the empty result.)"""
    x = np.zeros(shape)
    for order in (0, 1, 3):
        check(backend, ndimage.zoom, ndi.zoom, x, factors, order=order, mode=mode,
              chunks=[tuple(max(1, n) for n in shape)])
    if 0 in shape:
        want = tuple(int(round(n * factors)) for n in shape)
        for padded in ("nearest", "grid-constant"):
            got = ndimage.zoom(device(backend, x), factors, mode=padded)
            assert got.shape == want and got.dtype == x.dtype
            lazy = ndimage.zoom(da.from_array(device(backend, x)), factors, mode=padded)
            assert lazy.compute().shape == want


@backends
@pytest.mark.parametrize("index", range(5))
@pytest.mark.parametrize("order", [1, 3])
def test_layouts(backend, index, order):
    """C, Fortran, transposed, sliced and negative-stride views are read in place."""
    label, x = layouts(np.random.default_rng(5))[index]
    check(backend, ndimage.zoom, ndi.zoom, x, (1.3, 0.8), order=order, mode="reflect",
          chunks=[(7, 6), (23, 2)])


@backends
@pytest.mark.parametrize("dtype", ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64"])
@pytest.mark.parametrize("order", [0, 1, 3])
def test_integers_round_and_clip_as_scipy(backend, dtype, order):
    """scipy rounds integer outputs half away from zero and clips them to the dtype's range: cubic
    overshoots near 0 and the top of uint8 show both."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(6)
    x = rng.integers(max(info.min, -3000), min(info.max, 3000), (15, 12), endpoint=True)
    if info.max < 3000:  # bright spots: cubic overshoots past the top of the range
        x[::4, ::3] = info.max
    x = x.astype(dtype)
    check(backend, ndimage.zoom, ndi.zoom, x, 1.7, order=order, mode="reflect",
          chunks=[(4, 5), (15, 1)])
    check(backend, ndimage.zoom, ndi.zoom, x, 0.6, order=order, mode="constant", cval=3.7,
          chunks=[(4, 5)])
    check(backend, ndimage.zoom, ndi.zoom, x, (2.0, 1.0), order=order, output=np.float32,
          chunks=[(4, 5)])


@backends
def test_bool_input(backend):
    x = np.random.default_rng(7).random((9, 8)) > 0.5
    for order in (0, 1):
        check(backend, ndimage.zoom, ndi.zoom, x, 1.5, order=order, chunks=[(4, 3)])
        check(backend, ndimage.zoom, ndi.zoom, x, 1.5, order=order, output=np.float64,
              chunks=[(4, 3)])


@backends
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float32_and_output_dtypes(backend, dtype):
    x = np.random.default_rng(8).random((16, 13)).astype(dtype)
    check(backend, ndimage.zoom, ndi.zoom, x, 1.9, chunks=CHUNKS_2D)
    for output in (np.float32, "float64", np.int16, np.dtype("uint8")):
        check(backend, ndimage.zoom, ndi.zoom, x * 100, 0.7, output=output, chunks=[(5, 5)])


@backends
def test_output_array(backend):
    x = np.random.default_rng(9).random((6, 7))
    expected = ndi.zoom(x, 2.0, order=3)
    out = device(backend, np.zeros((12, 14), np.float32))
    got = ndimage.zoom(device(backend, x), 2.0, output=out)
    assert got is out
    assert_close(out, expected.astype(np.float32), rtol=1e-6, atol=1e-6)
    out = device(backend, np.zeros((12, 14)))
    ndimage.zoom(device(backend, x), 2, output=out)  # scipy's ticket 643: an int factor
    assert_close(out, expected)


def test_complex():
    x = np.random.default_rng(10).standard_normal((9, 7)) * (1 - 0.5j)
    for order in (0, 1, 3, 5):
        check("numpy", ndimage.zoom, ndi.zoom, x, 1.6, order=order, mode="wrap",
              chunks=[(4, 3)])
    with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
        got = ndimage.zoom(x, 1.6, output=np.float32)
    assert got.dtype == np.complex64
    with pytest.raises(RuntimeError, match="output must have complex dtype"):
        ndimage.zoom(x, 2.0, output=np.zeros((18, 14)))


@backends
@pytest.mark.parametrize("mode", ["mirror", "reflect", "grid-wrap", "nearest"])
@pytest.mark.parametrize("order", [2, 3, 5])
def test_prefilter_false_on_coefficients(backend, mode, order):
    """Coefficients from spline_filter, zoomed without a prefilter: scipy's two-step recipe."""
    x = np.random.default_rng(11).standard_normal((12, 15))
    coefficients = ndi.spline_filter(x, order, mode=mode)

    def two_step(a, *args, **kwargs):
        return ndimage.zoom(ndimage.spline_filter(a, order, mode=mode), *args, **kwargs)

    check(backend, ndimage.zoom, ndi.zoom, coefficients, 1.4, order=order, mode=mode,
          prefilter=False, chunks=[(5, 4), (1, 15)])
    expected = ndi.zoom(coefficients, 1.4, order=order, mode=mode, prefilter=False)
    got = two_step(da.from_array(device(backend, x), chunks=(4, 6)), 1.4, order=order, mode=mode,
                   prefilter=False)
    assert_close(got.compute(), expected, atol=1e-5 if backend == "cupy" else None)


@backends
def test_prefilter_false_blurs_as_scipy(backend):
    x = np.random.default_rng(12).standard_normal((10, 9))
    check(backend, ndimage.zoom, ndi.zoom, x, 1.01, order=3, prefilter=False, chunks=[(3, 3)])
    check(backend, ndimage.zoom, ndi.zoom, x, 1.0, order=4, prefilter=False, chunks=[(3, 3)])


@backends
@pytest.mark.parametrize("chunks", [(1, 1), (2, 3), (3, 17), (17, 2), ((5, 1, 11), (2, 9, 6))])
@pytest.mark.parametrize("order", [1, 3, 5])
def test_tiny_and_uneven_chunks(backend, chunks, order):
    """Chunks far smaller than the prefilter's halo, one sample wide, and uneven interiors."""
    x = np.random.default_rng(13).standard_normal((17, 17))
    for mode in ("grid-wrap", "nearest", "mirror"):
        check(backend, ndimage.zoom, ndi.zoom, x, (2.3, 0.7), order=order, mode=mode,
              chunks=[chunks], whole=False)


@backends
def test_issue_accuracy_bounds(backend):
    """The issue's bounds: order 3 within 1e-5 of scipy for float32 data in [0, 1] and 1e-9 for
    float64, whole and chunked; orders 0 and 1 within float rounding."""
    rng = np.random.default_rng(14)
    x = rng.random((24, 21, 19))
    for dtype, atol in (("float32", 1e-5), ("float64", 1e-9)):
        a = x.astype(dtype)
        expected = ndi.zoom(a.astype(np.float64), 1.7, order=3)
        for chunks in ((24, 21, 19), (7, 8, 6), (5, 21, 3)):
            got = ndimage.zoom(da.from_array(device(backend, a), chunks=chunks), 1.7, order=3)
            diff = np.abs(_host(got.compute()).astype(np.float64) - expected).max()
            assert diff <= atol, (dtype, chunks, diff)
        for order in (0, 1):
            got = _host(ndimage.zoom(device(backend, a), 1.7, order=order))
            assert_close(got, ndi.zoom(a, 1.7, order=order),
                         rtol=4 * np.finfo(dtype).eps, atol=4 * np.finfo(dtype).eps)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_chunking_invariance(data):
    """Any chunking gives scipy's result on the whole array (float64: within 1e-12)."""
    ndim = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 12)) for _ in range(ndim))
    chunks = tuple(data.draw(st.integers(1, n)) for n in shape)
    factors = tuple(data.draw(st.sampled_from([0.3, 0.5, 0.8, 1.0, 1.25, 2.0, 2.7]))
                    for _ in range(ndim))
    order = data.draw(st.integers(0, 5))
    mode = data.draw(st.sampled_from(MODES))
    grid_mode = data.draw(st.booleans())
    x = np.random.default_rng(15).standard_normal(shape)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "It is recommended to use mode")
        expected = ndi.zoom(x, factors, order=order, mode=mode, grid_mode=grid_mode, cval=0.5)
        got = ndimage.zoom(da.from_array(x, chunks=chunks), factors, order=order, mode=mode,
                           grid_mode=grid_mode, cval=0.5)
    assert_close(got.compute(), expected)


# -- how output blocks are planned --------------------------------------------------------------


def _zoom_tasks(result):
    """``{output block index: input block indices it reads}`` of a Dask zoom's own layer."""
    layer = result.dask.layers[result.name]
    reads = {}
    for key, task in dict(layer).items():
        deps = {dep[1:] for dep in task.dependencies}
        reads[key[1:]] = deps
    return reads


def test_output_blocks_follow_the_input_and_read_their_neighbours_only():
    """One output block per input block (chunks at least the prefilter's halo: 28 samples for
    order 3, 45 for order 5), each reading its own block and its neighbours only."""
    x = np.random.default_rng(16).standard_normal((250, 90))
    dx = da.from_array(x, chunks=(50, 45))
    for factors in (2.0, 0.5, (1.3, 3.1)):
        for order, mode in ((1, "constant"), (3, "mirror"), (5, "grid-wrap")):
            got = ndimage.zoom(dx, factors, order=order, mode=mode)
            assert len(got.chunks[0]) == len(dx.chunks[0])  # one output block per input block
            assert len(got.chunks[1]) == len(dx.chunks[1])
            for index, deps in _zoom_tasks(got).items():
                rows = {d[0] for d in deps}
                cols = {d[1] for d in deps}
                # its own input block and at most the neighbours on each side (the support of
                # the spline); grid-wrap's edge blocks also read the far end
                far = {0, len(dx.chunks[0]) - 1} if mode == "grid-wrap" else set()
                assert rows - far <= {index[0] - 1, index[0], index[0] + 1}, (index, rows)
                far = {0, len(dx.chunks[1]) - 1} if mode == "grid-wrap" else set()
                assert cols - far <= {index[1] - 1, index[1], index[1] + 1}, (index, cols)
            assert_close(got.compute(), ndi.zoom(x, factors, order=order, mode=mode))


def test_prefilter_runs_chunk_by_chunk():
    """The cubic prefilter keeps chunks at least as wide as its halo (28 samples in float64) and
    merges narrower ones with their neighbours; it never gathers whole axes."""
    x = np.random.default_rng(17).standard_normal((300, 80))
    for chunks, merged in (((60, 40), ((60,) * 5, (40, 40))),
                           (((25,) * 12, (10,) * 8), ((50,) * 6, (30, 50)))):
        dx = da.from_array(x, chunks=chunks)
        filtered = ndimage.spline_filter(dx, 3)
        assert filtered.chunks == merged
        assert_close(filtered.compute(), ndi.spline_filter(x, 3))
        got = ndimage.zoom(dx, 1.5, order=3, mode="mirror")
        assert got.numblocks == dx.numblocks  # planned from the input's chunks all the same
        assert_close(got.compute(), ndi.zoom(x, 1.5, order=3, mode="mirror"))


# -- scipy's TestZoom ----------------------------------------------------------------------------


@pytest.mark.parametrize("order", range(6))
def test_scipy_zoom1(order):
    for z in [2, [2, 2]]:
        arr = ndimage.zoom(np.arange(25, dtype=np.float64).reshape((5, 5)), z, order=order)
        assert arr.shape == (10, 10)
        assert np.all(arr[-1, :] != 0)
        assert np.all(arr[-1, :] >= (20 - 1e-12))
        assert np.all(arr[0, :] <= (5 + 1e-12))
        assert np.all(arr >= (0 - 1e-12))
        assert np.all(arr <= (24 + 1e-12))


def test_scipy_zoom2_and_zoom3():
    arr = np.arange(12).reshape((3, 4))
    np.testing.assert_array_equal(ndimage.zoom(ndimage.zoom(arr, 2), 0.5), arr)
    lazy = ndimage.zoom(ndimage.zoom(da.from_array(arr, chunks=2), 2), 0.5)
    np.testing.assert_array_equal(lazy.compute(), arr)
    arr = np.array([[1, 2]])
    np.testing.assert_array_almost_equal(ndimage.zoom(arr, (2, 1)), [[1, 2], [1, 2]])
    np.testing.assert_array_almost_equal(ndimage.zoom(arr, (1, 2)), [[1, 1, 2, 2]])


def test_scipy_zoom_infinity_and_factor_one():
    ndimage.zoom(np.zeros((8, 8)), 1.0 / 8, mode="nearest")  # ticket 1419: no division by zero
    out = ndimage.zoom(np.zeros((1, 5, 5)), (1.0, 2.0, 2.0), cval=7)  # ticket 1122
    np.testing.assert_array_almost_equal(out, np.zeros((1, 10, 10)))


@pytest.mark.parametrize("factors", [(1, 1), (3, 5), (8, 2), (8, 8)])
@pytest.mark.parametrize("mode", MODES)
def test_scipy_zoom_by_int_order0_is_kron(factors, mode):
    x = np.array([[0, 1], [2, 3]], dtype=np.float64)
    expected = np.kron(x, np.ones(factors))
    np.testing.assert_array_almost_equal(ndimage.zoom(x, factors, order=0, mode=mode), expected)
    lazy = ndimage.zoom(da.from_array(x, chunks=1), factors, order=0, mode=mode)
    np.testing.assert_array_almost_equal(lazy.compute(), expected)


@pytest.mark.parametrize("shape", [(2, 3), (4, 4)])
@pytest.mark.parametrize("factors", [(1, 1), (3, 5), (8, 2), (8, 8)])
@pytest.mark.parametrize("mode", ["nearest", "reflect", "mirror", "grid-wrap", "grid-constant"])
def test_scipy_zoom_grid_by_int_order0_is_kron(shape, factors, mode):
    x = np.arange(np.prod(shape), dtype=float).reshape(shape)
    np.testing.assert_array_almost_equal(
        ndimage.zoom(x, factors, order=0, mode=mode, grid_mode=True),
        np.kron(x, np.ones(factors)))


@pytest.mark.parametrize("mode", ["constant", "wrap"])
def test_scipy_zoom_grid_mode_warnings(mode):
    x = np.arange(9, dtype=np.float64).reshape((3, 3))
    with pytest.warns(UserWarning, match="It is recommended to use mode"):
        ndimage.zoom(x, 2, mode=mode, grid_mode=True)
    with pytest.warns(UserWarning, match="It is recommended to use mode"):
        ndimage.zoom(da.from_array(x, chunks=2), 2, mode=mode, grid_mode=True)


def test_scipy_zoom_0d_factor_and_gh20999():
    a = np.arange(10.0)
    assert_close(ndimage.zoom(a, np.array(2)), ndi.zoom(a, 2))
    x = np.eye(3)
    np.testing.assert_array_equal(ndimage.zoom(x, 1), x)  # a copy, no interpolation noise
    np.testing.assert_array_equal(ndimage.zoom(x, (1, 1)), x)
    out = np.zeros_like(x)
    ndimage.zoom(x, 1, output=out)
    np.testing.assert_array_equal(out, x)
    got = ndimage.zoom(x, 1)
    assert got is not x and not np.shares_memory(got, x)
    lazy = ndimage.zoom(da.from_array(x, chunks=2), 1, output=np.float32)
    np.testing.assert_array_equal(lazy.compute(), x.astype(np.float32))


# -- resize ----------------------------------------------------------------------------------------


@backends
@quiet_grid_warning
@pytest.mark.parametrize("shape", [(20, 7), (5, 13), (11, 11), (1, 30), (3, 1)])
@pytest.mark.parametrize("grid_mode", [False, True])
def test_resize_is_zoom_to_the_exact_shape(backend, shape, grid_mode):
    """resize(x, shape) is scipy.ndimage.zoom with the factors shape / x.shape, whose rounding
    gives back ``shape``."""
    x = np.random.default_rng(18).standard_normal((11, 9))
    factors = tuple(n / m for n, m in zip(shape, x.shape))

    def ref(a, out_shape, **kwargs):
        return ndi.zoom(a, factors, **kwargs)

    for order, mode in ((0, "nearest"), (1, "reflect"), (3, "grid-constant"), (5, "mirror")):
        check(backend, ndimage.resize, ref, x, shape, order=order, mode=mode,
              grid_mode=grid_mode, chunks=[(4, 4), (11, 2)])


@pytest.mark.parametrize("order", [0, 1, 3])
@pytest.mark.parametrize("sk_mode, mode", [("reflect", "mirror"), ("symmetric", "reflect"),
                                           ("edge", "nearest"), ("wrap", "grid-wrap"),
                                           ("constant", "grid-constant")])
def test_resize_matches_skimage_without_antialiasing(order, sk_mode, mode):
    """skimage.transform.resize(..., anti_aliasing=False, preserve_range=True, clip=False) is
    resize with grid_mode=True (pixel edges map onto pixel edges) and scikit-image's mode names
    translated."""
    transform = pytest.importorskip("skimage.transform")
    x = np.random.default_rng(19).random((14, 9, 5))
    for shape in ((20, 4, 5), (7, 13, 2)):
        expected = transform.resize(x, shape, order=order, mode=sk_mode, cval=0.25,
                                    anti_aliasing=False, preserve_range=True, clip=False)
        got = ndimage.resize(da.from_array(x, chunks=(5, 4, 3)), shape, order=order, mode=mode,
                             cval=0.25, grid_mode=True)
        assert_close(got.compute(), expected)


def test_resize_identity_and_errors():
    x = np.random.default_rng(20).standard_normal((6, 5))
    got = ndimage.resize(x, (6, 5))
    np.testing.assert_array_equal(got, x)
    assert not np.shares_memory(got, x)
    with pytest.raises(RuntimeError, match="sequence argument must have length equal to input"):
        ndimage.resize(x, (6, 5, 1))
    with pytest.raises(ValueError, match=r"output_shape=\(6, -5\).*non-negative integers"):
        ndimage.resize(x, (6, -5))
    with pytest.raises(ValueError, match="non-negative integers"):
        ndimage.resize(x, (6.5, 5))
    with pytest.raises(RuntimeError, match="input and output rank must be > 0"):
        ndimage.resize(np.float64(1.0), ())


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"zoom": 2.0, "order": 6}, "spline order not supported"),
    ({"zoom": 2.0, "order": -1}, "spline order not supported"),
    ({"zoom": 2.0, "mode": "bogus"}, "boundary mode not supported"),
    ({"zoom": (2.0, 1.0, 1.0)}, "sequence argument must have length equal to input rank"),
    ({"zoom": 2.0, "output": np.zeros((3, 3))}, "output shape not correct"),
])
def test_scipy_errors(kwargs, match):
    """The errors scipy raises (RuntimeError), which are also ValueErrors here."""
    for x in (np.zeros((4, 5)), da.zeros((4, 5), chunks=2)):
        if "output" in kwargs and hasattr(x, "dask"):
            continue
        with pytest.raises(RuntimeError, match=match):
            ndi.zoom(np.zeros((4, 5)), **kwargs)
        with pytest.raises(InterpolationError, match=match) as info:
            ndimage.zoom(x, **kwargs)
        assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("kwargs, shown", [
    ({"zoom": 2.0, "order": 6}, "order=6; scipy.ndimage interpolates with integer orders 0..5"),
    ({"zoom": 2.0, "mode": "bogus"}, "mode='bogus'; expected one of constant, grid-constant"),
    ({"zoom": (2.0, 1.0, 1.0)}, "zoom has 3 values for an input of 2 dims"),
    ({"zoom": 2.0, "output": np.zeros((3, 3))}, r"output has shape \(3, 3\); the result has shape"
                                                 r" \(8, 10\)"),
])
def test_errors_show_the_values_seen(kwargs, shown):
    with pytest.raises(InterpolationError, match=shown):
        ndimage.zoom(np.zeros((4, 5)), **kwargs)


def test_0d_input_and_dask_output_array():
    with pytest.raises(RuntimeError, match="input and output rank must be > 0"):
        ndi.zoom(np.float64(1.0), 2)
    with pytest.raises(RuntimeError, match="input and output rank must be > 0"):
        ndimage.zoom(np.float64(1.0), 2)
    with pytest.raises(TypeError, match="output arrays are not supported for Dask arrays"):
        ndimage.zoom(da.zeros((4, 4), chunks=2), 2.0, output=np.zeros((8, 8)))


def test_lists_and_scalars_are_numpy():
    got = ndimage.zoom([[0.0, 1.0], [2.0, 3.0]], 2, order=1)
    assert isinstance(got, np.ndarray)
    assert_close(got, ndi.zoom([[0.0, 1.0], [2.0, 3.0]], 2, order=1))


# -- the block kernel on its own ------------------------------------------------------------------


def test_kernel_validates_tables():
    with pytest.raises(ValueError, match="one table per axis"):
        zoom_kernel.SPEC.params(2, {"taps": (np.zeros((3, 4), int),),
                                    "weights": (np.zeros((3, 4)),)})
    with pytest.raises(TypeError, match="taps must be integers"):
        zoom_kernel.SPEC.params(1, {"taps": (np.zeros((3, 4)),), "weights": (np.zeros((3, 4)),)})


# -- GPU -------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_uneven_chunks_compile_a_bounded_number_of_functions():
    """cupyx.scipy.ndimage.zoom compiles one kernel per output shape; here uneven edge blocks of
    any shape reuse the functions compiled for the first block: per (dtypes, ndim, order) one
    zoom function with constant taps and one without (float32: one such pair per axis, the
    separable passes), and one prefilter function."""
    import cupy as cp

    from chunkernels import cuda

    rng = np.random.default_rng(21)
    x = cp.asarray(rng.random((61, 47, 33)).astype(np.float32))
    expected = ndi.zoom(x.get().astype(np.float64), 1.37, order=3)
    for kernel in ("zoom", "spline_filter"):  # compiled by earlier tests: count from none
        cuda.forget(kernel)
    before = set(cuda._FUNCTIONS)
    shapes = set()
    for chunks in ((61, 47, 33), (30, 20, 10), (17, 13, 11), (7, 47, 5), (29, 31, 9), (16, 9, 33),
                   (12, 23, 8), (13, 11, 7)):
        got = ndimage.zoom(da.from_array(x, chunks=chunks, asarray=False), 1.37, order=3)
        shapes |= {tuple(c[i] for c, i in zip(got.chunks, ix)) for ix in np.ndindex(*got.numblocks)}
        assert np.abs(got.compute().get().astype(np.float64) - expected).max() <= 1e-5
    new = set(cuda._FUNCTIONS) - before
    zooms = [k for k in new if k[1] == "zoom"]
    filters = [k for k in new if k[1] == "spline_filter"]
    assert len(shapes) > 30  # many different output block shapes ...
    assert len(zooms) <= 2 * x.ndim and len(filters) <= 1, sorted(new)  # ... a handful


@pytest.mark.gpu
def test_gpu_views_every_order():
    """A reversed, sliced, stepped CuPy view, read in place by the GPU path, every order."""
    import cupy as cp

    x = np.random.default_rng(22).standard_normal((33, 28, 9))
    for order in (0, 1, 2, 3, 4, 5):
        got = ndimage.zoom(cp.asarray(x)[::-1, 3:, ::2], (0.8, 1.9, 1.3), order=order,
                           mode="grid-wrap")
        assert_close(got, ndi.zoom(x[::-1, 3:, ::2], (0.8, 1.9, 1.3), order=order,
                                   mode="grid-wrap"), rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("order", [2, 3, 5])
@pytest.mark.parametrize("mode", ["constant", "grid-constant", "mirror", "grid-wrap", "nearest"])
@pytest.mark.parametrize("shape, factors", [((23, 17), (1.9, 0.7)), ((9, 14, 11), 2.0),
                                            ((5, 6, 4, 7), (1.5, 0.6, 2.2, 1.0))])
def test_gpu_separable_float32_passes_equal_the_nested_sum(monkeypatch, shape, factors, mode,
                                                           order):
    """float32 zooms of order 2 and up run one pass per axis (``zoom_pass``); they add the
    nested kernel's terms in its order, so both agree to a float32 rounding, on a reversed,
    stepped view too."""
    import cupy as cp

    x = cp.asarray(np.random.default_rng(23).random(shape, dtype=np.float32))
    for view in (x, x[::-1, ..., ::2]):
        kw = {"order": order, "mode": mode, "cval": 0.3, "grid_mode": mode.startswith("grid")}
        separable = ndimage.zoom(view, factors, **kw)
        monkeypatch.setattr(zoom_kernel, "SEPARABLE", False)
        nested = ndimage.zoom(view, factors, **kw)
        monkeypatch.setattr(zoom_kernel, "SEPARABLE", True)
        assert separable.dtype == nested.dtype == np.float32
        assert_close(separable, nested, rtol=1e-6, atol=1e-6)
        want = ndi.zoom(view.get().astype(np.float64), factors, **kw)
        bound = 1e-5 if order <= 3 else 1e-4  # float32 prefilters of higher orders lose more
        assert np.abs(separable.get() - want).max() <= bound


def _raises_as_scipy(fn, x, *args, **kwargs):
    """``fn`` raises what scipy's function of that name raises, for NumPy and Dask inputs."""
    with pytest.raises(Exception) as scipy_error:
        getattr(ndi, fn)(x, *args, **kwargs)
    # Dask inputs take no output array (a TypeError of their own)
    dask_too = not isinstance(kwargs.get("output"), np.ndarray)
    for xin in (x, da.from_array(x, chunks=2))[:2 if dask_too else 1]:
        with pytest.raises(scipy_error.type):
            getattr(ndimage, fn)(xin, *args, **kwargs)


@pytest.mark.parametrize("fn, args", [("zoom", (2,)), ("spline_filter", ()),
                                      ("spline_filter1d", ())])
def test_dtypes_scipy_does_not_interpolate(fn, args):
    """float16 and long double inputs or outputs are a RuntimeError in scipy."""
    x = np.random.default_rng(20).standard_normal((5, 6))
    _raises_as_scipy(fn, x.astype(np.float16), *args)
    _raises_as_scipy(fn, x.astype(np.longdouble), *args)
    _raises_as_scipy(fn, x, *args, output=np.float16)
    _raises_as_scipy(fn, x, *args, output="float16")
    _raises_as_scipy(fn, x, *args, output="U3")
    _raises_as_scipy(fn, x * 1j, *args, output="float64")  # a string is not promoted


def test_zoom_errors_as_scipy():
    x = np.random.default_rng(21).standard_normal((5, 6))
    _raises_as_scipy("zoom", x, -1)                          # negative dimensions
    _raises_as_scipy("zoom", x, (2, -0.5))
    _raises_as_scipy("zoom", x, 2, output=np.complex128)     # no complex output for real data
    _raises_as_scipy("zoom", x, 2, output=np.zeros((10, 12), complex))
    # where scipy returns before resampling, a complex output is fine
    for zoom in (1, 0.01):
        expected = ndi.zoom(x, zoom, output=np.complex128)
        np.testing.assert_array_equal(ndimage.zoom(x, zoom, output=np.complex128), expected)


@pytest.mark.parametrize("mode", ["constant", "grid-constant", "nearest", "mirror", "wrap"])
@pytest.mark.parametrize("order", [0, 1, 3])
def test_complex_zoom_ignores_grid_mode_as_scipy(mode, order):
    """scipy 1.17 zooms complex data as its real and imaginary parts without passing grid_mode
    on; chunkernels gives the same results."""
    x = np.random.default_rng(22).standard_normal((6, 7)) * (1 - 0.5j)
    expected = ndi.zoom(x, 1.7, order=order, mode=mode, grid_mode=True)
    np.testing.assert_allclose(expected, ndi.zoom(x, 1.7, order=order, mode=mode), rtol=0,
                               atol=0)
    check("numpy", ndimage.zoom, ndi.zoom, x, 1.7, order=order, mode=mode, grid_mode=True,
          chunks=[(4, 3), (2, 5)])
