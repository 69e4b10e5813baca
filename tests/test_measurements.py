"""chunkernels.ndimage's measurements against scipy.ndimage: scipy's own test cases on every array
type, random label images with many labels in several chunkings, index variants, dtypes and
layouts, chunking invariance, measure(), and the errors.

NumPy input runs scipy itself, so on NumPy these tests check the delegation and the argument
checks; Dask arrays of NumPy chunks run the kernel's CPU statistics and the Dask graph; the
``gpu`` variants run the CUDA kernel on CuPy arrays and on Dask arrays of CuPy chunks.
"""

from __future__ import annotations

import functools
import sys
import warnings

import dask
import dask.array as da
from dask.delayed import Delayed

import numpy as np
import pytest
import scipy.ndimage as ndi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_chunking_invariance import partitions

from chunkernels import cuda, ndimage
from chunkernels.testing import random_array, to_device_view

# scipy divides by zero for labels absent from the image (NaN means, centres): expected here
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
GPU = pytest.mark.gpu
ALL = ["numpy", "dask", pytest.param("cupy", marks=GPU), pytest.param("dask-cupy", marks=GPU)]
CHUNKED = ["dask", pytest.param("cupy", marks=GPU), pytest.param("dask-cupy", marks=GPU)]
TYPES = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float32",
         "float64")
VALUE_FUNCTIONS = ("sum_labels", "mean", "variance", "standard_deviation", "minimum", "maximum",
                   "median")
POSITION_FUNCTIONS = ("minimum_position", "maximum_position", "center_of_mass")


def on(backend, a, chunks=2):
    """``a`` as the backend's array (Dask: chunks of ``chunks``; CuPy: strides kept)."""
    a = np.asarray(a)
    if backend in ("cupy", "dask-cupy"):
        a = to_device_view(a)
    if backend.startswith("dask"):
        a = da.from_array(a, chunks=chunks, asarray=False)
    return a


def host(result):
    """A result's values on the host: Dask computed, CuPy copied, containers kept."""
    if isinstance(result, (list, tuple)):
        return type(result)(host(r) for r in result)
    if dask.is_dask_collection(result):
        result = result.compute()
    return result.get() if cuda.is_cupy_array(result) else result


def positions(result):
    """Positions as scipy gives them: a tuple, or a list of tuples, of ints."""
    result = host(result)
    if isinstance(result, list):
        return [tuple(int(c) for c in p) for p in result]
    if isinstance(result, tuple):
        return tuple(int(c) for c in result)
    result = np.asarray(result)
    return tuple(map(int, result)) if result.ndim == 1 else [tuple(map(int, r)) for r in result]


def close(got, expected, rtol=1e-10, err_msg=""):
    got, expected = np.asarray(host(got)), np.asarray(expected)
    assert got.shape == expected.shape, f"shape {got.shape} != {expected.shape}. {err_msg}"
    assert got.dtype == expected.dtype, f"dtype {got.dtype} != {expected.dtype}. {err_msg}"
    if expected.dtype.kind in "fc":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol, err_msg=err_msg)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=err_msg)


# -- scipy's test cases (scipy/ndimage/tests/test_measurements.py), on every array type --------------


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", TYPES)
def test_sum_scipy_cases(backend, dtype):
    def a(values, d=dtype):
        return on(backend, np.asarray(values, d))

    assert host(ndimage.sum(a([]))) == 0
    assert host(ndimage.sum(a(np.zeros((0, 4))))) == 0
    assert host(ndimage.sum(a(1))) == 1
    assert host(ndimage.sum(a([1, 2]))) == 3
    assert host(ndimage.sum(a([[1, 2], [3, 4]]))) == 10
    assert host(ndimage.sum(a([]), labels=a([], bool))) == 0
    assert host(ndimage.sum(a(np.zeros((0, 4))), labels=a(np.ones((0, 4)), bool))) == 0
    assert host(ndimage.sum(a([1, 2]), labels=a([1, 0], bool))) == 1
    assert host(ndimage.sum(a([[1, 2], [3, 4]]), labels=a([1, 0], bool))) == 4
    assert host(ndimage.sum(a([[1, 2], [3, 4]]), labels=a([1, 2], "int8"), index=2)) == 6
    labels = a([[1, 2], [2, 4]], "int8")
    expected = np.array([4.0, 0.0, 5.0])
    close(ndimage.sum(a([[1, 2], [3, 4]]), labels=labels, index=np.array([4, 8, 2])), expected)
    close(ndimage.sum_labels(a([[1, 2], [3, 4]]), labels, np.array([4, 8, 2])), expected)


@pytest.mark.parametrize("backend", ALL)
def test_bool_input_scipy_cases(backend):
    x = on(backend, np.array([[1, 2], [3, 4]], bool))
    labels = on(backend, np.array([1, 0], bool))
    assert host(ndimage.sum(x, labels=labels)) == 2
    assert host(ndimage.mean(x, labels=labels)) == 1.0
    x = on(backend, np.array([[2, 2], [2, 4]], bool))
    assert host(ndimage.minimum(x, labels=labels)) == 1
    assert host(ndimage.maximum(x, labels=labels)) == 1
    assert host(ndimage.variance(on(backend, np.array([1, 0], bool)))) == 0.25
    assert host(ndimage.standard_deviation(on(backend, np.array([1, 0], bool)))) == 0.5
    close(ndimage.median(on(backend, np.array([1, 1], bool)), labels=on(backend, np.ones(2)),
                         index=np.array([1])), np.array([1.0]))


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", TYPES)
def test_mean_minimum_maximum_scipy_cases(backend, dtype):
    x = on(backend, np.array([[1, 2], [3, 4]], dtype))
    assert host(ndimage.mean(x, labels=on(backend, np.array([1, 0], bool)))) == 2.0
    assert host(ndimage.mean(x, labels=on(backend, np.array([1, 2])), index=2)) == 3.0
    with np.errstate(all="ignore"):
        got = host(ndimage.mean(x, labels=on(backend, np.array([[1, 2], [2, 4]], "int8")),
                                index=np.array([4, 8, 2])))
    assert got[0] == 4.0 and np.isnan(got[1]) and got[2] == 2.5
    assert host(ndimage.minimum(x, labels=on(backend, np.array([1, 0], bool)))) == 1
    assert host(ndimage.minimum(x, labels=on(backend, np.array([1, 2])), index=2)) == 2
    labels = on(backend, np.array([[1, 2], [2, 3]]))
    close(ndimage.minimum(x, labels=labels, index=np.array([2, 3, 8])),
          np.array([2, 4, 0], dtype))
    assert host(ndimage.maximum(x, labels=on(backend, np.array([1, 0], bool)))) == 3
    assert host(ndimage.maximum(x, labels=on(backend, np.array([1, 2])), index=2)) == 4
    close(ndimage.maximum(x, labels=labels, index=np.array([2, 3, 8])),
          np.array([3, 4, 0], dtype))
    assert host(ndimage.maximum(on(backend, np.array([-3, -2, -1])))) == -1


