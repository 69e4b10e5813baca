"""kappa_sigma_clip against the GPU lesson's loop (seed 002): the pass kernel (keys, windows,
histograms, rank selection, extremes) and the clipping driver, NumPy, Dask (NumPy and CuPy
chunks) and CuPy, every dtype it takes, views, chunkings, and the median exactly."""

import math
import time

import numpy as np
import pytest

import chunkernels
from chunkernels.kernels import kappa_sigma_clip as ksc
from chunkernels.sources import ClipResult, clip_reference, kappa_sigma_clip
from chunkernels.sources.lesson import ks_clipper_cpu
from chunkernels.testing import to_device_view

da = pytest.importorskip("dask.array")

backends = pytest.mark.parametrize("backend", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
FLOATS = ("float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _device(backend, a):
    return to_device_view(a) if backend == "cupy" else a


def _host(a):
    """A computed NumPy array from a NumPy, CuPy or Dask array."""
    a = a.compute() if hasattr(a, "dask") else a
    return a.get() if hasattr(a, "get") else np.asarray(a)


def sky(rng, shape=(96, 80), dtype="float32", sources=25):
    """Gaussian noise plus bright point-like sources, as the lesson's radio image has."""
    x = rng.standard_normal(shape)
    rows, cols = rng.integers(0, shape[0], sources), rng.integers(0, shape[1], sources)
    x[rows, cols] += rng.uniform(6, 300, sources)
    if np.dtype(dtype).kind in "iu":
        offset = 128 if np.dtype(dtype).kind == "u" else 0
        x = np.clip(np.round(x * 10 + offset), *_range(dtype))
    return x.astype(dtype)


def _range(dtype):
    info = np.iinfo(dtype)
    return max(info.min, -(2**40)), min(info.max, 2**40)


def expect_lesson(result, x, kappa=3.0):
    """``result`` describes what the lesson's loop keeps of ``x``: same values, same median,
    standard deviation as NumPy's (float32 accumulates in float32, hence its tolerance)."""
    data = np.asarray(x).ravel()
    if data.dtype.kind in "iu":  # NumPy's statistics of integers are float64 anyway
        data = data.astype(np.float64)
    kept = ks_clipper_cpu(data, kappa)
    assert result.count == kept.size
    assert result.median == np.median(kept)
    rtol = 1e-5 if data.dtype == np.float32 else 1e-12
    assert result.std == pytest.approx(float(np.std(kept)), rel=rtol)
    assert result.converged
    return kept


# -- keys and windows ---------------------------------------------------------------------------

def _edge_values(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        info = np.finfo(dtype)
        v = np.array([-np.inf, -info.max, -1.5, -1.0, -info.tiny, -info.smallest_subnormal, -0.0,
                      0.0, info.smallest_subnormal, info.tiny, 1.0, 1.5, info.max, np.inf], dtype)
        with np.errstate(over="ignore"):
            neighbours = [np.nextafter(v, dtype.type(np.inf)), np.nextafter(v, dtype.type(-np.inf))]
        return np.concatenate([v, *neighbours, np.random.default_rng(0).standard_normal(50).astype(dtype)])
    info = np.iinfo(dtype)
    return np.unique(np.array([info.min, info.min + 1, -1 if info.min else 0, 0, 1, 2,
                               info.max - 1, info.max], dtype=object).astype(dtype))


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_keys_keep_the_order_of_values(dtype):
    v = _edge_values(dtype)
    k = ksc.keys(v)
    assert k.dtype == ksc.key_dtype(dtype)
    order = np.argsort(v, kind="stable")
    sv, sk = v[order], k[order]
    assert np.all(np.diff(sk.astype(object)) >= 0)
    # equal keys exactly for equal values (-0.0 == +0.0)
    assert np.array_equal(sk[1:] == sk[:-1], sv[1:] == sv[:-1])
    back = ksc.values(k, dtype)
    assert back.dtype == np.dtype(dtype)
    assert np.array_equal(back, v)
    if np.dtype(dtype).kind == "f":
        assert not np.signbit(back[v == 0]).any()  # zeros come back as +0.0
        nan_keys = ksc.keys(np.array([np.nan, -np.nan], dtype))
        lo, hi = ksc.all_keys(dtype)
        assert ((nan_keys < lo) | (nan_keys > hi)).all()


@pytest.mark.parametrize("dtype", FLOATS + ("int16", "int64", "uint8", "uint64"))
def test_window_keys_are_the_open_interval(dtype):
    v = _edge_values(dtype)
    k = ksc.keys(v)
    finite = v[np.isfinite(v.astype(np.float64))]
    bounds = [float(finite.min()), float(finite.max()), 0.0, -0.0, 1.0, 1.2, -1.5, 0.5]
    if np.dtype(dtype).kind == "f":
        bounds += [math.inf, -math.inf, float(np.finfo(dtype).tiny), 1.0 + 2 ** -40]
    for lower in bounds:
        for upper in bounds:
            lo, hi = ksc.window_keys(lower, upper, dtype)
            inside = (k >= lo) & (k <= hi)
            exact = v.tolist()  # Python ints and floats compare exactly
            expected = np.array([lower < a < upper for a in exact])
            assert np.array_equal(inside, expected), (lower, upper)
    assert ksc.window_keys(math.nan, 1.0, dtype) == (1, 0)


def test_fit_bins():
    assert ksc.fit_bins(0, 65535) == (0, 65535, 0)
    assert ksc.fit_bins(0, 65536) == (0, 65536, 1)
    lo, hi, shift = ksc.fit_bins(*ksc.all_keys("float32"))
    assert shift == 16 and ksc.bin_count((lo, hi, shift)) <= ksc.NBINS
    lo, hi, shift = ksc.fit_bins(*ksc.all_keys("float64"))
    assert shift == 48
    assert ksc.bin_count(ksc.fit_bins(10, 9)) == 0
    assert ksc.fit_bins(0, 4095, 1024)[2] == 2


# -- the pass kernel ------------------------------------------------------------------------------

def _pass_params(dtype, rng):
    """Parameters of the passes the clipping driver makes: first, refinement, extremes."""
    lo, hi = ksc.window_keys(-2.0, 2.5, dtype)
    mid = ksc.key_of(np.asarray(0.25).astype(dtype), dtype)
    return [
        {},  # every value, the whole key range in 65536 bins, the middle ranks
        {"center": 0.5},
        {"window": (lo, hi), "bins": ksc.fit_bins(lo, hi), "center": 0.1},
        {"window": (lo, hi), "bins": ksc.fit_bins(lo, mid, 256), "ranks": (3, 40)},
        {"window": (lo, hi), "max_in": (lo, mid), "min_in": (mid, hi)},
        {"window": (lo, hi), "max_in": (lo, mid)},
        {"window": (1, 0)},  # empty
    ]


LAYOUTS = {
    "c": lambda a: a,
    "fortran": np.asfortranarray,
    "transposed": lambda a: a.T,
    "reversed": lambda a: a[::-1, ::-2],
    "sliced": lambda a: a[3:-2, 5:],
    "3-d": lambda a: a.reshape(12, 8, -1).transpose(1, 2, 0)[:, ::-1],
}


@backends
@pytest.mark.parametrize("dtype", ("float32", "float64", "int16", "uint8", "int64"))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pass_matches_reference(backend, dtype, layout):
    rng = np.random.default_rng(5)
    x = LAYOUTS[layout](sky(rng, (96, 80), dtype))
    for params in _pass_params(dtype, rng):
        expected = ksc.reference(x, **ksc.validate(x.ndim, **params))
        got = _host(chunkernels.apply(_device(backend, x), "kappa_sigma_clip", strict=True, **params))
        np.testing.assert_array_equal(got[[ksc.COUNT, ksc.NANS, ksc.NA, ksc.NB]],
                                      expected[[ksc.COUNT, ksc.NANS, ksc.NA, ksc.NB]])
        np.testing.assert_array_equal(got[ksc.SEL:], expected[ksc.SEL:], err_msg=str(params))
        np.testing.assert_array_equal(got[[ksc.AMAX, ksc.BMIN]], expected[[ksc.AMAX, ksc.BMIN]])
        np.testing.assert_allclose(got[[ksc.SUM, ksc.SUMSQ]], expected[[ksc.SUM, ksc.SUMSQ]],
                                   rtol=1e-12, atol=1e-9)
        for parts in ((1, 3, 7) if x.ndim == 2 else (1, 2, 3)):
            chunks = tuple(max(1, -(-n // parts)) for n in x.shape)
            dx = da.from_array(_device(backend, x), chunks=chunks, asarray=False)
            lazy = chunkernels.apply(dx, "kappa_sigma_clip", strict=True, **params)
            assert lazy.shape == (ksc.HEAD,) and lazy.dtype == np.float64
            assert type(lazy._meta).__module__.split(".")[0] == backend
            got = _host(lazy)
            np.testing.assert_array_equal(got[ksc.SEL:], expected[ksc.SEL:], err_msg=str(chunks))
            np.testing.assert_array_equal(got[[ksc.COUNT, ksc.NANS, ksc.NA, ksc.AMAX, ksc.NB, ksc.BMIN]],
                                          expected[[ksc.COUNT, ksc.NANS, ksc.NA, ksc.AMAX, ksc.NB, ksc.BMIN]])
            np.testing.assert_allclose(got[[ksc.SUM, ksc.SUMSQ]], expected[[ksc.SUM, ksc.SUMSQ]],
                                       rtol=1e-12, atol=1e-9)


def test_pass_counts_nans_and_keeps_them_out():
    x = np.array([[1.0, np.nan, -2.0], [np.inf, -np.nan, 0.5]], dtype=np.float32)
    head = chunkernels.apply(da.from_array(x, chunks=1), "kappa_sigma_clip").compute()
    assert head[ksc.NANS] == 2 and head[ksc.COUNT] == 4  # inf is a value, NaN is not
    assert np.isinf(head[ksc.SUM])


def test_select_finds_the_bins_of_ranks():
    hist = np.array([0, 3, 0, 0, 2, 5, 0, 1], dtype=np.float64)
    row = np.zeros(ksc.HEAD + hist.size)
    row[ksc.HEAD:] = hist
    row[ksc.COUNT] = hist.sum()
    ksc.select(row)  # middle ranks 5 and 5 of 11 values
    assert tuple(row[ksc.SEL:ksc.SEL + 6]) == (5, 5, 5, 5, 5, 5)
    ksc.select(row, (0, 10))
    assert tuple(row[ksc.SEL:ksc.SEL + 6]) == (1, 0, 3, 7, 10, 1)
    ksc.select(row, (11, 2))
    assert tuple(row[ksc.SEL:ksc.SEL + 6]) == (-1, 0, 0, 1, 0, 3)


@pytest.mark.parametrize("size", [1, 5, 1023, 1024, 1025, 4097, 65535, 65536])
@pytest.mark.parametrize("density", [0.0, 0.001, 0.3, 1.0])
def test_select_searches_runs_of_bins_as_one_running_sum(size, density):
    """The two-level search (runs of bins, then the bin) finds what one running sum over every
    bin finds: the bin of each rank, the values before it and in it."""
    rng = np.random.default_rng(size)
    hist = (rng.integers(0, 50, size) * (rng.random(size) < density)).astype(np.float64)
    total = int(hist.sum())
    cum = np.cumsum(hist)
    for ranks in (None, (0, 0), (0, max(total - 1, 0)), (total // 3, total // 2), (total, 0)):
        head = np.zeros(ksc.HEAD)
        head[ksc.COUNT] = total
        expected = [-1, 0, 0, -1, 0, 0]
        for j, rank in enumerate(ksc._ranks(ranks, total)):
            if rank is not None and rank < total:
                b = int(np.searchsorted(cum, rank, side="right"))
                expected[3 * j:3 * j + 3] = (b, cum[b] - hist[b], hist[b])
        got = ksc.select_bins(head, hist, ranks)[ksc.SEL:ksc.SEL + 6]
        assert list(got) == expected, (ranks, list(got), expected)


@pytest.mark.gpu
def test_select_kernel_matches_numpy():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(7)
    for nbins in (1, 5, 1023, 1024, 1025, 65536):
        hist = rng.integers(0, 4, nbins).astype(np.float64) * (rng.random(nbins) < 0.3)
        row = np.zeros(ksc.HEAD + nbins)
        row[ksc.HEAD:] = hist
        row[ksc.COUNT] = hist.sum()
        total = int(hist.sum())
        for ranks in (None, (0, 0), (0, max(total - 1, 0)), (total // 3, total // 2), (total, 0)):
            expected = ksc.select(row.copy(), ranks)
            got = ksc.select(cp.asarray(row), ranks).get()
            np.testing.assert_array_equal(got, expected, err_msg=f"{nbins} bins, ranks {ranks}")


@pytest.mark.gpu
def test_blocks_of_one_device_accumulate_into_one_row():
    """The driver's device path: every block's launch adds into one row; a histogram full of
    one bin spills from the 16-bit shared counters many times."""
    cp = pytest.importorskip("cupy")
    from chunkernels.sources._passes import DevicePasses

    rng = np.random.default_rng(8)
    x = sky(rng, (300, 257), "float32")
    x[:200, :100] = 0.5  # 20000 equal values: one bin, spilled at every 16384
    blocks = [to_device_view(x[:150]), to_device_view(x[150:, ::-1]), to_device_view(x[:0])]
    run = DevicePasses(blocks)
    for params in _pass_params("float32", rng):
        expected = ksc.reference(x, **ksc.validate(2, **params))
        got = run(**params)
        keep = [ksc.COUNT, ksc.NANS, ksc.NA, ksc.AMAX, ksc.NB, ksc.BMIN]
        np.testing.assert_array_equal(got[keep], expected[keep])
        if "max_in" not in params:
            np.testing.assert_array_equal(got[ksc.SEL:], expected[ksc.SEL:], err_msg=str(params))
        np.testing.assert_allclose(got[[ksc.SUM, ksc.SUMSQ]], expected[[ksc.SUM, ksc.SUMSQ]],
                                   rtol=1e-12, atol=1e-9)
    cp.cuda.Device().synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16"])
def test_contiguous_blocks_of_one_device_take_one_launch(dtype):
    """Contiguous blocks (C, Fortran, reversed, a single value) are read by one launch per
    pass, as one run of values; other views by their own: the same counts, histograms and
    extremes as the values taken together, sums to rounding."""
    cp = pytest.importorskip("cupy")
    import dask.array as da

    from chunkernels.sources._passes import DevicePasses

    rng = np.random.default_rng(9)
    x = sky(rng, (300, 257), dtype)
    x[:200, :100] = x.flat[0]  # 20000 equal values: one bin, spilled at every 16384
    blocks = [cp.asarray(x[:100]), cp.asarray(x[100:180], order="F"),
              cp.asarray(x[180:250])[::-1, ::-1], cp.asarray(x[250:251, :1]),
              cp.asarray(x[250:])[:, 1:], cp.asarray(x[:0])]
    values = np.concatenate([b.get().ravel() for b in blocks])
    run = DevicePasses(blocks)
    (_, launches), = run.walks
    assert [type(w).__name__ for w in launches] == ["Run", "Walk"]
    assert launches[0].n == 100 * 257 + 80 * 257 + 70 * 257 + 1
    for params in _pass_params(dtype, rng):
        expected = ksc.reference(values, **ksc.validate(1, **params))
        got = run(**params)
        keep = [ksc.COUNT, ksc.NANS, ksc.NA, ksc.AMAX, ksc.NB, ksc.BMIN]
        np.testing.assert_array_equal(got[keep], expected[keep], err_msg=str(params))
        if "max_in" not in params:
            np.testing.assert_array_equal(got[ksc.SEL:], expected[ksc.SEL:], err_msg=str(params))
        np.testing.assert_allclose(got[[ksc.SUM, ksc.SUMSQ]], expected[[ksc.SUM, ksc.SUMSQ]],
                                   rtol=1e-12, atol=1e-9)
    result = kappa_sigma_clip(da.concatenate([da.from_array(b.ravel(), chunks=b.size,
                                                            asarray=False)
                                              for b in blocks if b.size]), 3.0)
    assert _same_values(result, clip_reference(values))


def test_pass_parameters_are_checked():
    x = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match=r"window=\(1,\); expected 2 non-negative integers"):
        chunkernels.apply(x, "kappa_sigma_clip", window=(1,))
    with pytest.raises(ValueError, match="make 131072 bins; at most 65536"):
        chunkernels.apply(x, "kappa_sigma_clip", bins=(0, 131071, 0))
    with pytest.raises(ValueError, match="replaces the histogram"):
        chunkernels.apply(x, "kappa_sigma_clip", max_in=(0, 5), bins=(0, 9, 0))
    with pytest.raises(ValueError, match="beyond 0xffffffff, the largest key of float32"):
        chunkernels.apply(x, "kappa_sigma_clip", window=(0, 2**40))
    with pytest.raises(TypeError, match="takes real integer, float32 or float64 data; got dtype complex128"):
        chunkernels.apply(x.astype(complex), "kappa_sigma_clip")


# -- the clipping driver --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS + ("int16", "int32", "uint8", "int64"))
def test_numpy_is_the_lessons_loop(dtype):
    x = sky(np.random.default_rng(11), (120, 90), dtype)
    result = kappa_sigma_clip(x)
    assert isinstance(result, ClipResult)
    expect_lesson(result, x)
    assert result.median.dtype == (np.dtype(dtype) if dtype in FLOATS else np.float64)
    assert result.iterations > 1 and result.lower < result.median < result.upper


@backends
@pytest.mark.parametrize("dtype", FLOATS + ("int16", "uint8"))
@pytest.mark.parametrize("chunks", [(120, 90), (40, 45), (33, 17)])
def test_chunked_matches_the_lessons_loop(backend, dtype, chunks):
    x = sky(np.random.default_rng(12), (120, 90), dtype)
    reference = clip_reference(x)
    dx = da.from_array(_device(backend, x), chunks=chunks, asarray=False)
    result, mask = kappa_sigma_clip(dx, return_mask=True)
    kept = expect_lesson(result, x)
    assert result == reference or _same_but_float_noise(result, reference)
    assert isinstance(mask, da.Array) and mask.dtype == bool
    assert type(mask._meta).__module__.split(".")[0] == backend
    m = _host(mask)
    assert m.sum() == result.count
    np.testing.assert_array_equal(np.sort(x[m].astype(kept.dtype)), np.sort(kept))


def _same_but_float_noise(a, b):
    """Chunked sums add in another order than NumPy's: the same result but for the last bits of
    the float64 statistics."""
    return (a.median == b.median and a.count == b.count and a.iterations == b.iterations
            and a.converged == b.converged
            and all(math.isclose(u, v, rel_tol=1e-12) for u, v in
                    ((a.std, b.std), (a.lower, b.lower), (a.upper, b.upper), (a.mean, b.mean))))


@backends
@pytest.mark.parametrize("layout", ["fortran", "transposed", "reversed", "sliced", "3-d"])
def test_views(backend, layout):
    x = LAYOUTS[layout](sky(np.random.default_rng(13), (96, 80), "float32"))
    expect_lesson(kappa_sigma_clip(_device(backend, x)), x)
    dx = da.from_array(_device(backend, x), chunks=tuple(max(1, n // 2) for n in x.shape), asarray=False)
    expect_lesson(kappa_sigma_clip(dx), x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_cupy_whole_array(dtype):
    cp = pytest.importorskip("cupy")
    x = sky(np.random.default_rng(14), (150, 101), dtype)
    result, mask = kappa_sigma_clip(cp.asarray(x), kappa=2.5, return_mask=True)
    reference = clip_reference(x, kappa=2.5)
    assert _same_but_float_noise(result, reference), (result, reference)
    assert isinstance(mask, cp.ndarray)
    np.testing.assert_array_equal(mask.get(), (x > np.float64(reference.lower)) & (x < np.float64(reference.upper)))


@pytest.mark.gpu
def test_cupy_large_float32_one_million_values():
    """Enough values per bin that the shared counters spill, and a window around a non-zero
    background (the refinement starts from a narrow key range)."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(15)
    x = (sky(rng, (1024, 1024), "float32") + np.float32(100.0)).astype(np.float32)
    result = kappa_sigma_clip(cp.asarray(x))
    expect_lesson(result, x)
    dx = da.from_array(cp.asarray(x), chunks=(256, 512), asarray=False)
    assert _same_but_float_noise(kappa_sigma_clip(dx), result)


def _median_cases():
    rng = np.random.default_rng(16)
    yield "odd", rng.standard_normal(1001).astype(np.float32)
    yield "even", rng.standard_normal(1000)
    yield "duplicates", rng.integers(-3, 3, 999).astype(np.float32)
    yield "negative", -np.abs(rng.standard_normal(64))
    yield "zeros of both signs", np.array([-0.0, 0.0, -0.0, 0.0, 1.0, -1.0], np.float32)
    yield "middles in far bins", np.array([-1e30] * 5 + [3e30] * 5, np.float32)
    yield "middles one ulp apart", np.array([1.0] * 4 + [np.nextafter(1.0, 2.0)] * 4)
    yield "middles in neighbouring coarse bins", np.array([0.9999999, 1.0000001] * 3, np.float32)
    yield "huge int64", np.array([2**62, -(2**62), 2**62 - 1, 5], np.int64)
    yield "uint64", np.array([2**63 + 7, 3, 2**63 + 9, 1], np.uint64)


@backends
@pytest.mark.parametrize("case", [c for c, _ in _median_cases()])
def test_median_is_exact(backend, case):
    """With a window wide enough to keep everything the result is the median of all values:
    np.median's, to the last bit, whatever the chunking."""
    x = dict(_median_cases())[case]
    expected = np.median(x)
    for chunks in (x.size, max(1, x.size // 3), max(1, x.size // 10)):
        dx = da.from_array(_device(backend, x), chunks=chunks, asarray=False)
        result = kappa_sigma_clip(dx, kappa=1e30)
        assert result.count == x.size and result.iterations == 1
        assert result.median == expected and result.median.dtype == expected.dtype, (chunks, result)
        assert not np.signbit(result.median) or expected < 0


@backends
def test_nan_clips_everything_like_the_lesson(backend):
    x = sky(np.random.default_rng(17), (40, 30), "float32")
    x[3, 4] = np.nan
    lesson_kept = ks_clipper_cpu(x.ravel())
    for data in (x, da.from_array(_device(backend, x), chunks=(20, 15), asarray=False)):
        result, mask = kappa_sigma_clip(data, return_mask=True)
        assert result.count == lesson_kept.size == 0
        assert np.isnan(result.median) and np.isnan(result.std)
        assert result.iterations == 2 and result.converged
        assert not _host(mask).any()


@backends
@pytest.mark.parametrize("values", [[], [4.0] * 9, [1.0, np.inf, 2.0, 3.0]], ids=["empty", "constant", "inf"])
def test_degenerate_data_like_the_lesson(backend, values):
    x = np.array(values, dtype=np.float64)
    lesson_kept = ks_clipper_cpu(x) if x.size else x
    reference = clip_reference(x)
    chunked = kappa_sigma_clip(da.from_array(_device(backend, x), chunks=3, asarray=False))
    for result in (reference, chunked):
        assert result.count == lesson_kept.size == 0
        assert np.isnan(result.median) and np.isnan(result.std) and result.converged
    assert chunked.iterations == reference.iterations


@backends
@pytest.mark.parametrize("max_iters", [1, 2, 3])
def test_max_iters(backend, max_iters):
    x = sky(np.random.default_rng(18), (100, 80), "float64", sources=60)
    data, kept = x.ravel(), None
    for _ in range(max_iters):  # the lesson's loop body, max_iters times
        med, std = np.median(data), np.std(data)
        kept = data[(data > med - 3 * std) & (data < med + 3 * std)]
        if kept.size == data.size:
            break
        data = kept
    result = kappa_sigma_clip(da.from_array(_device(backend, x), chunks=(50, 40), asarray=False),
                              max_iters=max_iters)
    assert result.iterations == max_iters and not result.converged
    assert result.count == data.size and result.median == np.median(data)
    assert result.std == pytest.approx(np.std(data), rel=1e-12)
    assert _same_but_float_noise(result, clip_reference(x, max_iters=max_iters))


def test_float32_std_is_accumulated_in_float64():
    """NumPy accumulates float32 in float32; the result's std is the float64 one."""
    x = (sky(np.random.default_rng(19), (200, 150), "float32") + np.float32(1000)).astype(np.float32)
    result = kappa_sigma_clip(x)
    kept = x.ravel()[(x.ravel() > np.float64(result.lower)) & (x.ravel() < np.float64(result.upper))]
    assert result.std == np.std(kept, dtype=np.float64)
    assert result.mean == np.mean(kept, dtype=np.float64)


def test_array_likes_and_any_shape():
    values = [1.0, 2.0, 3.0, 2.5, 1.5, 2.0, 100.0]
    expect_lesson(kappa_sigma_clip(values, kappa=1.5), np.array(values), kappa=1.5)
    one = kappa_sigma_clip(np.float32(2.0))  # one value: std 0, nothing strictly inside
    assert one.count == 0 and one.iterations == 2 and np.isnan(one.median)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"kappa": 0}, ValueError, r"kappa=0; expected a positive finite number"),
    ({"kappa": float("nan")}, ValueError, r"kappa=nan; expected a positive finite number"),
    ({"kappa": True}, ValueError, r"kappa=True; expected a positive finite number"),
    ({"kappa": "3"}, ValueError, r"kappa='3'; expected a positive finite number"),
    ({"max_iters": 0}, ValueError, r"max_iters=0; expected a positive integer or None"),
    ({"max_iters": 2.5}, TypeError, r"max_iters=2.5; expected a positive integer or None"),
])
def test_argument_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        kappa_sigma_clip(np.zeros(5), **kwargs)


@pytest.mark.parametrize("dtype", ["complex64", "float16", "bool", "object", "U3"])
def test_dtype_errors(dtype):
    x = np.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=f"takes real integer, float32 or float64 data; got dtype {np.dtype(dtype)}"):
        kappa_sigma_clip(x)
    with pytest.raises(TypeError, match="float32 or float64 data"):
        kappa_sigma_clip(da.from_array(x, chunks=2))


# -- the fused loop: a round's last median pass batched with the next round's passes ----------

def _driven(blocks, fuse, max_iters=None, nbins=ksc.NBINS):
    """The loop over NumPy blocks, fused or not: (result, round trips, passes)."""
    from chunkernels.sources._passes import HostPasses, clip_steps, drive

    passes = HostPasses(blocks)
    trips = []

    class Counted:
        def __call__(self, **params):
            trips.append(1)
            return passes(**params)

        def many(self, batch):
            trips.append(len(batch))
            return passes.many(batch)

    first = next(float(b.reshape(-1)[0]) for b in blocks if b.size)
    steps = clip_steps(blocks[0].dtype, 3.0, max_iters, nbins, first, fuse)
    return drive(steps, Counted()), len(trips), sum(trips)


def _same_values(a, b):
    """The same kept values, medians and rounds; the float64 sums in another order."""
    return (a.count == b.count and a.iterations == b.iterations and a.converged == b.converged
            and (a.median == b.median or (np.isnan(a.median) and np.isnan(b.median)))
            and (a.std == pytest.approx(b.std, rel=1e-13, nan_ok=True))
            and (a.lower == pytest.approx(b.lower, rel=1e-13, nan_ok=True))
            and (a.upper == pytest.approx(b.upper, rel=1e-13, nan_ok=True)))


@pytest.mark.parametrize("dtype", [*FLOATS, "int16", "uint8", "int64"])
@pytest.mark.parametrize("seed", range(4))
def test_fused_loop_keeps_the_same_values_in_fewer_round_trips(dtype, seed):
    """Batched with the next round's passes, a round's last median pass saves a round trip:
    the same kept values, medians and rounds as the loop of one pass per trip."""
    rng = np.random.default_rng(seed)
    x = sky(rng, (120, 90), "float64", sources=30)
    if np.dtype(dtype).kind in "iu":
        x = np.clip(x * 40 + 100, 0, 255 if dtype == "uint8" else 10_000).astype(dtype)
    else:
        x = x.astype(dtype)
    blocks = [x[:50], x[50:, :33], x[50:, 33:]]
    fused, trips, passes = _driven(blocks, True)
    plain, plain_trips, _ = _driven(blocks, False)
    assert _same_values(fused, plain)
    assert _same_values(fused, clip_reference(x))
    assert trips <= plain_trips
    if dtype == "float32":  # two passes a round unfused, one trip fused
        assert trips < 0.7 * plain_trips and passes > plain_trips


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 10, 31])
@pytest.mark.parametrize("nbins", [ksc.NBINS, 64, 2])
def test_fused_loop_on_few_values_and_narrow_histograms(size, nbins):
    """Few values (a median rank beside an edge zone), ties, and histograms too small for the
    edge zones: the rounds fall back to a pass of their own and keep the same values."""
    rng = np.random.default_rng(size * 7 + nbins)
    for dtype in (*FLOATS, "int16"):
        x = np.round(rng.standard_normal(size) * 3, 1)
        x[: size // 3] = 40.0  # outliers to clip
        x = x.astype(dtype)
        for max_iters in (None, 1, 2):
            fused, _, _ = _driven([x[: size // 2], x[size // 2:]], True, max_iters, nbins)
            plain, _, _ = _driven([x], False, max_iters, nbins)
            assert _same_values(fused, plain), (dtype, max_iters, x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [*FLOATS, "int16"])
def test_fused_loop_on_cupy_blocks(dtype):
    """A cluster's GPU worker runs a batch into a row per pass and reads them back after one
    wait: fused, the same values as the unfused loop and the CPU reference."""
    cp = pytest.importorskip("cupy")
    from chunkernels.sources._passes import DevicePasses, clip_steps, drive, finish

    x = sky(np.random.default_rng(48), (300, 257), dtype)
    # the values split into a C block, a reversed view and a Fortran block
    blocks = [cp.asarray(x[:100]), cp.asarray(x[100:, 7:])[:, ::-1],
              cp.asarray(x[100:, :7], order="F")]
    passes = DevicePasses(blocks)

    class Batched:
        nbins = passes.nbins

        def __call__(self, **params):
            return passes(**params)

        def many(self, batch):
            rows = passes.host_rows_many(batch)
            return [finish(heads, histogram, params)
                    for (heads, histogram), params in zip(rows, batch)]

    fused = drive(clip_steps(x.dtype, 3.0, None, passes.nbins, float(x.flat[0]), True),
                  Batched())
    plain = drive(clip_steps(x.dtype, 3.0, None, passes.nbins, float(x.flat[0]), False),
                  Batched())
    assert _same_values(fused, plain)
    assert _same_values(fused, clip_reference(x))


def test_fuse_may_be_decided_at_each_round():
    """``fuse`` as a callable is asked at each round: False gives the unfused loop's passes."""
    x = sky(np.random.default_rng(49), (80, 70), "float32")
    blocks = [x[:40], x[40:]]
    plain, plain_trips, _ = _driven(blocks, False)
    from chunkernels.sources._passes import HostPasses, clip_steps, drive

    asked = []

    def never():
        asked.append(1)
        return False

    passes = HostPasses(blocks)
    result = drive(clip_steps(x.dtype, 3.0, None, passes.nbins, float(x.flat[0]), never), passes)
    assert result == plain and len(asked) == result.iterations + (not result.converged)
    assert passes.passes == plain_trips


def test_cluster_fuses_where_a_trip_costs_more_than_two_passes():
    from chunkernels.sources._clip_cluster import worth_fusing

    assert worth_fusing(None, None)  # before the first trip: batch
    assert worth_fusing(6e-3, 0.5e-3)  # small shares: the trip's overhead dominates
    assert not worth_fusing(8e-3, 3.5e-3)  # large shares: two more passes cost more
    assert not worth_fusing(3e-3, 1e-3)  # the break-even: not worth it


def _without_tail(monkeypatch):
    from chunkernels.sources import _passes

    monkeypatch.setattr(_passes, "_tail", lambda *args: None)


def test_tail_finds_the_settling_rounds_on_the_host(monkeypatch):
    """Once the median settles, a batch adds the passes of a tail, and the later rounds come
    from them on the host: fewer trips, the same kept values, medians and rounds."""
    from chunkernels.sources import _passes, synthetic_sky

    x = np.asarray(synthetic_sky(1024, chunks=1024)[0].compute())
    blocks = [x[:300], x[300:]]
    resolved = []
    tiles_statistics = _passes._Tiles.statistics

    def counted(self, window, dtype):
        stats = tiles_statistics(self, window, dtype)
        resolved.append(stats is not None)
        return stats

    monkeypatch.setattr(_passes._Tiles, "statistics", counted)
    with_tail, trips, _ = _driven(blocks, True)
    assert sum(resolved) >= 2  # rounds found from the tail's passes
    _without_tail(monkeypatch)
    fused, fused_trips, _ = _driven(blocks, True)
    plain, plain_trips, _ = _driven(blocks, False)
    assert trips < fused_trips < plain_trips
    assert _same_values(with_tail, fused) and _same_values(with_tail, plain)
    assert _same_values(with_tail, clip_reference(x))


def _wide(rng, n, dtype):
    """Heavy-tailed integers of ``dtype`` spanning many keys, negative where it can hold them:
    int64 keys between 2**53 and 2**63, uint64 ones below 2**53. (Values beyond 2**53 have no
    float64 of their own: their statistics, and so the definition's window, round.)"""
    info = np.iinfo(dtype)
    span = min(30_000, (int(info.max) - int(info.min)) // 40)
    centre = {"i": int(info.min) // 4, "u": int(info.max) // 4}[np.dtype(dtype).kind]
    centre = 2**40 if dtype == "uint64" else -300_000 if dtype == "int64" else centre
    x = np.round(rng.standard_t(2, n) * span)
    return (np.clip(x, int(info.min) - centre, int(info.max) - centre).astype(np.int64)
            .astype(object) + centre).astype(dtype)


@pytest.mark.parametrize("nbins", [ksc.NBINS, 64, 2])
@pytest.mark.parametrize("dtype", [*FLOATS, *INTS])
def test_fused_loop_with_tails_keeps_the_lessons_values(nbins, dtype):
    """Random skies, ties, heavy-tailed integers over many keys of every width (64-bit keys
    below 2**53, between 2**53 and 2**63 and above), histograms too narrow for most plans,
    max_iters: the fused loop, tails and all, keeps what the loop of one pass per trip keeps,
    and what the definition keeps."""
    for seed in range(3):
        rng = np.random.default_rng(seed + 10 * nbins)
        shape = (int(rng.integers(2, 260)), int(rng.integers(1, 180)))
        if np.dtype(dtype).kind in "iu":
            x = _wide(rng, shape[0] * shape[1], dtype).reshape(shape)
        else:
            x = sky(rng, shape, "float64", sources=max(1, shape[0] // 4))
            x = (np.round(x, 1) if seed % 2 else x).astype(dtype)  # ties
        blocks = [x[: shape[0] // 2], x[shape[0] // 2:]]
        for max_iters in (None, 1, 4):
            fused, _, _ = _driven(blocks, True, max_iters, nbins)
            plain, _, _ = _driven(blocks, False, max_iters, nbins)
            assert _same_values(fused, plain), (seed, max_iters)
            assert _same_values(fused, clip_reference(x, max_iters=max_iters)), (seed, max_iters)


def test_tail_on_negative_int64():
    """Keys of negative int64 values lie below 2**63 and above 2**53: the tail's rounds find
    them as the definition does (they were once searched as float64, off by hundreds)."""
    rng = np.random.default_rng(1)
    x = (np.round(rng.standard_t(2, 20_000) * 30_000) - 300_000).astype(np.int64)
    result = kappa_sigma_clip(da.from_array(x, chunks=5_000))
    assert _same_but_float_noise(result, clip_reference(x))
    expect_lesson(result, x)


@pytest.mark.parametrize("dtype, offset", [("int16", 0), ("int64", -(2**40)),
                                           ("uint64", 2**40)])
def test_tiles_give_a_windows_statistics_or_none(dtype, offset):
    """The tiles of a tail: single keys over zones, counts and sums between them. A window
    whose edges and median lie in the zones gets its count, mean, std and median exactly as
    the values give them; an edge or the median among values only counted gives None. 64-bit
    keys too, below 2**53 and between 2**53 and 2**63."""
    from chunkernels.sources._passes import HostPasses, _Tiles

    rng = np.random.default_rng(3)
    x = (np.round(rng.standard_normal(5000) * 100).astype(np.int64).astype(object)
         + offset).astype(dtype)  # ties: keys of 700 values
    k = np.sort(ksc.keys(x))
    passes = HostPasses([x[:2000], x[2000:]])
    # zones of single keys around the 5th, 50th and 95th percentiles, counted ranges between
    cuts = [int(k[int(q * k.size)]) for q in (0.03, 0.07, 0.45, 0.55, 0.93, 0.97)]
    pieces = [(True, (cuts[0], cuts[1])), (False, (cuts[1] + 1, cuts[2] - 1)),
              (True, (cuts[2], cuts[3])), (False, (cuts[3] + 1, cuts[4] - 1)),
              (True, (cuts[4], cuts[5]))]
    center = float(np.median(x))
    results = [passes(window=r, bins=(*r, 0), moments=False, ranks=(0, 0), histogram=True)
               if zone else passes(window=r, max_in=(1, 0), center=center)
               for zone, r in pieces]
    tiles = _Tiles.of((((), None, None, center, (pieces, 0)), results), x.dtype)
    inside = [int(v) for v in k[(k >= cuts[0]) & (k <= cuts[1])]]
    upper = [int(v) for v in k[(k >= cuts[4]) & (k <= cuts[5])]]
    checked = 0
    for a in inside[::17] + [cuts[1] + 1]:
        for b in upper[::13] + [cuts[4] - 1]:
            kept = ksc.values(k[(k >= a) & (k <= b)], x.dtype)
            stats = tiles.statistics((a, b), x.dtype)
            assert stats is not None
            count, mean, std, median = stats
            assert count == kept.size and median == np.median(kept)
            assert mean == pytest.approx(kept.astype(np.float64).mean(), rel=1e-12, abs=1e-12)
            assert std == pytest.approx(kept.astype(np.float64).std(), rel=1e-9)
            checked += 1
    assert checked > 100
    middle = int(k[k.size // 2])
    assert tiles.statistics((cuts[1] + 2, cuts[5]), x.dtype) is None  # an edge in a counted range
    assert tiles.statistics((cuts[0] - 1, cuts[5]), x.dtype) is None  # beyond the tiles
    assert tiles.statistics((middle, cuts[5]), x.dtype) is None  # the median among counted values
    assert tiles.statistics((cuts[5], cuts[0]), x.dtype) is None  # an empty window


def test_first_pass_sums_move_to_another_center():
    """A GPU worker's first pass, centred on its own first value, moved to the array's; the
    client keeps it only where the move loses no digits of the std."""
    from chunkernels.sources._clip_cluster import _kept_digits, _recentred

    rng = np.random.default_rng(8)
    for block, center, first in ((rng.standard_normal(1000) * 3 + 7, 7.5, 6.0),
                                 (rng.standard_normal(10) - 2, -1.0, 6.0),
                                 (np.zeros(0), 3.0, 3.0), (np.zeros(0), 3.0, 1.0)):
        heads = np.zeros((1, ksc.HEAD))
        heads[0, ksc.COUNT], heads[0, ksc.SUM] = block.size, (block - center).sum()
        heads[0, ksc.SUMSQ] = ((block - center) ** 2).sum()
        moved = _recentred((heads, 0, None, 0.0), center, first)[0][0]
        assert moved[ksc.COUNT] == block.size
        assert moved[ksc.SUM] == pytest.approx((block - first).sum(), rel=1e-12, abs=1e-12)
        assert moved[ksc.SUMSQ] == pytest.approx(((block - first) ** 2).sum(), rel=1e-12,
                                                 abs=1e-12)
    head = np.zeros(ksc.HEAD)
    values = rng.standard_normal(100_000)
    head[ksc.COUNT], head[ksc.SUM], head[ksc.SUMSQ] = values.size, values.sum(), (values**2).sum()
    assert _kept_digits(head, [0.5, -20.0, 31.0], 0.0)  # within 32 standard deviations
    assert not _kept_digits(head, [0.5, 1e4], 0.0)  # a bright first pixel: a pass of its own
    assert _kept_digits(np.zeros(ksc.HEAD), [1e30], 0.0)  # nothing kept
    head[ksc.SUMSQ] = np.inf
    assert _kept_digits(head, [1e30], 0.0)  # overflowed: the loop rescales


def test_actor_calls_only_its_own_methods():
    import asyncio
    import pickle

    from chunkernels.sources._clip_cluster import ClipService

    service = object.__new__(ClipService)  # no worker needed to refuse
    with pytest.raises(ValueError, match="no method '__init__'"):
        asyncio.run(service.execute(pickle.dumps(("__init__", ()))))


def test_graph_and_host_passes_fuse_alike_to_the_last_bit():
    """NumPy blocks give the same bits on every runner: the in-process graph per batch and a
    worker's passes over its blocks."""
    from chunkernels.sources._passes import GraphPasses, clip_with_passes

    x = sky(np.random.default_rng(47), (100, 90), "float32")
    dx = da.from_array(x, chunks=(40, 45))
    blocks = [b.compute() for b in dx.blocks.ravel()]
    graph = clip_with_passes(GraphPasses(dx), x.dtype, 3.0, None)
    host, _, _ = _driven(blocks, True)
    assert graph == host


# -- extreme magnitudes (issue #20): sums that cannot overflow ----------------------------------

HUGE = np.array([1e160, 2e160, 3e160])
HUGE_STD = float(np.std(HUGE / 1e160)) * 1e160  # 8.16e159: the definition, without overflow


@backends
@pytest.mark.parametrize("chunks", [None, 3, 2, 1])
def test_extreme_magnitudes_keep_everything_with_the_finite_std(backend, chunks):
    """np.std of these overflows (inf), and the sums of a pass overflow too: every path keeps
    the three values with the std of the definition, finite."""
    x = HUGE if chunks is None else da.from_array(_device(backend, HUGE), chunks=chunks,
                                                      asarray=False)
    if chunks is None and backend == "cupy":
        x = _device(backend, HUGE)
    result = kappa_sigma_clip(x)
    assert result.count == 3 and result.converged and result.iterations == 1
    assert result.median == 2e160
    assert result.std == pytest.approx(HUGE_STD, rel=1e-14)
    assert result.mean == pytest.approx(2e160, rel=1e-14)


@backends
def test_extreme_magnitudes_of_both_signs_and_a_clipped_outlier(backend):
    """Values near the float64 limit: differences overflow before squaring. The window is
    scaled from the first round on, and the later rounds keep the scale."""
    rng = np.random.default_rng(30)
    x = rng.standard_normal(2000) * 1e300
    x[:3] = (1.7e308, -1.7e308, 1.6e308)
    reference = clip_reference(x)
    data = x
    while True:  # the definition: the lesson's loop with a float64 std that cannot overflow
        med, std = np.median(data), float(np.std(data / 2**1000)) * 2**1000
        kept = data[(data > med - 3 * std) & (data < med + 3 * std)]
        if kept.size == data.size:
            break
        data = kept
    assert reference.count == data.size < x.size and reference.median == np.median(data)
    assert reference.std == pytest.approx(float(np.std(data / 2**1000)) * 2**1000, rel=1e-12)
    for chunks in (2000, 700, 128):
        result = kappa_sigma_clip(da.from_array(_device(backend, x), chunks=chunks,
                                                asarray=False))
        assert _same_but_float_noise(result, reference), (chunks, result, reference)


def test_infinite_values_still_give_a_nan_std_as_numpy():
    """Overflow is rescaled; an infinite value is not an overflow, and np.std gives NaN."""
    x = np.array([1.0, 2.0, np.inf, 3.0])
    for data in (x, da.from_array(x, chunks=3)):
        result = kappa_sigma_clip(data)
        assert result.count == 0 and np.isnan(result.std)


def test_scaled_pass_is_the_unscaled_one_times_the_scale():
    x = sky(np.random.default_rng(31), (40, 30), "float64")
    for params in ({}, {"center": 0.25}):
        plain = ksc.reference(x, **ksc.validate(2, **params))
        scaled = ksc.reference(x, **ksc.validate(2, scale=2.0**-600, **params))
        partial = ksc.partial(x, **ksc.validate(2, scale=2.0**-600, **params))[0, :ksc.HEAD]
        np.testing.assert_array_equal(np.delete(scaled, [ksc.SUM, ksc.SUMSQ]),
                                      np.delete(plain, [ksc.SUM, ksc.SUMSQ]))
        for got in (scaled, partial):  # the partial row leaves the rank fields to the combiner
            assert got[ksc.SUM] == pytest.approx(plain[ksc.SUM] * 2.0**-600, rel=1e-15)
            assert got[ksc.SUMSQ] == pytest.approx(plain[ksc.SUMSQ] * 2.0**-1200, rel=1e-15)
            assert (got[ksc.COUNT], got[ksc.NANS]) == (plain[ksc.COUNT], plain[ksc.NANS])
    with pytest.raises(ValueError, match=r"scale=0.0; expected a positive finite factor"):
        chunkernels.apply(x, "kappa_sigma_clip", scale=0)


# -- on a distributed cluster: each worker passes over its own blocks ----------------------------

@pytest.fixture(scope="module")
def cpu_cluster():
    """Three single-threaded CPU worker processes, not the default scheduler: a test makes its
    client current where it wants the cluster."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        yield client


def _on(client, x, **persist):
    """``x`` persisted on the workers of ``client``, as kappa_sigma_clip will see it."""
    from distributed import wait

    persisted = client.persist(x, **persist)
    wait(persisted)
    return persisted


@pytest.mark.parametrize("dtype, chunks", [
    *((d, c) for d in FLOATS for c in [(120, 90), (40, 45), (33, 17), (7, 90)]),
    ("int16", (40, 45)), ("uint8", (33, 17)), ("int64", (7, 90)),
])
def test_cluster_result_is_the_in_process_one(cpu_cluster, dtype, chunks):
    """The workers pass over their own blocks: the result equals the in-process one (Dask's
    threads, a graph per pass) to the last bit, and the lesson's loop."""
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(40), (120, 90), dtype)
    dx = da.from_array(x, chunks=chunks)
    in_process = kappa_sigma_clip(dx)
    with cpu_cluster.as_current():
        on_workers = _on(cpu_cluster, dx)
        holders = _holders_of(on_workers)
        result, mask = kappa_sigma_clip(on_workers, return_mask=True)
        m = _host(mask)
    assert result == in_process
    assert _same_but_float_noise(result, clip_reference(x))
    expect_lesson(result, x)
    assert m.sum() == result.count
    if dx.npartitions >= 3:
        assert len(holders) > 1  # the blocks are spread: the client drove the passes


@pytest.mark.parametrize("max_iters", [1, 2, 4])
def test_cluster_max_iters_nans_and_one_worker(cpu_cluster, max_iters):
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(41), (100, 80), "float64", sources=60)
    dx = da.from_array(x, chunks=(30, 25))
    in_process = kappa_sigma_clip(dx, max_iters=max_iters)
    with cpu_cluster.as_current():
        result = kappa_sigma_clip(_on(cpu_cluster, dx), max_iters=max_iters)
        # every block on one worker: it runs the whole loop in one call
        one = _on(cpu_cluster, dx, workers=[min(cpu_cluster.scheduler_info()["workers"])])
        assert len(_holders_of(one)) == 1
        alone = kappa_sigma_clip(one, max_iters=max_iters)
        nan = x.copy()
        nan[50, 3] = np.nan
        with_nan = kappa_sigma_clip(_on(cpu_cluster, da.from_array(nan, chunks=(30, 25))))
    assert result == in_process == alone
    assert result.iterations == max_iters and not result.converged
    assert _same_but_float_noise(result, clip_reference(x, max_iters=max_iters))
    assert with_nan.count == 0 and np.isnan(with_nan.std) and with_nan.iterations == 2


def test_cluster_extreme_magnitudes(cpu_cluster):
    with cpu_cluster.as_current():
        result = kappa_sigma_clip(_on(cpu_cluster, da.from_array(HUGE, chunks=1)))
    assert result.count == 3 and result.std == pytest.approx(HUGE_STD, rel=1e-14)


def test_cluster_actors_are_made_once_per_worker_and_released(cpu_cluster):
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(42), (60, 60), "float32")
    dx = da.from_array(x, chunks=20)
    with cpu_cluster.as_current():
        _clip_cluster.release(cpu_cluster)
        on_workers = _on(cpu_cluster, dx)
        first = kappa_sigma_clip(on_workers)
        made = dict(cpu_cluster.__dict__[_clip_cluster._ATTRIBUTE])
        assert len(made) == len(_holders_of(on_workers)) > 1
        again = kappa_sigma_clip(on_workers)
        assert cpu_cluster.__dict__[_clip_cluster._ATTRIBUTE] == made  # the same actors
        # between calls they hold no blocks (the client closes the calls as it returns, without
        # waiting for them)
        deadline = time.monotonic() + 10
        while set(cpu_cluster.run(_open_calls, [f.key for f in made.values()]).values()) != {0}:
            assert time.monotonic() < deadline, "a ClipService call stayed open"
            time.sleep(0.05)
        assert _clip_cluster.release(cpu_cluster) == len(made)
        assert _clip_cluster._ATTRIBUTE not in cpu_cluster.__dict__
    assert first == again == kappa_sigma_clip(dx)


def test_cluster_asks_its_actors_where_the_blocks_are(cpu_cluster, monkeypatch):
    """With actors made, a call asks them which blocks they hold (one trip, which opens the
    call) instead of the scheduler; where the answer is not each block exactly once (a block
    copied to a second worker) the scheduler is asked after all. The same result either way."""
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(46), (90, 80), "float64")
    dx = da.from_array(x, chunks=30)
    asked = []
    holders = _clip_cluster._holders

    def counted(client, keys, futures):
        asked.append(1)
        return holders(client, keys, futures)

    monkeypatch.setattr(_clip_cluster, "_holders", counted)
    with cpu_cluster.as_current():
        _clip_cluster.release(cpu_cluster)
        on_workers = _on(cpu_cluster, dx)
        first = kappa_sigma_clip(on_workers)
        assert len(asked) == 1  # no actors yet: the scheduler says where the blocks are
        again = kappa_sigma_clip(on_workers)
        assert len(asked) == 1  # the actors said
        cpu_cluster.replicate(_futures(on_workers)[:2], n=2)
        copied = kappa_sigma_clip(on_workers)
        assert len(asked) == 2  # a block held twice: the scheduler is asked
        made = [f.key for f in cpu_cluster.__dict__[_clip_cluster._ATTRIBUTE].values()]
        deadline = time.monotonic() + 10
        while set(cpu_cluster.run(_open_calls, made).values()) != {0}:  # every call closed
            assert time.monotonic() < deadline, "a ClipService call stayed open"
            time.sleep(0.05)
        _clip_cluster.release(cpu_cluster)
    assert first == again == copied == kappa_sigma_clip(dx)


def test_cluster_asks_the_scheduler_when_an_actor_is_gone(cpu_cluster, monkeypatch):
    """An actor that no longer answers (its worker restarted) sends the call to the
    scheduler's word and new actors, not to a graph per pass."""
    from chunkernels.sources import _clip_cluster

    from chunkernels.sources import _clip

    x = sky(np.random.default_rng(47), (60, 50), "float32")
    dx = da.from_array(x, chunks=20)
    expected = kappa_sigma_clip(dx)
    execute = _clip_cluster._execute

    def no_graph(*args):
        raise AssertionError("the call fell back to a graph per pass")

    async def gone(client, address, actor, method, *args):
        if method == "locate":
            raise KeyError(actor)  # what a worker without that actor answers
        return await execute(client, address, actor, method, *args)

    with cpu_cluster.as_current():
        on_workers = _on(cpu_cluster, dx)
        kappa_sigma_clip(on_workers)  # actors made
        monkeypatch.setattr(_clip_cluster, "_execute", gone)
        monkeypatch.setattr(_clip, "GraphPasses", no_graph)
        result = kappa_sigma_clip(on_workers)
        assert len(_clip_cluster._known_services(cpu_cluster)) > 1  # made again
        _clip_cluster.release(cpu_cluster)
    assert result == expected


def _futures(x):
    from distributed import futures_of

    return futures_of(x)


def _holders_of(x):
    """``{worker: its keys}`` of a persisted array's blocks, by the scheduler's word."""
    from chunkernels.sources import _clip_cluster

    client, keys, _, futures = _clip_cluster._blocks(x)
    return _clip_cluster._holders(client, keys, futures)


def _open_calls(keys, dask_worker):
    return sum(len(dask_worker.state.actors[k].calls) for k in keys if k in dask_worker.state.actors)


def test_cluster_reply_holds_the_histograms_non_empty_bins():
    """A worker's reply cuts its histogram to the bins from the first non-empty one to the
    last, as uint16 or uint32 counts where they fit, or to the non-empty bins alone where
    fewer than a quarter of those hold values; the client adds it back exactly."""
    from chunkernels.sources._clip_cluster import _add, _trim

    rng = np.random.default_rng(5)
    cases = [np.zeros(0), np.zeros(7), np.eye(1, 9, 0)[0], np.eye(1, 9, 8)[0], np.full(4, 2.0),
             np.array([0, 0, 2.0**33, 0, 1, 0]), np.array([2.0**16 - 1, 0, 3]),
             np.array([2.0**16, 0, 3]), np.array([5, 2.0**32 - 1])]
    for size in (1, 100, 65536):
        for density in (0.01, 0.2, 0.3, 1.0):
            h = rng.integers(1, 5, size) * (rng.random(size) < density)
            cases.append(h.astype(np.float64))
    sparse = 0
    for histogram in cases:
        offset, part = _trim(histogram)
        filled = np.flatnonzero(histogram)
        if not filled.size:
            assert (offset, part.size) == (0, 0)
            continue
        assert offset == filled[0]
        span = filled[-1] - filled[0] + 1
        if isinstance(part, tuple):
            sparse += 1
            at, counts = part
            assert 4 * filled.size < span and at.size == counts.size == filled.size
            np.testing.assert_array_equal(offset + at, filled)
            np.testing.assert_array_equal(counts, histogram[filled])
        else:
            assert part.size == span and not (span >= 64 and 4 * filled.size < span)
            np.testing.assert_array_equal(part, histogram[filled[0]:filled[-1] + 1])
            counts = part
        most = histogram.max()
        assert counts.dtype == (np.uint16 if most < 2**16 else np.uint32 if most < 2**32
                                else np.float64)
        added = np.ones_like(histogram)
        _add(added, offset, part)
        np.testing.assert_array_equal(added, histogram + 1)
    assert sparse >= 2


def test_cluster_path_is_taken_only_for_blocks_on_the_workers(cpu_cluster):
    """Blocks in this process's memory, or not computed, take the other paths."""
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(43), (50, 40), "float32")
    with cpu_cluster.as_current():
        assert _clip_cluster.clip(da.from_array(x, chunks=20), 3.0, None) is None
        assert _clip_cluster.clip(da.from_array(x, chunks=20) + 1, 3.0, None) is None
        assert _clip_cluster.clip(_on(cpu_cluster, da.from_array(x[:0], chunks=20)), 3.0,
                                  None) is None


def test_cluster_falls_back_to_a_graph_when_a_block_left_its_worker(cpu_cluster, monkeypatch):
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(44), (50, 40), "float32")
    dx = da.from_array(x, chunks=20)
    holders = _clip_cluster._holders

    def moved(client, keys, futures):  # the scheduler's word is stale: a key on the wrong worker
        (a, keys_a), (b, keys_b), *rest = holders(client, keys, futures).items()
        return dict([(a, keys_a[:-1]), (b, keys_b + keys_a[-1:]), *rest])

    monkeypatch.setattr(_clip_cluster, "_holders", moved)
    with cpu_cluster.as_current():
        _clip_cluster.release(cpu_cluster)  # no actors yet: the scheduler is asked
        result = kappa_sigma_clip(_on(cpu_cluster, dx))
        assert _clip_cluster._ATTRIBUTE not in cpu_cluster.__dict__  # forgotten after the failure
    assert result == kappa_sigma_clip(dx)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float32", "float64", "int16"))
def test_cluster_of_one_gpu_worker(dtype):
    """On a LocalCUDACluster of one GPU: the worker runs the whole loop on its CuPy blocks, with
    the same launches as in-process blocks, so the same result to the last bit."""
    cp = pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    from chunkernels import cluster
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(45), (300, 257), dtype)
    dx = da.from_array(cp.asarray(x), chunks=(100, 128), asarray=False)
    in_process = kappa_sigma_clip(dx.persist())
    with cluster.client(1, dashboard_address=None) as c:
        on_gpu = _on(c, dx)
        assert len(_holders_of(on_gpu)) == 1
        result = kappa_sigma_clip(on_gpu)
        assert _clip_cluster.release(c) == 1
    assert result == in_process
    assert _same_but_float_noise(result, clip_reference(x))


@pytest.mark.gpu
def test_cluster_of_two_workers_on_one_gpu(monkeypatch):
    """Two worker processes sharing a GPU hold CuPy blocks: the client drives the loop. Their
    first pass runs as the call opens (its sums moved to the array's first value), the
    settling rounds come from a tail, and a second call finds the blocks through the actors.
    The lesson's values each time."""
    cp = pytest.importorskip("cupy")
    distributed = pytest.importorskip("distributed")
    from chunkernels.sources import _clip_cluster, _passes, synthetic_sky

    x = np.asarray(synthetic_sky(1024, chunks=1024)[0].compute())
    dx = da.from_array(cp.asarray(x), chunks=(256, 512), asarray=False)
    reference = clip_reference(x)
    resolved, recentred = [], []
    tiles_statistics, recentre = _passes._Tiles.statistics, _clip_cluster._recentred

    def counted(self, window, dtype):  # the client drives the loop: its rounds are counted here
        stats = tiles_statistics(self, window, dtype)
        resolved.append(stats is not None)
        return stats

    def moved(*args):
        recentred.append(1)
        return recentre(*args)

    monkeypatch.setattr(_passes._Tiles, "statistics", counted)
    monkeypatch.setattr(_clip_cluster, "_recentred", moved)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster, set_as_default=False) as client, client.as_current():
        on_workers = _on(client, dx)
        assert len(_holders_of(on_workers)) == 2
        # batched, whatever the first trip's timing says (under a loaded host the loop may
        # choose not to batch, and only a batched loop has a tail)
        with _clip_cluster.fusing(True):
            first = kappa_sigma_clip(on_workers)
            again = kappa_sigma_clip(on_workers)
        assert len(_clip_cluster._known_services(client)) == 2
    for result in (first, again):
        assert _same_but_float_noise(result, reference)
    expect_lesson(first, x)
    assert len(recentred) == 4  # both workers' first passes, in both calls
    assert sum(resolved) >= 2  # both calls found a round from a tail


@pytest.mark.multigpu
def test_cluster_of_two_gpu_workers():
    """Two GPU workers: the client combines the workers' rows every pass."""
    cp = pytest.importorskip("cupy")
    pytest.importorskip("dask_cuda")
    from chunkernels import cluster
    from chunkernels.sources import _clip_cluster

    x = sky(np.random.default_rng(46), (1024, 1000), "float32", sources=300)
    dx = da.from_array(cp.asarray(x), chunks=(256, 500), asarray=False)
    with cluster.client(2, dashboard_address=None) as c:
        on_gpus = _on(c, dx)
        holders = _holders_of(on_gpus)
        result = kappa_sigma_clip(on_gpus)
        again = kappa_sigma_clip(on_gpus)  # the actors say where the blocks are
        paths = {}
        for fuse in (True, False):  # a round's passes batched, or a trip each
            with _clip_cluster.fusing(fuse):
                paths[fuse] = kappa_sigma_clip(on_gpus)
        huge = kappa_sigma_clip(_on(c, da.from_array(cp.asarray(HUGE), chunks=1, asarray=False)))
    assert len(holders) == 2
    assert _same_but_float_noise(result, clip_reference(x))
    assert _same_values(again, result)
    assert _same_values(paths[True], result) and _same_values(paths[False], result)
    expect_lesson(result, x)
    assert huge.count == 3 and huge.std == pytest.approx(HUGE_STD, rel=1e-14)


def test_fusing_forces_the_cluster_loops_choice_and_restores_it():
    """``_clip_cluster.fusing`` forces the client-driven loop to batch passes or not (the demo's
    warm-up runs both paths), nests, and puts back what was there, also on an error."""
    from chunkernels.sources import _clip_cluster

    assert _clip_cluster.FUSE is None  # by default each call decides (worth_fusing)
    with _clip_cluster.fusing(True):
        assert _clip_cluster.FUSE is True
        with pytest.raises(RuntimeError), _clip_cluster.fusing(False):
            assert _clip_cluster.FUSE is False
            raise RuntimeError
        assert _clip_cluster.FUSE is True
    assert _clip_cluster.FUSE is None
