"""correlate against scipy.ndimage.correlate: scipy's and dask-image's cases, every mode and
synonym with cval, odd and even N-D weights with per-axis and extreme origins, ``axes`` (weights of
fewer dimensions than the data), 1-D to 4-D data, integer and float data, output dtypes and arrays,
layouts, 0-size and size-1 axes, chunkings, chunking invariance, complex data (CPU reference), and
scipy's errors."""

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

A23 = [[1, 2, 3], [4, 5, 6]]
# scipy's test_filters.py: (input, weights, keywords, expected)
SCIPY_CASES = [
    (A23, [[1, 1], [1, 1]], {}, [[4, 6, 10], [10, 12, 16]]),                    # correlate11
    (A23, [[1, 0], [0, 1]], {}, [[2, 3, 5], [5, 6, 8]]),                        # correlate12
    (A23, [[1, 0], [0, 1]], {"output": np.float32, "mode": "nearest", "origin": -1},
     [[6, 8, 9], [9, 11, 12]]),                                                 # correlate18
    (A23, [[1, 0], [0, 1]], {"output": np.float32, "mode": "nearest", "origin": [-1, 0]},
     [[5, 6, 8], [8, 9, 11]]),                                                  # correlate19
    (A23, [[0.5, 0], [0, 0.5]], {"output": np.float32}, [[1, 1.5, 2.5], [2.5, 3, 4]]),  # 16
    ([1, 2, 3], [1, 1], {"origin": -1}, [3, 5, 6]),                            # correlate17
]
A33 = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
# scipy's test_extend05..10: (input, weights, {mode: expected})
EXTEND = [
    (A33, [[1, 0], [0, 0]], {"nearest": [[1, 1, 2], [1, 1, 2], [4, 4, 5]],
                             "wrap": [[9, 7, 8], [3, 1, 2], [6, 4, 5]],
                             "reflect": [[1, 1, 2], [1, 1, 2], [4, 4, 5]],
                             "mirror": [[5, 4, 5], [2, 1, 2], [5, 4, 5]],
                             "constant": [[0, 0, 0], [0, 1, 2], [0, 4, 5]]}),
    (A33, [[0, 0, 0], [0, 0, 0], [0, 0, 1]], {"nearest": [[5, 6, 6], [8, 9, 9], [8, 9, 9]],
                                              "wrap": [[5, 6, 4], [8, 9, 7], [2, 3, 1]],
                                              "reflect": [[5, 6, 6], [8, 9, 9], [8, 9, 9]],
                                              "mirror": [[5, 6, 5], [8, 9, 8], [5, 6, 5]],
                                              "constant": [[5, 6, 0], [8, 9, 0], [0, 0, 0]]}),
    ([1, 2, 3], [0] * 8 + [1], {"nearest": [3, 3, 3], "wrap": [2, 3, 1], "reflect": [2, 1, 1],
                                "mirror": [1, 2, 3], "constant": [0, 0, 0]}),
    ([[1], [2], [3]], [[0]] * 8 + [[1]], {"nearest": [[3], [3], [3]], "wrap": [[2], [3], [1]],
                                          "reflect": [[2], [1], [1]], "mirror": [[1], [2], [3]],
                                          "constant": [[0], [0], [0]]}),
]
DISK = (np.mgrid[-2:3, -2:3] ** 2).sum(axis=0) < 2.5**2   # dask-image's non-separable weights


def ref(x, weights, **kwargs):
    return ndi.correlate(x, weights, **kwargs)


@backends
@pytest.mark.parametrize("index", range(len(SCIPY_CASES)))
def test_scipy_cases(backend, index):
    data, weights, kwargs, expected = SCIPY_CASES[index]
    x = np.asarray(data)
    got = ndimage.correlate(device(backend, x), np.asarray(weights), **kwargs)
    assert_close(got, np.asarray(expected, dtype=got.dtype))
    check(backend, ndimage.correlate, ref, x, np.asarray(weights), **kwargs)


@backends
@pytest.mark.parametrize("index", range(len(EXTEND)))
def test_scipy_extend(backend, index):
    data, weights, expected = EXTEND[index]
    x, w = np.asarray(data), np.asarray(weights)
    for mode, values in expected.items():
        assert_close(ndimage.correlate(device(backend, x), w, mode=mode, cval=0),
                     np.asarray(values))
        check(backend, ndimage.correlate, ref, x, w, mode=mode, chunks=[(1,) * x.ndim])


@backends
@pytest.mark.parametrize("mode", MODES + SYNONYMS)
@pytest.mark.parametrize("shape", [(3, 4), (5, 2)])
def test_modes(backend, mode, shape):
    rng = np.random.default_rng(30)
    x = rng.standard_normal((27, 25))
    w = rng.standard_normal(shape)
    check(backend, ndimage.correlate, ref, x, w, mode=mode, cval=1.25, halo=5)