@pytest.mark.parametrize("backend", ALL)
def test_median_scipy_cases(backend):
    a = on(backend, np.array([[1, 2, 0, 1], [5, 3, 0, 4], [0, 0, 0, 7], [9, 3, 0, 0]]))
    labels = on(backend, np.array([[1, 1, 0, 2], [1, 1, 0, 2], [0, 0, 0, 2], [3, 3, 0, 0]]))
    close(ndimage.median(a, labels=labels, index=np.array([1, 2, 3])), np.array([2.5, 4.0, 6.0]))
    assert host(ndimage.median(a)) == 1.0
    assert host(ndimage.median(a, labels=labels)) == 3.0
    # gh-12836: no integer overflow
    close(ndimage.median(on(backend, np.array([65, 70], np.int8)), labels=on(backend, np.ones(2)),
                         index=np.array([1])), np.array([67.5]))


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", TYPES)
def test_variance_standard_deviation_scipy_cases(backend, dtype):
    def a(values):
        return on(backend, np.asarray(values, dtype))

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
        assert np.isnan(host(ndimage.variance(a([]))))
        assert np.isnan(host(ndimage.standard_deviation(a([]))))
    for fn, root in ((ndimage.variance, 1), (ndimage.standard_deviation, 0.5)):
        assert host(fn(a([1]))) == 0.0
        assert host(fn(a([1, 3]))) == 1.0
        assert host(fn(a([1, 3, 8]), on(backend, [2, 2, 3]), 2)) == 1.0
        close(fn(a([1, 3, 8, 10, 8]), on(backend, [2, 2, 3, 3, 4]), np.array([2, 3, 4])),
              np.array([1.0, 1.0, 0.0]))
    if dtype.startswith("float"):
        close(ndimage.standard_deviation(a([-0.00619519]), on(backend, [1]), np.array([1])),
              np.array([0.0]), rtol=1e-7)


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", TYPES)
def test_positions_scipy_cases(backend, dtype):
    x = on(backend, np.array([[5, 4, 2, 5], [3, 7, 0, 2], [1, 5, 1, 1]], dtype))
    assert positions(ndimage.minimum_position(on(backend, np.array([[1, 2], [3, 4]], dtype)),
                                              labels=on(backend, np.array([1, 0], bool)))) == (0, 0)
    assert positions(ndimage.minimum_position(x)) == (1, 2)
    assert positions(ndimage.minimum_position(x, on(backend, [1, 2, 0, 4]))) == (2, 0)
    assert positions(ndimage.minimum_position(x, on(backend, [1, 2, 3, 4]), 2)) == (0, 1)
    assert positions(ndimage.minimum_position(x, on(backend, [1, 2, 3, 4]),
                                              np.array([2, 3]))) == [(0, 1), (1, 2)]
    y = on(backend, np.array([[5, 4, 2, 5], [3, 7, 8, 2], [1, 5, 1, 1]], dtype))
    assert positions(ndimage.maximum_position(on(backend, np.array([[1, 2], [3, 4]], dtype)),
                                              labels=on(backend, np.array([1, 0], bool)))) == (1, 0)
    assert positions(ndimage.maximum_position(y)) == (1, 2)
    assert positions(ndimage.maximum_position(y, on(backend, [1, 2, 0, 4]))) == (1, 1)
    assert positions(ndimage.maximum_position(y, on(backend, [1, 2, 0, 4]), 1)) == (0, 0)
    assert positions(ndimage.maximum_position(y, on(backend, [1, 2, 0, 4]),
                                              np.array([1, 2]))) == [(0, 0), (1, 1)]
    assert positions(ndimage.maximum_position(y, on(backend, [1.0, 2.5, 0.0, 4.5]),
                                              np.array([1.0, 4.5]))) == [(0, 0), (0, 3)]


@pytest.mark.parametrize("backend", ALL)
def test_bool_positions_scipy_cases(backend):
    x = on(backend, np.array([[5, 4, 2, 5], [3, 7, 0, 2], [1, 5, 1, 1]], bool))
    assert positions(ndimage.minimum_position(x)) == (1, 2)
    x = on(backend, np.array([[5, 4, 2, 5], [3, 7, 1, 2], [1, 5, 1, 1]], bool))
    assert positions(ndimage.minimum_position(x)) == (0, 0)
    x = on(backend, np.array([[5, 4, 2, 5], [3, 7, 8, 2], [1, 5, 1, 1]], bool))
    assert positions(ndimage.maximum_position(x)) == (0, 0)


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", TYPES)
def test_extrema_scipy_cases(backend, dtype):
    small = on(backend, np.array([[1, 2], [3, 4]], dtype))
    big = on(backend, np.array([[5, 4, 2, 5], [3, 7, 8, 2], [1, 5, 1, 1]], dtype))
    for x, labels, index in ((small, on(backend, np.array([1, 0], bool)), None),
                             (small, on(backend, [1, 2]), 2),
                             (small, on(backend, [[1, 2], [2, 3]]), np.array([2, 3, 8])),
                             (big, on(backend, [1, 2, 0, 4]), np.array([1, 2]))):
        lo, hi, lo_at, hi_at = ndimage.extrema(x, labels, index)
        close(lo, host(ndimage.minimum(x, labels, index)))
        close(hi, host(ndimage.maximum(x, labels, index)))
        assert positions(lo_at) == positions(ndimage.minimum_position(x, labels, index))
        assert positions(hi_at) == positions(ndimage.maximum_position(x, labels, index))


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", TYPES)
def test_center_of_mass_scipy_cases(backend, dtype):
    for values, expected in (([[1, 0], [0, 0]], (0.0, 0.0)), ([[0, 0], [1, 0]], (1.0, 0.0)),
                             ([[0, 1], [0, 0]], (0.0, 1.0)), ([[0, 0], [0, 1]], (1.0, 1.0)),
                             ([[1, 1], [1, 1]], (0.5, 0.5))):
        got = host(ndimage.center_of_mass(on(backend, np.array(values, dtype))))
        assert tuple(float(c) for c in got) == expected


@pytest.mark.parametrize("backend", ALL)
def test_center_of_mass_bool_scipy_cases(backend):
    def com(*args):
        return host(ndimage.center_of_mass(*args))

    assert tuple(map(float, com(on(backend, np.array([[1, 2], [3, 1]], bool))))) == (0.5, 0.5)
    assert tuple(map(float, com(on(backend, np.array([[1, 2], [3, 1]], bool)),
                                on(backend, [1, 0])))) == (0.5, 0.0)
    assert tuple(map(float, com(on(backend, np.array([[5, 2], [3, 1]], bool)),
                                on(backend, [1, 2]), 2))) == (0.5, 1.0)
    got = com(on(backend, np.array([[1, 2], [1, 1]], bool)), on(backend, [1, 2]),
              np.array([1, 2]))
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), [(0.5, 0.0), (0.5, 1.0)])


