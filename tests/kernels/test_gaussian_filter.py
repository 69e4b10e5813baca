"""gaussian_filter and gaussian_filter1d against scipy.ndimage: every mode, per-axis sigma, order,
mode and radius, axes, integer and float32 data, view layouts, chunkings (wrap across many chunks,
chunks smaller than the halo), chunking invariance, and the errors scipy raises."""

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
from filtercheck import MODES, SYNONYMS, backends, check, device, layouts, tolerances
from hypothesis import given, settings
from hypothesis import strategies as st

from chunkernels import ndimage
from chunkernels.ndimage import FilterArgumentError
from chunkernels.testing import assert_close


@backends
@pytest.mark.parametrize("mode", MODES + SYNONYMS)
def test_modes(backend, mode):
    x = np.random.default_rng(0).standard_normal((31, 27))
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 1.7, mode=mode, cval=0.3,
          halo=7)


@backends
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("order", [0, 1, 2, (2, 0), (1, 2)])
def test_orders_and_dtypes(backend, dtype, order):
    x = np.random.default_rng(1).standard_normal((26, 33)).astype(dtype)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, (1.2, 2.5), order=order,
          halo=10)


@backends
def test_per_axis_modes_sigma_radius_axes(backend):
    x = np.random.default_rng(2).standard_normal((14, 17, 12))
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, (1.0, 0.0, 2.0),
          mode=("wrap", "nearest", "mirror"), radius=(2, 5, 3), halo=5)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, (2.0, 1.5),
          mode=("constant", "wrap"), cval=-1.0, axes=(2, 0), halo=8)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 3, truncate=1.5, axes=-2,
          halo=5)


@backends
@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32", "int64", "uint16"])
def test_integers_round_as_scipy(backend, dtype):
    """scipy computes in float64 and stores each pass in the input dtype (truncating)."""
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    x = rng.integers(max(info.min, -1000), min(info.max, 1000), (29, 24)).astype(dtype)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 1.3, halo=5)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 1.0, order=1, halo=4)


@backends
def test_output_dtype_and_array(backend):
    x = np.random.default_rng(4).integers(0, 255, (20, 21)).astype(np.uint8)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 2.0, output=np.float32,
          halo=8)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 2.0, output="float64",
          halo=8)
    out = device(backend, np.zeros((20, 21), np.float64))
    got = ndimage.gaussian_filter(device(backend, x), 2.0, output=out)
    assert got is out
    assert_close(out, ndi.gaussian_filter(x, 2.0, output=np.float64))


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(5))[index]
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, (1.5, 0.7),
          mode=("reflect", "wrap"), halo=6)


@backends
@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (0, 5), (3, 0), (1,), (2, 3, 1)])
def test_size_one_and_empty_axes(backend, shape):
    x = np.random.default_rng(6).standard_normal(shape)
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 1.5, mode="mirror", halo=6)


@backends
@pytest.mark.parametrize("mode", MODES)
def test_array_smaller_than_the_kernel(backend, mode):
    """Extensions longer than the axis repeat the boundary pattern (reflect of reflect)."""
    x = np.random.default_rng(7).standard_normal((3, 5))
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 4.0, mode=mode, cval=2.0,
          chunks=[(3, 5), (2, 2), (1, 3)])


@backends
def test_wrap_across_many_chunks(backend):
    x = np.random.default_rng(8).standard_normal((64, 48))
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, 2.0, mode="wrap",
          chunks=[(8, 8), (9, 13), (16, 5), (64, 6)])


@backends
def test_gaussian_filter1d(backend):
    x = np.random.default_rng(9).standard_normal((25, 18)).astype(np.float32)
    for axis, order, mode in [(0, 0, "reflect"), (-1, 2, "wrap"), (1, 1, "constant")]:
        check(backend, ndimage.gaussian_filter1d, ndi.gaussian_filter1d, x, 1.8, axis=axis,
              order=order, mode=mode, halo=7)
    check(backend, ndimage.gaussian_filter1d, ndi.gaussian_filter1d, x, 3.0, radius=2, halo=2)