@backends
def test_every_origin_pair(backend):
    rng = np.random.default_rng(31)
    x = rng.standard_normal((16, 15))
    w = rng.standard_normal((4, 3))
    for o0, o1 in itertools.product(range(-2, 2), range(-1, 2)):
        check(backend, ndimage.correlate, ref, x, w, mode="constant", cval=-3.0,
              origin=(o0, o1), chunks=[(16, 15), (5, 4), (3, 2)])
    check(backend, ndimage.correlate, ref, x, w, mode="wrap", origin=-1, halo=4)


@backends
@pytest.mark.parametrize("dask_image_case", range(13))
def test_dask_image_cases(backend, dask_image_case):
    weights, origin = [
        (np.ones((2, 2)), 0), (np.ones((2, 3)), 0), (np.ones((2, 3)), (0, 1)),
        (np.ones((2, 3)), (0, -1)), (DISK, 0), (DISK, (1, 2)), (DISK, (-1, -2)),
        (np.ones((5, 5)), 0), (np.ones((7, 7)), 0), (np.ones((8, 8)), 0), (np.ones((10, 10)), 0),
        (np.ones((5, 5)), 2), (np.ones((5, 5)), -2)][dask_image_case]
    x = np.arange(140.0).reshape(10, 14)
    check(backend, ndimage.correlate, ref, x, weights, origin=origin, chunks=[(5, 7)])


@backends
@pytest.mark.parametrize("axes", [(0, 2), (2, 0), (-1, 1), (1,), (0, 1, 2), None])
def test_axes(backend, axes):
    rng = np.random.default_rng(32)
    x = rng.standard_normal((7, 9, 11))
    n = 3 if axes is None else len(axes)
    w = rng.standard_normal((3, 4, 2)[:n])
    origin = (-1, 1, 0)[:n]
    check(backend, ndimage.correlate, ref, x, w, axes=axes, origin=origin, mode="mirror",
          halo=3)


@pytest.mark.parametrize("fn", [ndimage.correlate, ndimage.convolve])
def test_axes_equal_expanded_weights(fn):
    """scipy's test_correlate_convolve_axes: the weights get size-1 axes where nothing is
    filtered (their axes in increasing order), the origins go to the axes in the order given."""
    x = np.arange(6 * 8 * 12, dtype=np.float64).reshape(6, 8, 12)
    w = np.arange(15.0).reshape(3, 5)
    for axes in itertools.permutations(range(-3, 3), 2):
        axes = tuple(ax % 3 for ax in axes)
        if axes[0] == axes[1]:
            with pytest.raises(ValueError, match="axes must be unique"):
                fn(x, w, axes=axes)
            continue
        missing = ({0, 1, 2} - set(axes)).pop()
        origin3 = [0, 0, 0]
        origin3[axes[0]], origin3[axes[1]] = -1, 1
        expected = getattr(ndi, fn.__name__)(x, np.expand_dims(w, missing), origin=origin3)
        assert_close(fn(x, w, axes=axes, origin=(-1, 1)), expected)
        assert_close(fn(da.from_array(x, chunks=4), w, axes=axes, origin=(-1, 1)).compute(),
                     expected)


def test_all_axes_unsorted_take_origins_in_axis_order():
    """With every axis filtered, scipy applies the origins in axis order whatever axes says."""
    x = np.random.default_rng(41).standard_normal((6, 7))
    w = np.random.default_rng(42).standard_normal((3, 4))
    expected = ndi.correlate(x, w, axes=(1, 0), origin=(1, 0))
    assert_close(expected, ndi.correlate(x, w, origin=(1, 0)))
    assert_close(ndimage.correlate(x, w, axes=(1, 0), origin=(1, 0)), expected)


def test_weights_subset_axes_origins():
    """scipy's test_filter_weights_subset_axes_origins: an origin shifts the result."""
    x = np.arange(6 * 8 * 12, dtype=np.float64).reshape(6, 8, 12)
    w = np.ones((3, 5))
    w[0, 1] = 0
    dx = da.from_array(x, chunks=(3, 4, 5))
    for arr in (x, dx):
        out = np.asarray(ndimage.correlate(arr, w, axes=(-2, -1), origin=(0, 1)))
        out0 = np.asarray(ndimage.correlate(arr, w, axes=(-2, -1), origin=0))
        assert_close(out[:, :, 1:], out0[:, :, :-1])


@backends
def test_1d_and_4d(backend):
    rng = np.random.default_rng(33)
    check(backend, ndimage.correlate, ref, rng.standard_normal(40), rng.standard_normal(6),
          mode="reflect", origin=2, halo=5)
    x4 = rng.standard_normal((3, 5, 6, 7))
    # three filtered axes, the fourth taken a slice at a time on the GPU
    check(backend, ndimage.correlate, ref, x4, rng.standard_normal((1, 3, 2, 3)),
          mode="nearest", halo=2)


