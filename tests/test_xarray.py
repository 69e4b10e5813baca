"""xarray DataArrays in, DataArrays out (chunkernels._xarray, through the public entry of every
function): the values are those of the call on the data, a Dask-backed DataArray stays lazy, and
the labels follow the rules of docs/interop.md: kept on the input's grid, resampled or dropped
along changed axes, plain values for reductions and measurements. xarray is not a dependency of
chunkernels: these tests skip without it."""

from __future__ import annotations

import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi
import scipy.signal

import chunkernels
from chunkernels import _xarray, metrics, ndimage, signal, sources
from chunkernels.testing import assert_close

xr = pytest.importorskip("xarray")

BACKINGS = ("numpy", "dask")


def _image(backing="numpy", shape=(24, 30), seed=0, source=None):
    """A DataArray with every sort of label: dimension coordinates (regular), a non-index
    coordinate along one dim, a 2-D coordinate, a scalar coordinate, attributes and a name;
    ``source``: a region of it made bright."""
    data = np.random.default_rng(seed).random(shape)
    if source is not None:
        data[source] = 30.0
    ny, nx = shape
    a = xr.DataArray(
        data, dims=("y", "x"), name="flux", attrs={"units": "Jy/beam", "telescope": "LOFAR"},
        coords={"y": 10.0 + 0.25 * np.arange(ny), "x": np.arange(nx) * 2,
                "lat": ("y", np.linspace(-3.0, 3.0, ny)), "mask": (("y", "x"), data > 0.5),
                "band": "L"})
    return a.chunk({"y": 10, "x": 12}) if backing == "dask" else a


def _check_like(result, template, values, *, dtype=None, same_chunks=True):
    """``result`` is a DataArray labelled as ``template``, of its backing, holding ``values``."""
    assert isinstance(result, xr.DataArray)
    assert result.dims == template.dims
    assert result.name == template.name and result.attrs == template.attrs
    xr.testing.assert_identical(result.coords.to_dataset(), template.coords.to_dataset())
    assert isinstance(result.data, da.Array) == isinstance(template.data, da.Array)
    if isinstance(template.data, da.Array) and same_chunks:
        assert result.chunks == template.chunks
    if dtype is not None:
        assert result.dtype == dtype
    assert_close(np.asarray(result.data), values)


# -- filters ---------------------------------------------------------------------------------------

FILTERS = [
    (ndimage.correlate1d, ndi.correlate1d, ([1.0, 2.0, 1.0],), {"axis": 0}),
    (ndimage.convolve1d, ndi.convolve1d, ([1.0, -1.0, 2.0],), {}),
    (ndimage.correlate, ndi.correlate, (np.arange(9.0).reshape(3, 3),), {"mode": "wrap"}),
    (ndimage.convolve, ndi.convolve, (np.ones((3, 2)),), {"mode": "nearest"}),
    (ndimage.gaussian_filter1d, ndi.gaussian_filter1d, (1.5,), {"axis": 1}),
    (ndimage.gaussian_filter, ndi.gaussian_filter, (2.0,), {}),
    (ndimage.uniform_filter1d, ndi.uniform_filter1d, (4,), {}),
    (ndimage.uniform_filter, ndi.uniform_filter, (3,), {"mode": "mirror"}),
    (ndimage.sobel, ndi.sobel, (), {"axis": 0}),
    (ndimage.laplace, ndi.laplace, (), {}),
    (ndimage.prewitt, ndi.prewitt, (), {}),
    (ndimage.gaussian_laplace, ndi.gaussian_laplace, (1.0,), {}),
    (ndimage.gaussian_gradient_magnitude, ndi.gaussian_gradient_magnitude, (1.0,), {}),
]


@pytest.mark.parametrize("backing", BACKINGS)
@pytest.mark.parametrize("fn, reference, args, kwargs", FILTERS,
                         ids=[f[0].__name__ for f in FILTERS])