def test_zero_sigma_copies_and_0d():
    x = np.random.default_rng(10).standard_normal((5, 6)).astype(np.float32)
    assert_close(ndimage.gaussian_filter(x, 0), ndi.gaussian_filter(x, 0))
    assert_close(ndimage.gaussian_filter(da.from_array(x, chunks=2), 0).compute(), x)
    assert_close(ndimage.gaussian_filter(np.float64(3.0) * np.ones(()), 1.0), np.array(3.0))
    assert_close(ndimage.gaussian_filter(x.tolist(), 1.0), ndi.gaussian_filter(x.tolist(), 1.0))


def test_chunks_smaller_than_the_halo_keep_their_chunking():
    # the halo exchange gathers a halo of 12 from several 3- and 4-wide neighbours: no rechunk
    x = np.random.default_rng(11).standard_normal((40, 30))
    dx = da.from_array(x, chunks=(3, 4))
    got = ndimage.gaussian_filter(dx, 3.0)
    assert got.chunks == dx.chunks
    assert_close(got.compute(), ndi.gaussian_filter(x, 3.0))


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_chunking_invariance(data):
    shape = data.draw(st.tuples(st.integers(1, 20), st.integers(1, 20)))
    chunks = tuple(data.draw(st.integers(1, n)) for n in shape)
    sigma = data.draw(st.floats(0.3, 3.0))
    mode = data.draw(st.sampled_from(MODES))
    x = np.random.default_rng(12).standard_normal(shape)
    got = ndimage.gaussian_filter(da.from_array(x, chunks=chunks), sigma, mode=mode, cval=1.0)
    assert_close(got.compute(), ndi.gaussian_filter(x, sigma, mode=mode, cval=1.0))


@pytest.mark.parametrize("kwargs, match", [
    ({"sigma": 1.0, "mode": "bogus"}, "boundary mode not supported.*'bogus'"),
    ({"sigma": (1.0, 2.0, 3.0)}, "sequence argument must have length equal to input rank"),
    ({"sigma": 1.0, "mode": ("wrap",)}, "sequence argument.*mode"),
    ({"sigma": 1.0, "order": -1}, "order must be non-negative"),
    ({"sigma": 1.0, "radius": -2}, "Radius must be a nonnegative integer"),
    ({"sigma": 1.0, "radius": 1.5}, "Radius must be a nonnegative integer"),
    ({"sigma": 1.0, "axes": (0, 0)}, "axes must be unique"),
    ({"sigma": 1.0, "axes": (2,)}, "specified axis: 2 is out of range"),
    ({"sigma": 1.0, "output": "U3"}, "output must have numeric dtype"),
])
def test_errors_before_any_work(kwargs, match):
    x = da.zeros((8, 8), chunks=4)
    with pytest.raises(FilterArgumentError, match=match):
        ndimage.gaussian_filter(x, **kwargs)
    with pytest.raises(RuntimeError):  # what scipy raises for these, or a ValueError
        try:
            ndimage.gaussian_filter(np.zeros((8, 8)), **kwargs)
        except ValueError as exc:
            raise RuntimeError from exc


@pytest.mark.parametrize("sigma", [0, 0.0, -0.0])
def test_gaussian_filter1d_refuses_a_zero_sigma_as_scipy_does(sigma):
    """scipy.ndimage.gaussian_filter1d divides by zero building the kernel; chunkernels says
    why, with an error that is a ZeroDivisionError too (gaussian_filter skips such axes)."""
    x = np.arange(10.0)
    with pytest.raises(ZeroDivisionError):
        ndi.gaussian_filter1d(x, sigma)
    for data in (x, da.from_array(x, chunks=4)):
        with pytest.raises(ZeroDivisionError, match="sigma must be positive") as caught:
            ndimage.gaussian_filter1d(data, sigma)
        assert isinstance(caught.value, FilterArgumentError)
    assert_close(ndimage.gaussian_filter(x, sigma), ndi.gaussian_filter(x, sigma))