@backends
@pytest.mark.parametrize("dtype", ["int8", "uint8", "uint16", "int32", "uint64", "int64",
                                   "float32", "float64"])
def test_dtypes_round_as_scipy(backend, dtype):
    rng = np.random.default_rng(34)
    x = (rng.integers(0, 100, (18, 17)) if np.dtype(dtype).kind in "iu"
         else rng.standard_normal((18, 17))).astype(dtype)
    w = np.array([[0.3, 0.15, 0.6], [0.05, 0.45, 0.2]])
    check(backend, ndimage.correlate, ref, x, w, halo=2)
    check(backend, ndimage.correlate, ref, x, w, output=np.float32, halo=2)


@backends
@pytest.mark.parametrize("dtype_in, dtype_out", [("uint8", "int16"), ("float64", "uint8"),
                                                 ("int32", "float64"), ("float32", "float32")])
def test_output_array(backend, dtype_in, dtype_out):
    """scipy's test_correlate14: into a preallocated array of any dtype."""
    x = np.array(A23, dtype=dtype_in)
    out = device(backend, np.zeros((2, 3), dtype_out))
    assert ndimage.correlate(device(backend, x), np.array([[1, 0], [0, 1]]), output=out) is out
    assert_close(out, np.array([[2, 3, 5], [5, 6, 8]], dtype=dtype_out))


@backends
@pytest.mark.parametrize("index", range(5))
def test_layouts(backend, index):
    label, x = layouts(np.random.default_rng(35))[index]
    check(backend, ndimage.correlate, ref, x, np.arange(12.0).reshape(3, 4) - 5,
          mode="reflect", origin=(1, -2), halo=4)


@backends
@pytest.mark.parametrize("shape", [(1, 9), (9, 1), (0, 5), (3, 0), (1,), (1, 1, 4)])
def test_size_one_and_empty_axes(backend, shape):
    x = np.random.default_rng(36).standard_normal(shape)
    w = np.random.default_rng(37).standard_normal((3,) * len(shape))
    check(backend, ndimage.correlate, ref, x, w, mode="mirror", halo=2)


@backends
def test_wrap_across_many_chunks(backend):
    rng = np.random.default_rng(38)
    x = rng.standard_normal((40, 36))
    check(backend, ndimage.correlate, ref, x, rng.standard_normal((7, 6)), mode="wrap",
          origin=(3, -3), chunks=[(5, 4), (2, 3), (40, 5)])


@backends
def test_weights_larger_than_the_array(backend):
    rng = np.random.default_rng(39)
    for mode in MODES:
        check(backend, ndimage.correlate, ref, rng.standard_normal((3, 4)),
              rng.standard_normal((9, 8)), mode=mode, cval=0.5, chunks=[(3, 4), (2, 2), (1, 1)])


@backends
def test_complex(backend):
    rng = np.random.default_rng(40)
    x = rng.standard_normal((9, 8)) + 1j * rng.standard_normal((9, 8))
    w = np.array([[1, 0], [0, 1 + 1j]])
    for data, weights, kwargs in ((x, w, {}), (x.real, w, {}),
                                  (x, w.real, {"mode": "constant", "cval": 5 + 2j})):
        if backend == "cupy":
            with pytest.warns(CPUFallbackWarning):
                check(backend, ndimage.correlate, ref, data, weights, halo=2, **kwargs)
        else:
            check(backend, ndimage.correlate, ref, data, weights, halo=2, **kwargs)