def test_filters_keep_every_label(backing, fn, reference, args, kwargs):
    a = _image(backing)
    got = fn(a, *args, **kwargs)
    _check_like(got, a, reference(a.values, *args, **kwargs))


def test_a_lazy_dataarray_stays_lazy():
    a = _image("dask")
    with dask.config.set(scheduler=_refuse):  # nothing may be computed to build the result
        got = ndimage.gaussian_filter(a, 2.0, output=np.float32)
    assert isinstance(got.data, da.Array) and got.dtype == np.float32
    assert got.data._meta.__class__ is np.ndarray


def _refuse(*args, **kwargs):
    raise AssertionError("computed while building a lazy result")


def test_output_dataarray_is_filled_and_returned():
    a = _image()
    out = xr.zeros_like(a, dtype=np.float32)
    before = out.data
    got = ndimage.uniform_filter(a, 5, output=out)
    assert got is out and out.data is before
    assert_close(out.values, ndi.uniform_filter(a.values, 5, output=np.float32), rtol=1e-6)


def test_attributes_follow_xarray_keep_attrs():
    a = _image()
    with xr.set_options(keep_attrs=False):
        assert ndimage.sobel(a).attrs == {}
    with xr.set_options(keep_attrs=True):
        assert ndimage.sobel(a).attrs == a.attrs


def test_encoding_is_not_carried():
    a = _image()
    a.encoding = {"dtype": "int16", "scale_factor": 0.1}
    assert ndimage.laplace(a).encoding == {}


def test_only_a_dataarray_input_gives_a_dataarray():
    a = _image()
    got = ndimage.gaussian_filter(a.values, 1.0, output=a.copy())  # the output filled, returned
    assert isinstance(got, xr.DataArray)
    assert isinstance(ndimage.gaussian_filter(a.values, 1.0), np.ndarray)
    assert isinstance(ndimage.gaussian_filter(a.data, 1.0), np.ndarray)


# -- interpolation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backing", BACKINGS)
@pytest.mark.parametrize("grid_mode", [False, True])
def test_zoom_resamples_regular_coordinates_and_drops_the_rest(backing, grid_mode):
    a = _image(backing)
    got = ndimage.zoom(a, (1, 2.5), order=1, grid_mode=grid_mode,
                       mode="grid-constant" if grid_mode else "constant")
    expected = ndi.zoom(a.values, (1, 2.5), order=1, grid_mode=grid_mode,
                        mode="grid-constant" if grid_mode else "constant")
    assert got.dims == a.dims and got.shape == expected.shape
    assert isinstance(got.data, da.Array) == (backing == "dask")
    assert_close(np.asarray(got.data), expected)
    assert got.name == a.name and got.attrs == a.attrs
    # along the unchanged axis: everything kept
    np.testing.assert_array_equal(got.y, a.y)
    np.testing.assert_array_equal(got.lat, a.lat)
    assert got.band.item() == "L"
    # along the zoomed axis: the regular coordinate at the output samples' input positions
    n_in, n_out = a.sizes["x"], got.sizes["x"]
    if grid_mode:
        where = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
    else:
        where = np.arange(n_out) * (n_in - 1) / (n_out - 1)
    np.testing.assert_allclose(got.x.values, 2 * where, rtol=0, atol=1e-12)
    assert "mask" not in got.coords  # a 2-D coordinate along a zoomed dim
    assert "x" in got.indexes


def test_zoom_coordinates_land_on_the_input_where_samples_coincide():
    """zoom by 2 with grid_mode=False on 5 samples: every other output sample is an input one."""
    a = xr.DataArray(np.arange(5.0), dims="t", coords={"t": [100.0, 110.0, 120.0, 130.0, 140.0]})
    got = ndimage.zoom(a, 9 / 5, order=1)
    np.testing.assert_allclose(got.t.values, np.linspace(100.0, 140.0, 9))
    np.testing.assert_allclose(got.values, np.linspace(0.0, 4.0, 9))