def test_output_array_must_match():
    with pytest.raises(FilterArgumentError, match="output shape not correct"):
        ndimage.gaussian_filter(np.zeros((4, 4)), 1.0, output=np.zeros((3, 4)))
    with pytest.raises(TypeError, match="Dask input"):
        ndimage.gaussian_filter(da.zeros((4, 4), chunks=2), 1.0, output=np.zeros((4, 4)))


@pytest.mark.gpu
def test_launch_plans_are_reused_across_calls_and_parameters():
    """The GPU pass plans its launches once per layout: later calls with the same layout and
    another cval, and a 5-d view whose outer axes do not collapse (one launch per slice), give
    scipy's results."""
    x = np.random.default_rng(11).standard_normal((4, 5, 6, 7, 8))[::2, ::-1, 1:, ::2, :]
    sigma = (1.0, 0.0, 0.7, 0.0, 1.2)
    for cval in (1.5, -2.0, 1.5):
        got = ndimage.gaussian_filter(device("cupy", x), sigma, mode="constant", cval=cval)
        assert_close(got, ndi.gaussian_filter(x, sigma, mode="constant", cval=cval),
                     **tolerances("cupy", x.dtype))


@pytest.mark.gpu
def test_filters_longer_than_48_kib_of_shared_memory_opt_in():
    """161 float64 taps need 60 KiB of shared memory per tile, above the default 48 KiB."""
    x = np.random.default_rng(12).standard_normal((170, 150))
    for _ in range(2):  # the opt-in is made once per kernel
        got = ndimage.gaussian_filter(device("cupy", x), 20.0, mode="wrap")
        assert_close(got, ndi.gaussian_filter(x, 20.0, mode="wrap"), **tolerances("cupy", x.dtype))


def test_gaussian_filter1d_complex_data_promotes_a_real_output_type():
    """scipy's gaussian_filter1d is a correlate1d: a real output type becomes complex (with a
    warning) for complex data; gaussian_filter refuses it."""
    x = np.random.default_rng(13).standard_normal((7, 8)) * (2 + 1j)
    with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
        expected = ndi.gaussian_filter1d(x, 1.5, output=np.float32)
    for xin in (x, da.from_array(x, chunks=(3, 2))):
        with pytest.warns(UserWarning, match="promoting specified output dtype to complex"):
            got = ndimage.gaussian_filter1d(xin, 1.5, output=np.float32)
        assert got.dtype == expected.dtype == np.complex64
        assert_close(np.asarray(got), expected)
    with pytest.raises(RuntimeError, match="output must have complex dtype"):
        ndi.gaussian_filter(x, 1.5, output=np.float32)
    with pytest.raises(RuntimeError, match="output must have complex dtype"):
        ndimage.gaussian_filter(x, 1.5, output=np.float32)


@pytest.mark.parametrize("fn", ["gaussian_filter", "gaussian_filter1d", "gaussian_laplace",
                                "gaussian_gradient_magnitude"])
def test_float32_sigma_gives_scipy_float32_kernel(fn):
    """scipy builds the Gaussian from sigma as given: a NumPy float32 sigma gives a kernel
    computed in float32, not the float64 one of float(sigma); the results are identical."""
    x = np.random.default_rng(14).standard_normal((9, 11)) * 10
    sigma = np.float32(1.3)
    expected = getattr(ndi, fn)(x, sigma)
    assert not np.array_equal(expected, getattr(ndi, fn)(x, float(sigma)))
    for xin in (x, da.from_array(x, chunks=(4, 3)), da.from_array(x, chunks=(2, 5))):
        np.testing.assert_array_equal(np.asarray(getattr(ndimage, fn)(xin, sigma)), expected)