@pytest.mark.parametrize("backend", ALL)
def test_histogram_scipy_cases(backend):
    np.testing.assert_array_equal(host(ndimage.histogram(on(backend, np.arange(10)), 0, 10, 10)),
                                  np.ones(10))
    labels = on(backend, [1, 1, 1, 1, 2, 2, 2, 2])
    x = on(backend, [1, 1, 3, 4, 3, 3, 3, 3])
    np.testing.assert_array_equal(host(ndimage.histogram(x, 0, 4, 5, labels, 1)),
                                  [0, 2, 0, 1, 1])
    out = host(ndimage.histogram(on(backend, [1, 1, 3, 4, 3, 5, 3, 3]), 0, 4, 5,
                                 on(backend, [1, 0, 1, 1, 2, 2, 2, 2]), (1, 2)))
    np.testing.assert_array_equal(host(out[0]), [0, 1, 0, 1, 1])
    np.testing.assert_array_equal(host(out[1]), [0, 0, 0, 3, 0])


@pytest.mark.parametrize("backend", ALL)
def test_stat_funcs_2d_scipy_case(backend):
    a = on(backend, np.array([[5, 6, 0, 0, 0], [8, 9, 0, 0, 0], [0, 0, 0, 3, 5]]))
    lbl = on(backend, np.array([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 0, 2, 2]]))
    index = np.array([1, 2])
    close(ndimage.mean(a, labels=lbl, index=index), np.array([7.0, 4.0]))
    close(ndimage.variance(a, labels=lbl, index=index), np.array([2.5, 1.0]))
    close(ndimage.standard_deviation(a, labels=lbl, index=index), np.sqrt([2.5, 1.0]))
    close(ndimage.median(a, labels=lbl, index=index), np.array([7.0, 4.0]))
    close(ndimage.minimum(a, labels=lbl, index=index), np.array([5, 3]))
    close(ndimage.maximum(a, labels=lbl, index=index), np.array([9, 5]))


FIND_OBJECTS = [
    (np.ones([], np.int64), [()]),
    (np.zeros([], np.int64), []),
    (np.ones([1], np.int64), [(slice(0, 1),)]),
    (np.zeros([1], np.int64), []),
    (np.ones([5], np.int64), [(slice(0, 5),)]),
    (np.array([1, 0, 2, 2, 0, 3]), [(slice(0, 1),), (slice(2, 4),), (slice(5, 6),)]),
    (np.zeros((6, 6), np.int64), []),
    (np.array([[1, 0, 0, 0, 0, 0], [0, 0, 2, 2, 0, 0], [0, 0, 2, 2, 2, 0], [3, 3, 0, 0, 0, 0],
               [3, 3, 0, 0, 0, 0], [0, 0, 0, 4, 4, 0]]),
     [(slice(0, 1), slice(0, 1)), (slice(1, 3), slice(2, 5)), (slice(3, 5), slice(0, 2)),
      (slice(5, 6), slice(3, 5))]),
    (np.array([[1, 0, 0, 0, 0, 0], [0, 0, 2, 2, 0, 0], [0, 0, 2, 2, 2, 0], [0, 0, 0, 0, 0, 0],
               [0, 0, 0, 0, 0, 0], [0, 0, 0, 4, 4, 0]]),
     [(slice(0, 1), slice(0, 1)), (slice(1, 3), slice(2, 5)), None, (slice(5, 6), slice(3, 5))]),
]


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("case", range(len(FIND_OBJECTS)))
def test_find_objects_scipy_cases(backend, case):
    data, expected = FIND_OBJECTS[case]
    assert host(ndimage.find_objects(on(backend, data))) == expected


@pytest.mark.parametrize("backend", ALL)
def test_find_objects_max_label(backend):
    a = np.array([[2, 2, 2, 0, 0, 3], [2, 2, 2, 0, 0, 0], [0, 0, 1, 1, 0, 0],
                  [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]])
    for max_label in (0, 1, 2, 5):
        got = ndimage.find_objects(on(backend, a), max_label=max_label)
        if backend.startswith("dask"):
            assert isinstance(got, Delayed)
        assert host(got) == ndi.find_objects(a, max_label=max_label)
    assert host(ndimage.find_objects(on(backend, a == 1), max_label=2)) == \
        ndi.find_objects((a == 1).astype(int), max_label=2)


@pytest.mark.parametrize("backend", ALL)
def test_labeled_comprehension_scipy_examples(backend):
    a = np.array([[1, 2, 0, 0], [5, 3, 0, 4], [0, 0, 0, 7], [9, 3, 0, 0]])
    lbl, n = ndi.label(a)
    x, labels = on(backend, a), on(backend, lbl)
    close(ndimage.labeled_comprehension(x, labels, np.arange(1, n + 1), np.mean, float, 0),
          np.array([2.75, 5.5, 6.0]))
    close(ndimage.labeled_comprehension(x, labels, np.arange(1, n + 2), np.mean, float, -1),
          np.array([2.75, 5.5, 6.0, -1.0]))

    def fn(val, pos):
        return val.sum() if pos.sum() % 2 == 0 else -val.sum()

    close(ndimage.labeled_comprehension(x, labels, np.arange(1, n + 2), fn, float, 0, True),
          np.array([11.0, 11.0, -12.0, 0.0]))
    seen = []
    ndimage.labeled_comprehension(x, labels, [1], lambda v, p: seen.append((host(v), host(p))) or 0,
                                  float, 0, True)
    if not backend.startswith("dask"):  # Dask runs func when computed
        np.testing.assert_array_equal(seen[0][0], [1, 2, 5, 3])  # raster order
        np.testing.assert_array_equal(seen[0][1], [0, 1, 4, 5])


# -- random label images with many labels ------------------------------------------------------------


def labelled(rng, shape, dtype="float64"):
    """Values of ``dtype`` and a scipy label image of thresholded noise (many small labels)."""
    x = random_array(rng, shape, dtype)
    labels, n = ndi.label(rng.standard_normal(shape) > 0.3)
    return x, labels, n