def test_zoom_keeps_datetimes_and_drops_irregular_or_textual_coordinates():
    times = np.datetime64("2024-01-01T00:00") + np.arange(6) * np.timedelta64(10, "m")
    a = xr.DataArray(np.random.default_rng(3).random((6, 4)), dims=("time", "band"),
                     coords={"time": times, "band": ["u", "g", "r", "i"],
                             "airmass": ("time", [1.0, 1.1, 1.3, 1.2, 1.6, 2.0])})
    got = ndimage.resize(a, (11, 8), order=1)
    assert got.time.dtype == a.time.dtype  # xarray's unit for them (it may change the given one)
    expected = times[0] + np.arange(11) * np.timedelta64(5, "m")
    np.testing.assert_array_equal(got.time.values, expected.astype(a.time.dtype))
    assert "airmass" not in got.coords and "band" not in got.coords


def test_resize_to_the_same_shape_keeps_everything():
    a = _image()
    got = ndimage.resize(a, a.shape, order=1, prefilter=False)
    _check_like(got, a, ndi.zoom(a.values, 1, order=1))


def test_zoom_of_complex_data_places_coordinates_as_scipy_zooms_it():
    """SciPy zooms complex data with grid_mode=False whatever is given: so do the coordinates."""
    a = xr.DataArray(np.exp(1j * np.arange(6.0)), dims="x", coords={"x": np.arange(6.0)})
    got = ndimage.zoom(a, 2, order=1, grid_mode=True, mode="grid-constant")
    np.testing.assert_allclose(got.x.values, np.linspace(0.0, 5.0, 12))


@pytest.mark.parametrize("backing", BACKINGS)
def test_spline_filters_keep_every_label(backing):
    a = _image(backing)
    # (Dask: chunks narrower than the prefilter's halo are merged with their neighbours)
    _check_like(ndimage.spline_filter(a, 3), a, ndi.spline_filter(a.values, 3), same_chunks=False)
    _check_like(ndimage.spline_filter1d(a, 2, axis=0), a, ndi.spline_filter1d(a.values, 2, 0),
                same_chunks=False)


# -- label and measurements ------------------------------------------------------------------------


@pytest.mark.parametrize("backing", BACKINGS)
def test_label_gives_labels_on_the_grid_and_a_plain_count(backing):
    a = _image(backing)
    labels, count = ndimage.label(a > 0.7)
    expected, n = ndi.label(a.values > 0.7)
    _check_like(labels, a > 0.7, expected)
    assert not isinstance(count, xr.DataArray)
    assert int(count) == n
    wrapped, _ = ndimage.label(a > 0.7, wrap_axes=1)
    assert isinstance(wrapped, xr.DataArray) and wrapped.dims == a.dims


def test_label_into_an_output_dataarray():
    a = _image()
    out = xr.zeros_like(a, dtype=np.int32)
    count = ndimage.label(a > 0.6, output=out)
    expected, n = ndi.label(a.values > 0.6)
    assert count == n
    np.testing.assert_array_equal(out.values, expected)


@pytest.mark.parametrize("backing", BACKINGS)
def test_measurements_are_plain_values(backing):
    a = _image(backing)
    labels, _ = ndimage.label(a > 0.7)
    host_labels, n = ndi.label(a.values > 0.7)
    index = np.arange(1, n + 1)
    for fn, reference in [(ndimage.sum_labels, ndi.sum_labels), (ndimage.mean, ndi.mean),
                          (ndimage.maximum, ndi.maximum), (ndimage.variance, ndi.variance)]:
        got = fn(a, labels, index)
        assert not isinstance(got, xr.DataArray)
        assert isinstance(got, da.Array) == (backing == "dask")
        assert_close(np.asarray(got), reference(a.values, host_labels, index))
    single = ndimage.minimum(a, labels)
    assert not isinstance(single, xr.DataArray)
    assert_close(np.asarray(single), ndi.minimum(a.values, host_labels))
    positions = ndimage.center_of_mass(a, labels, index[:3])
    expected = ndi.center_of_mass(a.values, host_labels, index[:3])
    assert_close(np.asarray(dask.compute(positions)[0]), np.asarray(expected))
    table = ndimage.measure(a, labels, properties=("label", "area", "mean"), as_frame=False)
    assert isinstance(table, dict) and not any(isinstance(v, xr.DataArray)
                                               for v in table.values())
    assert_close(np.asarray(dask.compute(table["area"])[0]),
                 np.bincount(host_labels.ravel())[1:])