@settings(max_examples=30, deadline=None)
@given(case=chunked_arrays(max_dims=3, max_side=10), data=st.data())
def test_chunking_invariance(case, data):
    x, chunks = case
    taps = tuple(data.draw(st.integers(1, 5)) for _ in range(x.ndim))
    origin = tuple(data.draw(st.integers(-(m // 2), (m - 1) // 2)) for m in taps)
    mode = data.draw(st.sampled_from(MODES))
    w = np.arange(1.0, np.prod(taps) + 1).reshape(taps)
    check_invariance(ndimage.correlate, ref, x, chunks, w, mode=mode, cval=1.0, origin=origin)


D2, D3 = (6, 8), (6, 8, 12)


@pytest.mark.parametrize("shape, weights, kwargs, error, match", [
    (D2, np.ones((2, 2)), {"mode": ["nearest", "reflect"]}, RuntimeError,
     "A sequence of modes is not supported"),
    (D2, np.ones(1), {}, RuntimeError, r"weights.ndim \(1\) must match len\(axes\) \(2\)"),
    (D3, np.ones((3,) * 3), {"axes": (0, 1)}, RuntimeError,
     r"weights.ndim \(3\) must match len\(axes\) \(2\)"),
    (D2, np.ones((1, 0)), {}, ValueError, "no filter weights given"),
    (D2, np.ones((1, 1)), {"origin": (0,)}, RuntimeError, "sequence argument must have length"),
    (D2, np.ones((1, 1)), {"origin": [(0,)]}, RuntimeError, "sequence argument must have length"),
    (D2, np.ones((1, 1)), {"origin": 1}, ValueError, "Invalid origin"),
    (D2, np.ones((2, 2)), {"origin": [0, 1]}, ValueError, "Invalid origin"),   # scipy's gh-822
    (D2, np.ones((2, 2)), {"origin": [0, -2]}, ValueError, "Invalid origin"),
    (D2, np.ones((1, 1)), {"origin": 0.0}, TypeError, "cannot be interpreted as an integer"),
    (D2, np.ones((1, 1)), {"origin": (0.0, 0.0)}, TypeError, "cannot be interpreted"),
    (D2, np.ones((1, 1)), {"origin": 1 + 0j}, TypeError, "cannot be interpreted"),
    (D3, np.ones(3), {"axes": (1.5,)}, TypeError, "cannot be interpreted as an integer"),
    (D3, np.ones(3), {"axes": (3,)}, ValueError, "out of range"),
    (D3, np.ones(3), {"axes": (-4,)}, ValueError, "out of range"),
    (D3, np.ones((3,) * 4), {"axes": (0, 1, 2, 3)}, ValueError, "out of range"),
    (D3, np.ones((3, 3)), {"axes": (1, 1)}, ValueError, "axes must be unique"),
    (D3, np.ones((3, 3)), {"axes": (1, -2)}, ValueError, "axes must be unique"),
])
def test_errors_before_any_work(shape, weights, kwargs, error, match):
    for x in (np.arange(np.prod(shape), dtype=float).reshape(shape), da.zeros(shape, chunks=3)):
        with pytest.raises(error, match=match):
            ndimage.correlate(x, weights, **kwargs)


def test_scipy_gh822_1d_origin():
    with pytest.raises(ValueError, match="Invalid origin"):
        ndimage.correlate([0, 1, 2, 3, 4, 5], [0, 1, 2], origin=[2])


def test_dask_shapes_are_ints():
    d = da.from_array(np.arange(140.0).reshape(10, 14), chunks=(5, 7))
    out = ndimage.correlate(d, np.ones((1, 1)))
    assert all(type(s) is int for s in out.shape)
    assert_close(out.compute(), d.compute())


@backends
@pytest.mark.parametrize("mode", MODES)
def test_weights_a_few_times_the_array_fold_onto_it(references_fold, backend, mode):
    """Issue #20: N-D weights reaching beyond the array fold onto it along each axis, with
    origins; SciPy's result (reaches below 4n, where SciPy's own N-D reflect is right: see
    :func:`test_scipy_nd_reflect_misreads_offsets_of_minus_4n`)."""
    rng = np.random.default_rng(82)
    x = rng.standard_normal((4, 5))
    w = rng.standard_normal((21, 17))
    for fn, ref in ((ndimage.correlate, ndi.correlate), (ndimage.convolve, ndi.convolve)):
        check(backend, fn, ref, x, w, mode=mode, cval=0.5, origin=(3, -2),
              chunks=[(4, 5), (2, 2), (1, 5)])


def _separable_reference(x, w, mode, origin):
    """``correlate(x, w)`` for 2-D ``x`` and ``w`` from SciPy's 1-D correlations, which extend
    any length by the mode correctly: a column of ``w`` along axis 0, a one-tap shift along 1."""
    out = np.zeros(x.shape)
    for b in range(w.shape[1]):
        shift = np.zeros(w.shape[1])
        shift[b] = 1.0
        column = ndi.correlate1d(x, w[:, b], 0, mode=mode, origin=origin[0])
        out += ndi.correlate1d(column, shift, 1, mode=mode, origin=origin[1])
    return out


def test_scipy_nd_reflect_misreads_offsets_of_minus_4n():
    """SciPy's N-D filters in 'reflect' mode map an offset that is a multiple of 2n from -4n on
    (n the axis' length) to position -1 instead of 0; its 1-D correlation is right. Folded,
    chunkernels' result is the mode's, as the 1-D correlations give it."""
    rng = np.random.default_rng(83)
    x = rng.standard_normal((2, 3))
    w = rng.standard_normal((9, 3))
    origin = (4, 0)  # offsets -8..0 along axis 0: -8 is -4n
    expected = _separable_reference(x, w, "reflect", origin)
    assert not np.allclose(ndi.correlate(x, w, mode="reflect", origin=origin), expected)
    for data in (x, da.from_array(x, chunks=1)):
        assert_close(np.asarray(ndimage.correlate(data, w, mode="reflect", origin=origin)),
                     expected)