def indexes(n):
    """Index variants: none, scalars present and absent, every label, and a list in any order
    with repeats, absent labels, the background and negative labels; integers as floats (a
    float that is no integer is refused with integer labels: test_float_index_...)."""
    return {
        "none": None,
        "scalar": min(3, n),
        "absent-scalar": n + 7,
        "all": np.arange(1, n + 1),
        "range": range(1, n + 1),
        "list": [n, 2, 2, 0, n + 5, 1, -4],
        "float-list": np.array([1.0, 3.0, 2.0, -4.0, 0.0]),
        "2d": np.array([[1, 2], [n + 1, 0]]),
    }


def _scipy(fn, x, labels, index):
    return getattr(ndi, fn)(x, labels, index)


def first_positions(x, labels, index, which):
    """Positions of the first minimum / maximum in raster order (chunkernels' rule for ties;
    scipy's order among equal values of a list of labels follows its sort)."""
    single = index is None or np.isscalar(index)
    entries = [index] if single else np.ravel(index)
    out = []
    for label in entries:
        mask = labels > 0 if label is None else labels == label
        values = x[mask]
        if not values.size:
            out.append((0,) * x.ndim)
            continue
        at = np.flatnonzero(mask)[np.argmin(values) if which == "min" else np.argmax(values)]
        out.append(tuple(int(c) for c in np.unravel_index(at, x.shape)))
    return out[0] if single else out


def _raises_for_empty(fn, index, n):
    return fn in ("minimum", "maximum", "minimum_position", "maximum_position", "extrema") and \
        np.isscalar(index) and index > n


@pytest.mark.parametrize("backend", CHUNKED)
@pytest.mark.parametrize("fn", VALUE_FUNCTIONS + POSITION_FUNCTIONS + ("extrema",))
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8", "bool"])
def test_random_labels_match_scipy(backend, fn, dtype):
    rng = np.random.default_rng(7)
    x, labels, n = labelled(rng, (37, 29), dtype)
    tol = 1e-5 if dtype == "float32" else 1e-10
    for name, index in indexes(n).items():
        if _raises_for_empty(fn, index, n):
            with pytest.raises(ValueError, match="zero-size array"):
                host(getattr(ndimage, fn)(on(backend, x, (11, 7)), on(backend, labels, (11, 7)),
                                          index))
            continue
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = _scipy(fn, x, labels, index)
        for chunks in ((37, 29), (11, 7), (5, 29)):
            got = getattr(ndimage, fn)(on(backend, x, chunks), on(backend, labels, chunks), index)
            where = f"{fn} {dtype} index={name} chunks={chunks}"
            if fn == "extrema":
                close(got[0], np.asarray(expected[0]), tol, where)
                close(got[1], np.asarray(expected[1]), tol, where)
                assert positions(got[2]) == first_positions(x, labels, index, "min"), where
                assert positions(got[3]) == first_positions(x, labels, index, "max"), where
            elif fn in ("minimum_position", "maximum_position"):
                assert positions(got) == first_positions(x, labels, index, fn[:3]), where
            else:
                close(got, np.asarray(expected), tol, where)


def _expected_areas(labels, index):
    """Elements per label, counted directly: what scipy's sum_labels of ones gives, as int64."""
    if index is None:
        return np.int64(np.count_nonzero(labels > 0))
    values = np.arange(index.start, index.stop, index.step) if isinstance(index, range) \
        else np.asarray(index)
    counts = [np.count_nonzero(labels == v) for v in values.reshape(-1)]
    return np.array(counts, dtype=np.int64).reshape(values.shape)[()]


@pytest.mark.parametrize("backend", ALL)
def test_area(backend):
    """dask-image's area: elements per label, int64, any index, any chunking; the input's size
    without labels."""
    rng = np.random.default_rng(12)
    x, labels, n = labelled(rng, (37, 29), "float32")
    scalar = backend == "numpy"
    for name, index in indexes(n).items():
        expected = _expected_areas(labels, index)
        for chunks in ((37, 29), (11, 7), (5, 29)):
            got = ndimage.area(on(backend, x, chunks), on(backend, labels, chunks), index)
            close(got, expected, err_msg=f"index={name} chunks={chunks}")
            assert isinstance(got, np.int64) == (scalar and np.ndim(expected) == 0)
        # the values are never read: the counts are those of the labels alone
        close(ndimage.area(on(backend, labels), on(backend, labels), index), expected)
    close(ndimage.area(on(backend, x), index=[1, 2]), np.int64(x.size))
    # dask-image's docstring example, and labels that broadcast to the input
    image = rng.random((3, 3))
    example = np.array([[1, 1, 0], [1, 0, 3], [0, 7, 0]])
    close(ndimage.area(on(backend, image), on(backend, example, (1, 3))), np.int64(5))
    close(ndimage.area(on(backend, image), on(backend, example, (1, 3)), [0, 1, 2, 3]),
          np.array([4, 3, 0, 1], dtype=np.int64))
    close(ndimage.area(on(backend, image), on(backend, example[:1]), [0, 1]),
          np.array([3, 6], dtype=np.int64))
    close(ndimage.area(on(backend, np.zeros((0, 3))), on(backend, np.zeros((0, 3), int)), [1, 2]),
          np.zeros(2, dtype=np.int64))
    with pytest.raises(ValueError, match="same shape"):
        ndimage.area(on(backend, image), on(backend, np.ones((2, 3), int)))


@pytest.mark.parametrize("backend", CHUNKED)
def test_result_types(backend):
    """CuPy: cupyx's containers; Dask: lazy arrays (dask-image's), shaped as documented."""
    rng = np.random.default_rng(3)
    x, labels, n = labelled(rng, (20, 16))
    dx, dl = on(backend, x, (7, 16)), on(backend, labels, (7, 16))
    index = np.arange(1, n + 1)
    lazy = backend.startswith("dask")
    module = "cupy" if "cupy" in backend else "numpy"
    for fn in ("sum_labels", "mean", "minimum", "median"):
        got = getattr(ndimage, fn)(dx, dl, index)
        assert isinstance(got, da.Array) == lazy and got.shape == (n,)
        assert type(got._meta if lazy else got).__module__.split(".")[0] == module
        assert getattr(ndimage, fn)(dx, dl, 2).shape == ()
    com = ndimage.center_of_mass(dx, dl, index)
    assert com.shape == (n, 2) and isinstance(com, da.Array) == lazy
    single = ndimage.center_of_mass(dx, dl, 1)
    assert (single.shape == (2,)) if lazy else (isinstance(single, tuple) and len(single) == 2)
    at = ndimage.minimum_position(dx, dl, index)
    if lazy:
        assert at.shape == (n, 2) and at.dtype == np.int64
        assert ndimage.maximum_position(dx, dl).shape == (2,)
    else:
        assert isinstance(at, list) and isinstance(at[0], tuple)
        assert all(isinstance(c, np.integer) for c in at[0])