def test_find_objects_and_histogram_of_dataarrays():
    a = _image()
    labels, _ = ndimage.label(a > 0.7)
    host_labels, _ = ndi.label(a.values > 0.7)
    assert ndimage.find_objects(labels) == ndi.find_objects(host_labels)
    got = ndimage.histogram(a, 0.0, 1.0, 4, labels, [1, 2])
    expected = ndi.histogram(a.values, 0.0, 1.0, 4, host_labels, [1, 2])
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_labels_with_the_input_dims_in_another_order_are_refused():
    a = _image()
    labels, _ = ndimage.label(a > 0.7)
    with pytest.raises(ValueError, match=r"labels has dims \('x', 'y'\).*transpose it first"):
        ndimage.sum_labels(a, labels.transpose())
    square = xr.DataArray(np.ones((24, 24)), dims=("y", "x"))
    with pytest.raises(ValueError, match="labels has dims"):
        ndimage.mean(square, square.transpose().astype(int))


# -- signal ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backing", BACKINGS)
@pytest.mark.parametrize("shape", [(3, 3), (4, 5)])
def test_convolve2d_places_its_output_on_the_input_grid(backing, shape):
    a = _image(backing)
    w = np.random.default_rng(5).random(shape)
    same = signal.convolve2d(a, w, "same")
    _check_like(same, a, scipy.signal.convolve2d(a.values, w, "same"))
    full = signal.convolve2d(a, w)  # 'full': the input grid extended by the filter's reach
    assert_close(np.asarray(full.data), scipy.signal.convolve2d(a.values, w))
    np.testing.assert_array_equal(full.x, 2 * (np.arange(full.sizes["x"]) - (shape[1] - 1) // 2))
    np.testing.assert_allclose(full.y, 10.0 + 0.25 * (np.arange(full.sizes["y"])
                                                     - (shape[0] - 1) // 2))
    valid = signal.convolve2d(a, w, "valid")
    assert_close(np.asarray(valid.data), scipy.signal.convolve2d(a.values, w, "valid"))
    np.testing.assert_array_equal(valid.x, a.x.values[shape[1] // 2:][:valid.sizes["x"]])
    np.testing.assert_array_equal(valid.y, a.y.values[shape[0] // 2:][:valid.sizes["y"]])
    assert "mask" not in valid.coords and valid.band.item() == "L"
    # 'same' puts each output sample where 'full' does
    np.testing.assert_array_equal(full.sel(x=a.x, y=a.y).values, same.values)


def test_convolve2d_swapped_inputs_lose_the_coordinates_of_in1():
    """'valid' with in1 the smaller: scipy swaps them, and the result lies on in2's grid."""
    a = xr.DataArray(np.ones((2, 3)), dims=("y", "x"), coords={"x": [0, 1, 2]})
    got = signal.convolve2d(a, np.ones((4, 5)), "valid")
    assert got.shape == (3, 3) and "x" not in got.coords


# -- metrics and sources ---------------------------------------------------------------------------


@pytest.mark.parametrize("backing", BACKINGS)
def test_metrics_are_plain_values(backing):
    a, b = _image(backing), _image(backing, seed=1)
    mse = metrics.mean_squared_error(a, b)
    assert not isinstance(mse, xr.DataArray)
    assert isinstance(mse, da.Array) == (backing == "dask")
    assert_close(np.asarray(mse), np.mean((a.values - b.values) ** 2))
    nrmse = metrics.normalized_root_mse(a, b.values)  # a DataArray and a NumPy array
    assert_close(np.asarray(nrmse),
                 np.sqrt(np.mean((a.values - b.values) ** 2) / np.mean(a.values ** 2)))


@pytest.mark.parametrize("backing", BACKINGS)
def test_sources_label_their_masks_and_labels(backing):
    a = _image(backing)
    mask = sources.threshold(a, 0.5)
    _check_like(mask, a, a.values > 0.5, dtype=bool)
    stats, kept = sources.kappa_sigma_clip(a, 2.0, return_mask=True)
    expected = sources.clip_reference(a.values, 2.0)
    assert isinstance(stats, sources.ClipResult) and stats.count == expected.count
    _check_like(kept, a, (a.values > stats.lower) & (a.values < stats.upper))
    assert isinstance(sources.kappa_sigma_clip(a), sources.ClipResult)


@pytest.mark.parametrize("backing", BACKINGS)
def test_find_sources_labels_its_label_image(backing):
    a = _image(backing, shape=(40, 40), source=np.s_[12:15, 20:23])
    found = sources.find_sources(a, nsigma=3.0)
    plain = sources.find_sources(a.values, nsigma=3.0)
    catalogue, labels = found
    _check_like(labels, a, plain.labels)
    assert isinstance(found, sources.Sources) and found.threshold == plain.threshold
    assert not any(isinstance(v, xr.DataArray) for v in catalogue.values())
    assert_close(np.asarray(dask.compute(catalogue["area"])[0]), plain.catalogue["area"])


# -- apply and pipeline ----------------------------------------------------------------------------


@pytest.mark.parametrize("backing", BACKINGS)
def test_apply_blockwise_and_reduction(backing):
    a = _image(backing)
    row = np.arange(a.sizes["x"], dtype=np.float64)
    _check_like(chunkernels.apply(a, "broadcast_add", row), a, a.values + row)
    operand = xr.DataArray(row, dims="x")  # the input's last dim: broadcasts by position
    _check_like(chunkernels.apply(a, "broadcast_add", operand), a, a.values + row)
    mse = chunkernels.apply(a, "mean_squared_error", a * 0)
    assert not isinstance(mse, xr.DataArray)  # a reduction: its plain value
    assert_close(np.asarray(mse), np.mean(a.values ** 2))


def test_apply_refuses_an_operand_on_other_dims():
    a = _image()
    with pytest.raises(ValueError, match=r"operands has dims \('y',\)"):
        chunkernels.apply(a, "broadcast_add", xr.DataArray(np.zeros(24), dims="y"))


@pytest.mark.parametrize("backing", BACKINGS)
def test_pipeline(backing):
    a = _image(backing)
    p = chunkernels.pipeline([("gaussian_filter", {"sigma": 1.0}), ("threshold", {"value": 0.5})])
    expected = ndi.gaussian_filter(a.values, 1.0) > 0.5
    _check_like(p(a), a, expected)
    _check_like(p.apply(a, allow_rechunk=True), a, expected)


# -- the rules on their own ------------------------------------------------------------------------


@pytest.mark.parametrize("values, where, expected", [
    (np.array([0.0, 0.5, 1.0]), [-0.5, 0.25, 3.0], [-0.25, 0.125, 1.5]),
    (np.linspace(-90, 90, 721, dtype=np.float32), [0.5], np.array([-89.875], np.float32)),
    (np.array([10, 20, 30]), [0, 2, 4], np.array([10, 30, 50])),  # whole positions: integers
    (np.array([10, 20, 30]), [0.5], [15.0]),
    (np.array([5, 3, 1], dtype=np.uint8), [-1, 0], np.array([7, 5], np.uint8)),
    (np.array([5, 3, 1], dtype=np.uint8), [3], [-1.0]),  # below uint8: a float, not a wrap
    (np.array(["2024-01-01", "2024-01-03"], dtype="datetime64[D]"), [0.5, 2],
     np.array(["2024-01-02", "2024-01-05"], dtype="datetime64[D]")),
])
def test_resampled_regular_coordinates(values, where, expected):
    got = _xarray.resampled(values, where)
    assert got.dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("values", [
    np.array([0.0, 1.0, 3.0]), np.array([1.0]), np.array([0.0, np.nan, 2.0]),
    np.array([0.0, 1.0, np.inf]), np.array(["a", "b"]), np.array([0, 1, 3]),
    np.array(["2024-01-01", "NaT"], dtype="datetime64[D]"),
])
def test_irregular_coordinates_are_not_resampled(values):
    assert _xarray.resampled(values, [0.5]) is None


def test_chunkernels_does_not_import_xarray():
    """Neither importing chunkernels nor calling it on NumPy arrays imports xarray. (Dask may:
    ``import dask.array`` loads xarray where both are installed, through Dask's own hooks.)"""
    code = ("import sys, numpy, chunkernels, chunkernels.ndimage, chunkernels.signal, "
            "chunkernels.metrics, chunkernels.sources, chunkernels.interop; "
            "x = numpy.ones((8, 8)); chunkernels.ndimage.gaussian_filter(x, 1); "
            "chunkernels.ndimage.zoom(x, 2); chunkernels.ndimage.label(x); "
            "chunkernels.apply(x, 'threshold', value=0.5); print('xarray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"


# -- CuPy-backed DataArrays ------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backing", ["cupy", "dask-cupy"])
def test_cupy_backed_dataarrays(backing):
    cp = chunkernels.cuda.cupy()
    host = _image()
    device = host.copy(data=cp.asarray(host.values))
    a = device.chunk({"y": 10, "x": 12}) if backing == "dask-cupy" else device
    if backing == "dask-cupy":
        assert isinstance(a.data._meta, cp.ndarray)
    got = ndimage.gaussian_filter(a, 2.0)
    assert isinstance(got, xr.DataArray) and got.dims == a.dims and got.attrs == a.attrs
    inner = got.data.compute() if backing == "dask-cupy" else got.data
    assert isinstance(inner, cp.ndarray)
    assert_close(cp.asnumpy(inner), ndi.gaussian_filter(host.values, 2.0))
    xr.testing.assert_identical(got.coords.to_dataset(), a.coords.to_dataset())
    zoomed = ndimage.zoom(a, (1, 2), order=1)
    assert isinstance(zoomed, xr.DataArray) and zoomed.sizes["x"] == 60
    np.testing.assert_allclose(zoomed.x.values, np.linspace(0, 58, 60))
    labels, count = ndimage.label(a > 0.7)
    assert isinstance(labels, xr.DataArray) and not isinstance(count, xr.DataArray)
    total = ndimage.sum_labels(a, labels, [1, 2])
    assert not isinstance(total, xr.DataArray)
    mask = sources.threshold(a, 0.5)
    inner = mask.data.compute() if backing == "dask-cupy" else mask.data
    assert isinstance(inner, cp.ndarray)
    np.testing.assert_array_equal(cp.asnumpy(inner), host.values > 0.5)


@pytest.mark.gpu
def test_cupy_dataarray_output_must_be_on_the_device():
    cp = chunkernels.cuda.cupy()
    a = xr.DataArray(cp.ones((8, 8)), dims=("y", "x"))
    with pytest.raises(TypeError, match="on the input's device"):
        ndimage.sobel(a, output=xr.DataArray(np.zeros((8, 8)), dims=("y", "x")))
    out = xr.DataArray(cp.zeros((8, 8)), dims=("y", "x"))
    assert ndimage.sobel(a, output=out) is out