@pytest.mark.parametrize("radius", [(1,), [2], 1.5, -1])
def test_gaussian_filter1d_radius_is_one_integer(radius):
    """scipy's gaussian_filter1d takes one integer radius: a sequence or a float is a
    ValueError there (gaussian_filter takes one per axis)."""
    x = np.random.default_rng(18).standard_normal((6, 7))
    with pytest.raises(ValueError, match="Radius must be a nonnegative integer"):
        ndi.gaussian_filter1d(x, 1.5, radius=radius)
    for xin in (x, da.from_array(x, chunks=3)):
        with pytest.raises(ValueError, match="Radius must be a nonnegative integer"):
            ndimage.gaussian_filter1d(xin, 1.5, radius=radius)
    np.testing.assert_array_equal(ndimage.gaussian_filter1d(x, 1.5, radius=np.int64(2)),
                                  ndi.gaussian_filter1d(x, 1.5, radius=np.int64(2)))


# -- halos longer than the array (issue #20) ---------------------------------------------------------


@backends
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("order", [0, 1, (2, 0)])
def test_radius_a_few_times_the_array_folds_onto_it(references_fold, backend, mode, order):
    """Issue #20: a Gaussian wider than the array folds onto the array's own values (the mode's
    period, or its edge) instead of reading 2 * radius + 1 taps: SciPy's result, to rounding,
    on 7 x 5 samples with radii 3 to 6 times the axis."""
    x = np.random.default_rng(20).standard_normal((7, 5))
    check(backend, ndimage.gaussian_filter, ndi.gaussian_filter, x, (6.0, 7.5), order=order,
          mode=mode, cval=0.3, chunks=[(7, 5), (3, 2), (1, 5)])
    check(backend, ndimage.gaussian_filter1d, ndi.gaussian_filter1d, x, 9.0, 0, order=1,
          mode=mode, cval=-1.0, chunks=[(2, 5)])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "int16", "uint8"])
def test_folded_gaussian_keeps_scipys_passes_and_dtypes(references_fold, mode, dtype):
    """Folded passes are stored in the output dtype as SciPy's (integers round between passes);
    sums in another order may land on the other side of a rounding boundary, by one."""
    x = (np.random.default_rng(21).random((6, 9)) * 100).astype(dtype)
    expected = ndi.gaussian_filter(x, 5.0, mode=mode)
    for data in (x, da.from_array(x, chunks=(2, 4))):
        got = np.asarray(ndimage.gaussian_filter(data, 5.0, mode=mode))
        assert got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["uint8", "int16", "int32", "float32"])