def test_dask_graph_is_one_task_per_chunk_plus_combine():
    rng = np.random.default_rng(4)
    x, labels, n = labelled(rng, (40, 30))
    dx = da.from_array(x, chunks=(10, 10))
    dl = da.from_array(labels, chunks=(10, 10)).map_blocks(lambda b: b + 0)  # lazy labels
    z = ndimage.sum_labels(dx, dl, np.arange(1, n + 1))
    graph = dict(z.__dask_graph__())
    ours = [k for k in graph if isinstance(k, tuple) and k[0].startswith("label_statistics")]
    assert len(ours) == dx.npartitions + 1
    close(z, ndi.sum_labels(x, labels, np.arange(1, n + 1)))


@pytest.mark.parametrize("backend", CHUNKED)
@pytest.mark.parametrize("layout", ["fortran", "sliced", "reversed", "transposed", "broadcast"])
def test_layouts(backend, layout):
    rng = np.random.default_rng(5)
    x, labels, n = labelled(rng, (45, 38), "float32")
    views = {
        "fortran": (np.asfortranarray(x), np.asfortranarray(labels)),
        "sliced": (x[3::2, 1:-4], labels[3::2, 1:-4]),
        "reversed": (x[::-1, ::-2], labels[::-1, ::-2]),
        "transposed": (x.T, labels.T),
        "broadcast": (x, (labels[:1] > 0).astype(np.int32) + np.arange(38) % 3),
    }
    vx, vl = views[layout]
    index = np.arange(0, n + 2)
    for fn in ("sum_labels", "variance", "maximum", "minimum_position", "center_of_mass"):
        expected = getattr(ndi, fn)(vx, vl, index)
        got = getattr(ndimage, fn)(on(backend, vx, 9), on(backend, vl, 9), index)
        if fn == "minimum_position":
            assert positions(got) == positions(expected), layout
        else:
            close(got, np.asarray(expected), 1e-5, f"{fn} {layout}")


@pytest.mark.parametrize("backend", CHUNKED)
def test_zero_size_and_size_one_axes(backend):
    x, labels = np.zeros((0, 5), np.float32), np.zeros((0, 5), np.int32)
    assert host(ndimage.sum_labels(on(backend, x), on(backend, labels))) == 0
    assert np.isnan(host(ndimage.mean(on(backend, x), on(backend, labels), 1)))
    with pytest.raises(ValueError, match="zero-size array to reduction operation minimum"):
        host(ndimage.sum_labels(on(backend, x), on(backend, labels), [1, 2]))
    with pytest.raises(ValueError, match="zero-size array to reduction operation maximum"):
        host(ndimage.maximum(on(backend, x), on(backend, labels)))
    assert host(ndimage.find_objects(on(backend, np.zeros((0, 5), np.int64)), max_label=2)) == \
        [None, None]
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 9, 1))
    labels = rng.integers(0, 4, (1, 9, 1))
    for fn in ("sum_labels", "center_of_mass", "maximum_position", "median"):
        expected = getattr(ndi, fn)(x, labels, [1, 2, 3])
        got = getattr(ndimage, fn)(on(backend, x), on(backend, labels), [1, 2, 3])
        if fn == "maximum_position":
            assert positions(got) == positions(expected)
        else:
            close(got, np.asarray(expected))
    assert host(ndimage.find_objects(on(backend, labels))) == ndi.find_objects(labels)
    close(ndimage.sum_labels(on(backend, np.array(2.5)), on(backend, np.array(1)), [1, 2]),
          np.array([2.5, 0.0]))


@pytest.mark.parametrize("backend", CHUNKED)
def test_nan_rules(backend):
    """A list of labels: minima skip NaN, maxima are NaN; a single region: both are NaN."""
    x = np.array([[np.nan, 1, 2, 5], [3, np.nan, 0.5, np.nan]])
    labels = np.array([[1, 1, 2, 2], [1, 1, 2, 2]])
    close(ndimage.minimum(on(backend, x), on(backend, labels), [1, 2]), np.array([1.0, 0.5]))
    close(ndimage.maximum(on(backend, x), on(backend, labels), [1, 2]),
          np.array([np.nan, np.nan]))
    assert np.isnan(host(ndimage.minimum(on(backend, x), on(backend, labels), 1)))
    close(ndimage.median(on(backend, x), on(backend, labels), [1, 2]),
          ndi.median(x, labels, [1, 2]))
    assert np.isnan(host(ndimage.median(on(backend, x), on(backend, labels), 2)))


@pytest.mark.parametrize("backend", CHUNKED)
def test_ties_go_to_the_first_in_raster_order(backend):
    x = np.array([[3, 1, 3, 1], [2, 3, 1, 3]])
    labels = np.ones_like(x)
    for chunks in ((2, 4), (1, 1), (2, 1)):
        assert positions(ndimage.minimum_position(on(backend, x, chunks), on(backend, labels, chunks),
                                                  [1])) == [(0, 1)]
        assert positions(ndimage.maximum_position(on(backend, x, chunks), on(backend, labels, chunks),
                                                  [1])) == [(0, 0)]


@pytest.mark.parametrize("backend", CHUNKED)
def test_median_absent_labels_take_scipys_fill(backend):
    x = np.array([5.0, 6, 7, 8])
    labels = np.array([2, 2, 3, 3])
    close(ndimage.median(on(backend, x), on(backend, labels), [1, 2, 3, 9]),
          ndi.median(x, labels, [1, 2, 3, 9]))


@pytest.mark.parametrize("backend", CHUNKED)
def test_histogram_and_comprehension_match_scipy(backend):
    rng = np.random.default_rng(8)
    x, labels, n = labelled(rng, (30, 24))
    for chunks in ((30, 24), (7, 5)):
        dx, dl = on(backend, x, chunks), on(backend, labels, chunks)
        np.testing.assert_array_equal(host(ndimage.histogram(dx, -2, 2, 9)),
                                      ndi.histogram(x, -2, 2, 9))
        np.testing.assert_array_equal(host(ndimage.histogram(dx, -2, 2, 9, dl)),
                                      ndi.histogram(x, -2, 2, 9, labels))
        np.testing.assert_array_equal(host(ndimage.histogram(dx, -2, 2, 9, dl, 2)),
                                      ndi.histogram(x, -2, 2, 9, labels, 2))
        got = host(ndimage.histogram(dx, -2, 2, 9, dl, [2, n + 4, 1]))
        want = ndi.histogram(x, -2, 2, 9, labels, [2, n + 4, 1])
        assert got[1] is None and want[1] is None
        # a scalar label absent: scipy's None for Dask (as dask-image), cupyx's zeros for CuPy
        assert ndi.histogram(x, -2, 2, 9, labels, n + 4) is None
        absent = host(ndimage.histogram(dx, -2, 2, 9, dl, n + 4))
        if backend.startswith("dask"):
            assert absent is None
        else:
            np.testing.assert_array_equal(absent, np.zeros(9, np.int64))
        for g, w in ((got[0], want[0]), (got[2], want[2])):
            np.testing.assert_array_equal(host(g), w)
        index = [3, n + 2, 1, 3]
        expected = ndi.labeled_comprehension(x, labels, index, lambda v, p: v.max() * p.min(),
                                             float, -1.0, True)
        close(ndimage.labeled_comprehension(dx, dl, index, lambda v, p: v.max() * p.min(), float,
                                            -1.0, True), expected)
        close(ndimage.labeled_comprehension(dx, dl, 2, np.median, float, 0.0),
              np.asarray(ndi.labeled_comprehension(x, labels, 2, np.median, float, 0.0)))
        # index=None: func's result over every labelled element, as it is: scipy ignores
        # out_dtype there (an int out_dtype once truncated the Dask result)
        for out_dtype in (np.int64, bool, float):
            want = ndi.labeled_comprehension(x, labels, None, np.sum, out_dtype, 0)
            got = host(ndimage.labeled_comprehension(dx, dl, None, np.sum, out_dtype, 0))
            np.testing.assert_allclose(np.asarray(host(got), dtype=np.float64), want,
                                       rtol=1e-12)
        # object results of one region compute to the object itself, as scipy returns it
        # (and dask-image's lazy results compute to it), not to a 0-d array holding it
        head = lambda v: v[:2] * 1  # noqa: E731 - an array of the input's module
        for index, lab in ((2, dl), (n + 9, dl), (None, dl), (None, None)):
            want = ndi.labeled_comprehension(x, None if lab is None else labels, index, head,
                                             object, None)
            got = host(ndimage.labeled_comprehension(dx, lab, index, head, object, None))
            if want is None:
                assert got is None
            else:
                got = host(got)
                assert got.dtype == want.dtype != object
                np.testing.assert_array_equal(got, want)
        # a tuple or list stays in its 0-d object array: Dask would read it as nested blocks
        pair = lambda v: (float(v.min()), float(v.max()))  # noqa: E731
        got = host(ndimage.labeled_comprehension(dx, dl, 2, pair, object, None))
        want = ndi.labeled_comprehension(x, labels, 2, pair, object, None)
        assert (got[()] if backend.startswith("dask") else got) == want


# -- chunking invariance ---------------------------------------------------------------------------


SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def labelled_chunks(draw):
    """Small integer values (exact sums), labels 0..5 and a chunking; shrinks to one chunk."""
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = rng.integers(-50, 50, shape).astype(np.float64)
    labels = rng.integers(0, 6, shape)
    return x, labels, tuple(draw(partitions(n)) for n in shape)


@SETTINGS
@given(labelled_chunks())
def test_chunking_invariance(case):
    x, labels, chunks = case
    dx, dl = da.from_array(x, chunks=chunks), da.from_array(labels, chunks=chunks)
    index = np.arange(0, 7)
    for fn in ("sum_labels", "mean", "minimum", "maximum", "center_of_mass", "median"):
        with np.errstate(all="ignore"):
            close(getattr(ndimage, fn)(dx, dl, index), np.asarray(getattr(ndi, fn)(x, labels, index)),
                  rtol=0, err_msg=f"{fn} chunks={chunks}")
    with np.errstate(all="ignore"):
        close(ndimage.variance(dx, dl, index), ndi.variance(x, labels, index))
    assert positions(ndimage.maximum_position(dx, dl, index)) == \
        first_positions(x, labels, index, "max")
    assert ndimage.find_objects(dl).compute() == ndi.find_objects(labels)
    whole = ndimage.measure(x, labels, as_frame=False)
    chunked = dict(zip(whole, dask.compute(*ndimage.measure(dx, dl, as_frame=False).values())))
    for key in whole:
        close(chunked[key], whole[key], err_msg=key)


# -- measure ---------------------------------------------------------------------------------------


def _measure_reference(x, labels, index):
    """measure's columns from scipy.ndimage, one function per property."""
    ref = {"label": np.asarray(index), "area": ndi.sum_labels(np.ones(x.shape), labels, index),
           "sum": ndi.sum_labels(x, labels, index), "mean": ndi.mean(x, labels, index),
           "min": ndi.minimum(x, labels, index), "max": ndi.maximum(x, labels, index)}
    ones = np.ones(x.shape)
    for a, c in enumerate(np.array(ndi.center_of_mass(ones, labels, index)).T):
        ref[f"centroid-{a}"] = c
    boxes = ndi.find_objects(labels)
    for a in range(x.ndim):
        ref[f"bbox-{a}"] = np.array([boxes[i - 1][a].start for i in index])
        ref[f"bbox-{a + x.ndim}"] = np.array([boxes[i - 1][a].stop for i in index])
    return ref


@pytest.mark.parametrize("backend", ["numpy", *CHUNKED])
def test_measure_matches_scipy(backend):
    rng = np.random.default_rng(9)
    x, labels, n = labelled(rng, (33, 27), "float32")
    expected = _measure_reference(x, labels, np.arange(1, n + 1))
    table = ndimage.measure(on(backend, x, (10, 9)), on(backend, labels, (10, 9)), as_frame=False)
    assert list(table) == ["label", "area", "sum", "mean", "min", "max", "centroid-0",
                           "centroid-1", "bbox-0", "bbox-1", "bbox-2", "bbox-3"]
    if backend.startswith("dask"):
        assert all(isinstance(c, da.Array) for c in table.values())
        assert np.isnan(table["area"].shape[0])  # the labels are found when computed
        table = dict(zip(table, dask.compute(*table.values())))
    for key, want in expected.items():
        want = np.asarray(want)
        got = np.asarray(host(table[key]))
        if key in ("area", "label") or key.startswith("bbox"):
            np.testing.assert_array_equal(got, want, err_msg=key)
            assert got.dtype.kind == "i", key
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=key)
    assert np.asarray(host(table["min"])).dtype == np.float32