def test_short_axes_are_scipys_to_the_last_bit(mode, dtype):
    """Taps reaching a little beyond a short axis (a size-1 axis, sigma 0.5 to 3 on 2 to 5
    samples) are left to SciPy's own extension of the line on the CPU, not folded: integer
    results round exactly as SciPy's, NumPy and Dask inputs alike. Folded sums, added in
    another order, were one off on some of these (uint16 (8, 1), sigma 0.5, mirror)."""
    rng = np.random.default_rng(23)
    for shape in [(8, 1), (1, 5), (1,), (3, 2), (5, 4)]:
        x = (rng.random(shape) * 200).astype(dtype)
        for sigma in (0.5, 1.0, 3.0):
            for name, kwargs in [("gaussian_filter", {}), ("gaussian_laplace", {}),
                                 ("gaussian_gradient_magnitude", {}),
                                 ("gaussian_filter1d", {"axis": 0, "order": 1})]:
                expected = getattr(ndi, name)(x, sigma, mode=mode, **kwargs)
                for data in (x, da.from_array(x, chunks=tuple(max(1, n // 2) for n in shape))):
                    got = np.asarray(getattr(ndimage, name)(data, sigma, mode=mode, **kwargs))
                    assert got.dtype == expected.dtype
                    np.testing.assert_array_equal(got, expected,
                                                  err_msg=f"{name} {shape} sigma={sigma}")
            size = int(2 * sigma) + 1
            for data in (x, da.from_array(x, chunks=1)):
                np.testing.assert_array_equal(
                    np.asarray(ndimage.uniform_filter(data, size, mode=mode)),
                    ndi.uniform_filter(x, size, mode=mode), err_msg=f"uniform {shape} {size}")


def test_the_euler_maclaurin_fold_of_wide_gaussians_is_scipys(monkeypatch):
    """Gaussians far wider than their period are folded with the Euler-Maclaurin formula, not
    weight by weight: forced here for sigma=100 on 5 samples, where SciPy can be compared."""
    from chunkernels._shared import filters

    monkeypatch.setattr(filters, "DIRECT", 0)
    filters.folded_gaussian_weights.cache_clear()
    x = np.random.default_rng(22).standard_normal((5, 4))
    try:
        for mode in MODES:
            for order in (0, 1, 2, 3):
                assert_close(ndimage.gaussian_filter(x, 100.0, order=order, mode=mode, cval=0.5),
                             ndi.gaussian_filter(x, 100.0, order=order, mode=mode, cval=0.5),
                             rtol=1e-12, atol=1e-14, err_msg=f"{mode} order {order}")
    finally:
        filters.folded_gaussian_weights.cache_clear()


@pytest.mark.parametrize("mode, limit", [
    ("reflect", lambda x: np.broadcast_to(x.mean(), x.shape)),
    ("wrap", lambda x: np.broadcast_to(x.mean(), x.shape)),
    # mirror's period holds the edge samples once and the others twice
    ("mirror", lambda x: np.broadcast_to(np.average(x, weights=np.outer(
        [1] + [2] * (x.shape[0] - 2) + [1], [1] + [2] * (x.shape[1] - 2) + [1])), x.shape)),
    # nearest puts half of the Gaussian on each edge, constant on cval
    ("nearest", lambda x: np.broadcast_to((x[[0, 0, -1, -1], [0, -1, 0, -1]]).mean(), x.shape)),
    ("constant", lambda x: np.full(x.shape, 0.25)),
])
def test_sigma_1e9_is_computed_at_once(mode, limit):
    """Issue #20: ``gaussian_filter(sigma=1e9)`` built a Dask graph, then failed at compute with a
    59.6 GiB MemoryError (SciPy's 8e9 weights). Folded, it is a Gaussian of 2n + 1 taps: its
    limit for an infinitely wide Gaussian (the mean over the mode's period, or the edges', or
    cval), on NumPy and Dask arrays, in moments."""
    x = np.random.default_rng(23).random((20, 24))
    for data in (x, da.from_array(x, chunks=10)):
        got = np.asarray(ndimage.gaussian_filter(data, 1e9, mode=mode, cval=0.25))
        assert_close(got, limit(x), rtol=1e-7, atol=1e-7)
    # a Gaussian's derivative is of the order of 1 / sigma (nearest: the step between the edges)
    grad = ndimage.gaussian_gradient_magnitude(da.from_array(x, chunks=10), 1e9, mode=mode)
    assert np.all(np.abs(grad.compute()) < 1e-9)


@pytest.mark.gpu
def test_sigma_1e9_on_the_gpu_folds_as_the_cpu_reference():
    """The GPU passes fold the Gaussian as the CPU reference does (CuPy arrays and chunks)."""
    x = np.random.default_rng(24).random((20, 24))
    for mode in MODES:
        expected = ndimage.gaussian_filter(x, (1e9, 3.0), mode=mode, cval=0.25)
        got = ndimage.gaussian_filter(device("cupy", x), (1e9, 3.0), mode=mode, cval=0.25)
        assert_close(got, expected, err_msg=mode)
        dx = da.from_array(device("cupy", x), chunks=10, asarray=False)
        got = ndimage.gaussian_filter(dx, (1e9, 3.0), mode=mode, cval=0.25).compute()
        assert_close(got, expected, err_msg=f"{mode} on Dask")