@pytest.mark.parametrize("backend", ["numpy", *CHUNKED])
def test_measure_index_and_every_property(backend):
    rng = np.random.default_rng(10)
    x, labels, n = labelled(rng, (25, 21))
    index = [4, 1, n + 3, 1]
    props = tuple(ndimage._measurements.PROPERTIES)
    table = ndimage.measure(on(backend, x, 8), on(backend, labels, 8), index, props, as_frame=False)
    table = dict(zip(table, dask.compute(*table.values())) if backend.startswith("dask")
                 else table)
    np.testing.assert_array_equal(host(table["label"]), index)
    np.testing.assert_array_equal(host(table["area"]), ndi.sum_labels(np.ones(x.shape), labels,
                                                                      index))
    for prop in ("sum", "mean", "variance", "standard_deviation", "min", "max"):
        fn = {"min": "minimum", "max": "maximum", "sum": "sum_labels"}.get(prop, prop)
        with np.errstate(all="ignore"):
            close(table[prop], np.asarray(getattr(ndi, fn)(x, labels, index)), err_msg=prop)
    for prop, fn in (("min_position", ndi.minimum_position), ("max_position", ndi.maximum_position),
                     ("center_of_mass", ndi.center_of_mass)):
        with np.errstate(all="ignore"):
            want = np.array(fn(x, labels, index))
        for a in range(2):
            close(table[f"{prop}-{a}"], want[:, a], err_msg=prop)
    absent = 2  # entry of label n + 3: empty box, NaN centroid
    assert [int(host(table[f"bbox-{a}"])[absent]) for a in range(4)] == [0, 0, 0, 0]
    assert np.isnan(host(table["centroid-0"])[absent])


@pytest.mark.parametrize("backend", ["dask", pytest.param("dask-cupy", marks=GPU)])
@pytest.mark.parametrize("index", [None, [3, 1, 99]])
def test_measure_dask_columns_compute_in_one_task(backend, index):
    """The dict of lazy columns computes them all in one task from the shared table: the same
    arrays as dask.compute of every column, which takes two tasks a column."""
    import pickle

    from dask.core import flatten

    rng = np.random.default_rng(12)
    x, labels, _ = labelled(rng, (30, 26), "float32")
    props = ("label", "area", "sum", "center_of_mass", "bbox")
    table = ndimage.measure(on(backend, x, (10, 9)), on(backend, labels, (10, 9)), index, props,
                            as_frame=False)
    each = dict(zip(table, dask.compute(*table.values())))
    together = table.compute()
    on_host = table.compute(host=True)
    assert list(together) == list(table) == list(on_host)
    for key in table:
        assert type(together[key]) is type(each[key])
        assert type(on_host[key]) is np.ndarray and on_host[key].dtype == each[key].dtype
        np.testing.assert_array_equal(host(together[key]), host(each[key]), err_msg=key)
        np.testing.assert_array_equal(on_host[key], host(each[key]), err_msg=key)
    # the table's graph plus one task, against a task per column and its finalize
    from chunkernels import _graph
    from chunkernels.ndimage._measurements import _all_columns

    one = _graph.delayed_of_single_block(functools.partial(_all_columns, table._fns, False),
                                         table._table)
    table_tasks = len(table._table.__dask_graph__())
    assert len(one.__dask_graph__()) == table_tasks + 1
    from dask.highlevelgraph import HighLevelGraph

    columns = HighLevelGraph.merge(*(c.__dask_graph__() for c in table.values()))
    assert len(columns) == table_tasks + len(table)  # and dask.compute adds a finalize each
    again = pickle.loads(pickle.dumps(table))
    np.testing.assert_array_equal(host(again.compute()["sum"]), host(each["sum"]))
    assert len(list(flatten(next(iter(table.values())).__dask_keys__()))) == 1
    # the columns' names: one per column, the same for the same query, apart for another index
    names = [c.name for c in table.values()]
    assert len(set(names)) == len(names)
    same = ndimage.measure(on(backend, x, (10, 9)), on(backend, labels, (10, 9)), index, props,
                           as_frame=False)
    assert [c.name for c in same.values()] == names
    other = ndimage.measure(on(backend, x, (10, 9)), on(backend, labels, (10, 9)), [1, 3, 99],
                            props, as_frame=False)
    assert index is not None or other["label"].name != table["label"].name
    if index is not None:  # the same table (one sorted index), other columns: other names
        assert other._table.name == table._table.name
        assert other["label"].name != table["label"].name


def test_measure_frames(monkeypatch):
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(11)
    x, labels, _ = labelled(rng, (12, 10))
    frame = ndimage.measure(x, labels)
    assert isinstance(frame, pd.DataFrame) and list(frame.columns)[:2] == ["label", "area"]
    lazy = ndimage.measure(da.from_array(x, chunks=5), da.from_array(labels, chunks=5))
    assert isinstance(lazy, dict) and isinstance(lazy["area"], da.Array)
    computed = ndimage.measure(da.from_array(x, chunks=5), labels, as_frame=True)
    pd.testing.assert_frame_equal(computed, frame)
    monkeypatch.setitem(sys.modules, "pandas", None)  # pandas not importable
    assert isinstance(ndimage.measure(x, labels), dict)
    with pytest.raises(ImportError, match=r"as_frame=True\) needs pandas"):
        ndimage.measure(x, labels, as_frame=True)


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_errors(backend):
    x = on(backend, np.ones((3, 4)))
    with pytest.raises(ValueError, match="input and labels must have the same shape"):
        ndimage.sum_labels(x, on(backend, np.ones(5)), [1])
    with pytest.raises(ValueError, match="input and labels must have the same shape"):
        ndimage.center_of_mass(x, on(backend, np.ones((2, 4))))
    with pytest.raises(ValueError, match="index without defined labels"):
        ndimage.labeled_comprehension(x, None, [1], np.sum, float, 0)
    with pytest.raises(ValueError, match="index without defined labels"):
        ndimage.histogram(x, 0, 1, 3, None, 1)
    with pytest.raises(ValueError, match="without loss of precision"):
        ndimage.labeled_comprehension(x, on(backend, np.ones((3, 4), int)), [1.5], np.sum, float, 0)
    with pytest.raises(TypeError, match="labels must be a boolean, integer or float array"):
        ndimage.mean(x, on(backend, np.full((3, 4), "a")))
    with pytest.raises(TypeError, match="give max_label="):
        ndimage.find_objects(on(backend, np.ones(3)))
    assert host(ndimage.find_objects(on(backend, np.array([1.0, 2.5, 0])), 3)) == \
        ndi.find_objects(np.array([1.0, 2.5, 0]), 3)
    with pytest.raises(TypeError, match="Complex type not supported"):
        ndimage.find_objects(on(backend, np.ones(3, complex)))
    with pytest.raises(ValueError, match="unknown properties"):
        ndimage.measure(x, on(backend, np.ones((3, 4), int)), properties=("area", "perimeter"))
    with pytest.raises(ValueError, match="zero-size array to reduction operation minimum"):
        host(ndimage.minimum(x, on(backend, np.zeros((3, 4), int))))
    with pytest.raises(ValueError, match="zero-size array to reduction operation maximum"):
        host(ndimage.maximum_position(x, on(backend, np.ones((3, 4), int)), 2))


INDEX_FUNCTIONS = VALUE_FUNCTIONS + POSITION_FUNCTIONS + ("extrema",)


@pytest.mark.parametrize("backend", ["numpy", "dask"])
@pytest.mark.parametrize("fn", INDEX_FUNCTIONS)
@pytest.mark.parametrize("index, shown", [([1.5], "1.5"), ([2.0, np.nan], "nan"),
                                          (np.array([np.inf, 2.5, 1.0]), "2.5, inf")])
def test_float_index_that_is_no_integer_is_refused_with_integer_labels(backend, fn, index, shown):
    """Issue #20: a float index [1.5] gave 0 on Dask, where scipy gives label 1's sum (it
    truncates), and a NaN index was accepted where scipy raises. scipy truncates only when the
    labels are of an integer dtype it reads as intp and all lie in 0..labels.size (else it
    matches exactly, and some functions raise for NaN), so no lazy result can follow it: every
    array type refuses, before any work."""
    x = np.arange(12.0).reshape(3, 4)
    labels = np.array([[1, 1, 0, 2], [0, 2, 2, 0], [3, 0, 0, 1]])
    for dtype in ("int8", "uint16", "int32", "uint32", "int64"):
        with pytest.raises(ValueError, match=(
                rf"^{fn}: the index holds {shown}, not integer label numbers\. With labels of "
                rf"dtype {dtype}, scipy\.ndimage truncates such values \(2\.5 to label 2\) when "
                rf"every label lies in 0\.\.labels\.size, matches no label otherwise, and raises "
                rf"for NaN or infinity in some functions: the result would depend on the labels' "
                rf"values, so they are refused\. Give integer label numbers: index=numpy\.trunc"
                rf"\(index\)\.astype\(int\) for scipy's truncation, or leave those values out$")):
            getattr(ndimage, fn)(on(backend, x), on(backend, labels.astype(dtype)), index)


@pytest.mark.parametrize("backend", ["numpy", "dask"])
@pytest.mark.parametrize("fn", INDEX_FUNCTIONS)
def test_float_index_where_scipy_matches_exactly(backend, fn):
    """Where scipy compares index and labels exactly (a scalar index; float, bool or uint64
    labels), a float index is taken and the results are scipy's."""
    x = np.arange(12.0).reshape(3, 4)
    labels = np.array([[1, 1, 0, 2], [0, 2, 2, 0], [3, 0, 0, 1]])
    cases = [(labels.astype("float32") / 2, [0.5, 1.5, 0.75, np.nan]),
             (labels.astype("uint64"), [1.5, 2.0, np.nan]),
             (labels.astype(bool), [1.0, 0.5])]
    if fn not in ("minimum", "maximum", "minimum_position", "maximum_position", "extrema",
                  "median"):
        cases += [(labels, 1.5), (labels, np.nan)]  # absent scalars: scipy's empty result
    for lab, index in cases:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = getattr(ndi, fn)(x, lab, index)
            got = getattr(ndimage, fn)(on(backend, x), on(backend, lab), index)
            if fn == "extrema":
                for g, e in zip(got[:2], expected[:2]):
                    close(g, np.asarray(e), err_msg=f"{lab.dtype} {index}")
            elif fn in ("minimum_position", "maximum_position"):
                assert positions(got) == positions(expected), f"{lab.dtype} {index}"
            else:
                close(got, np.asarray(expected), err_msg=f"{lab.dtype} {index}")


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_a_uint64_index_list_up_to_2_64_minus_1(backend):
    """Issue #20: ``[1, 2**64 - 1]`` as a list got an internal message on Dask ("index must be
    a 1-D array of sorted, unique labels"): NumPy makes the list float64, which holds 2**64 - 1
    as 2**64. The list's integers are now taken exactly, as scipy takes a uint64 array."""
    x = np.arange(16.0).reshape(4, 4)
    labels = np.zeros((4, 4), np.uint64)
    labels[0, :2], labels[1:3, 1:3], labels[3, 3] = 1, 2**64 - 1, 2**64 - 2
    for index in ([1, 2**64 - 1], [[2**64 - 1, 0], [2**64 - 2, 7]], (2**64 - 1,)):
        exact = np.array(index, dtype=np.uint64)
        for fn in VALUE_FUNCTIONS + ("center_of_mass",):
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                expected = getattr(ndi, fn)(x, labels, exact)
                got = getattr(ndimage, fn)(on(backend, x), on(backend, labels), index)
            if backend == "dask":  # NumPy input runs scipy on the list, with its float64 rounding
                close(got, np.asarray(expected), err_msg=f"{fn} {index}")
    got = ndimage.sum_labels(on("dask", x), on("dask", labels), [1, 2**64 - 1])
    close(got, np.array([1.0, 30.0]))  # label 2**64 - 1 is 5 + 6 + 9 + 10; 2**64 - 2 is 15
    with pytest.raises(ValueError, match=r"^index holds the integers -1 and 18446744073709551615, "
                                         r"which no integer dtype holds together"):
        ndimage.sum_labels(on("dask", x), on("dask", labels), [-1, 2**64 - 1])
    # an index the labels' dtype cannot hold: scipy's precision error, also for integers
    with pytest.raises(ValueError, match=r"Cannot convert index values from <uint64> to <int64> "
                                         r"\(labels' type\) without loss of precision"):
        ndimage.labeled_comprehension(on("dask", x), on("dask", labels.astype(np.int64)),
                                      [1, 2**64 - 1], np.sum, float, 0)


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_find_objects_with_a_huge_label_says_why_before_any_work(backend, monkeypatch):
    """Issue #20: a label of 2**62 raised MemoryError with an empty message (at compute on
    Dask): the result lists every label number up to the largest."""
    labels = np.zeros((4, 4), np.int64)
    labels[1, 1] = 2**62
    message = (r"^find_objects: {what} is 4611686018427387904, and the result lists one entry "
               r"per label number from 1 to it, present or not: 4611686018427387904 entries, at "
               r"least 32768\.00 PiB \(this machine has .* of memory\)\. Renumber the labels to "
               r"1\.\.n first \(skimage\.segmentation\.relabel_sequential, or numpy\.unique\("
               r"labels, return_inverse=True\)\), or pass a smaller max_label$")
    with pytest.raises(MemoryError, match=message.format(what="max_label")):
        ndimage.find_objects(on(backend, labels), max_label=2**62)  # before any work
    with pytest.raises(MemoryError, match=message.format(what="the largest label")):
        host(ndimage.find_objects(on(backend, labels)))  # on Dask, known only at compute
    labels[1, 1] = 3
    assert host(ndimage.find_objects(on(backend, labels))) == ndi.find_objects(labels)


def test_complex_input_only_through_scipy():
    x = np.ones((3, 4), complex)
    assert ndimage.sum_labels(x) == 12  # NumPy input: scipy.ndimage takes it
    with pytest.raises(TypeError, match="complex input is not supported"):
        ndimage.sum_labels(da.from_array(x), np.ones((3, 4), int), [1])
