"""mean_squared_error and normalized_root_mse against scikit-image's definitions: every layout a
Dask block can have, image dtypes, chunkings, CPU and GPU paths, and the same errors."""

import numpy as np
import pytest

import chunkernels
from chunkernels import metrics
from chunkernels.kernels import mean_squared_error as mse
from chunkernels.kernels import normalized_root_mse as nrmse
from chunkernels.testing import assert_close, random_array, to_device_view

da = pytest.importorskip("dask.array")

backends = pytest.mark.parametrize("backend", ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
METRICS = [("mean_squared_error", {}), *(("normalized_root_mse", {"normalization": n})
                                         for n in nrmse.NORMALIZATIONS)]
METRIC_IDS = [f"{n}-{p.get('normalization', '')}".rstrip("-") for n, p in METRICS]


def _reference(name, a, b, params):
    return np.asarray(chunkernels.get(name).cpu(a, b, **params))


def _rtol(name, a, b):
    # NRMSE 'mean' of float32 images: scikit-image sums in float32, chunkernels in float64
    return 1e-6 if name == "normalized_root_mse" and mse.float_type(a.dtype, b.dtype) == np.float32 else 1e-12


def _pairs(rng):
    img = lambda *args: random_array(*args, nonnegative=True)  # noqa: E731
    base = img(rng, (64, 130), "float32")
    return {
        "c-float32": (img(rng, (67, 45), "float32"), img(rng, (67, 45), "float32")),
        "c-float64": (img(rng, (67, 45), "float64"), img(rng, (67, 45), "float64")),
        "uint8": (img(rng, (50, 40), "uint8"), img(rng, (50, 40), "uint8")),
        "uint16-float32": (img(rng, (50, 40), "uint16"), img(rng, (50, 40), "float32")),
        "int32-int64": (img(rng, (33, 21), "int32"), img(rng, (33, 21), "int64")),
        "fortran-transposed": (np.asfortranarray(img(rng, (30, 40), "float64")),
                               img(rng, (40, 30), "float64").T),
        "sliced-stepped": (base[::2, 3:-3], base[1::2, 3:-3]),
        "reversed": (base[::-1], base[:, ::-1]),
        "broadcast-b": (img(rng, (20, 9), "float32"), np.broadcast_to(img(rng, (9,), "float32"), (20, 9))),
        "3d-transposed": (img(rng, (6, 7, 8), "float64").transpose(2, 0, 1),
                          img(rng, (8, 6, 7), "float64")),
        "5d": (img(rng, (3, 4, 2, 5, 6), "float32")[:, ::2, :, ::2], img(rng, (3, 2, 2, 3, 6), "float32")),
        "size-1-axes": (img(rng, (1, 7, 1), "float64"), img(rng, (1, 7, 1), "float64")),
        "0-d": (np.array(2.5), np.array(1.0)),
    }


PAIR_IDS = list(_pairs(np.random.default_rng(0)))


def _device(backend, a):
    return to_device_view(a) if backend == "cupy" else a


@backends
@pytest.mark.parametrize("pair", PAIR_IDS)
@pytest.mark.parametrize("name,params", METRICS, ids=METRIC_IDS)
def test_whole_array_layouts(backend, pair, name, params):
    a, b = _pairs(np.random.default_rng(1))[pair]
    got = chunkernels.apply(_device(backend, a), name, _device(backend, b), strict=True, **params)
    assert type(got).__module__.split(".")[0] == backend and got.shape == ()
    assert_close(got, _reference(name, a, b, params), rtol=_rtol(name, a, b))


@backends
@pytest.mark.parametrize("name,params", METRICS, ids=METRIC_IDS)
@pytest.mark.parametrize("chunks_a,chunks_b", [((67, 45), (67, 45)), ((20, 7), (20, 7)),
                                               ((1, 45), (67, 1)), ((30, 45), (7, 13))])
def test_chunked_any_chunking(backend, name, params, chunks_a, chunks_b):
    rng = np.random.default_rng(2)
    a, b = (random_array(rng, (67, 45), "float64", nonnegative=True) for _ in range(2))
    da_, db_ = (da.from_array(_device(backend, v), chunks=c, asarray=False)
                for v, c in ((a, chunks_a), (b, chunks_b)))
    if chunks_a != chunks_b:
        with pytest.raises(chunkernels.AlignmentError, match="rechunk"):
            chunkernels.apply(da_, name, db_, **params)
    z = chunkernels.apply(da_, name, db_, align=True, strict=True, **params)
    assert z.shape == () and z.dtype == np.float64
    assert type(z._meta).__module__.split(".")[0] == backend
    # chunkernels' layer is O(chunks): one partial task per block plus one finalize task
    ours = [k for k in dict(z.__dask_graph__()) if k[0].startswith(z.name)]
    assert len(ours) == da_.npartitions + 1
    assert_close(z.compute(), _reference(name, a, b, params), rtol=_rtol(name, a, b))


@backends
def test_metrics_module_types_follow_input(backend):
    rng = np.random.default_rng(3)
    a, b = (random_array(rng, (30, 20), "uint8", nonnegative=True) for _ in range(2))
    expected = mse.reference(a, b)
    got = metrics.mean_squared_error(_device(backend, a), _device(backend, b))
    if backend == "numpy":
        assert type(got) is np.float64
    else:
        assert type(got).__module__.startswith("cupy") and got.shape == ()
    assert_close(np.asarray(got.get() if hasattr(got, "get") else got), np.asarray(expected))
    lazy = metrics.normalized_root_mse(da.from_array(_device(backend, a), chunks=7), _device(backend, b),
                                       normalization="MIN-MAX")
    assert isinstance(lazy, da.Array)
    assert_close(lazy.compute(), np.asarray(nrmse.reference(a, b, normalization="min-max")))


def test_errors_match_scikit_image():
    a = np.zeros((3, 4))
    with pytest.raises(ValueError, match="Input images must have the same dimensions"):
        metrics.mean_squared_error(a, np.zeros((4, 3)))
    with pytest.raises(ValueError, match="Unsupported norm_type"):
        metrics.normalized_root_mse(a, a, normalization="l1")
    with pytest.raises(ValueError, match="complex valued input is not supported"):
        metrics.mean_squared_error(a.astype(complex), a)
    with pytest.raises(chunkernels.AlignmentError, match="x's shape"):
        chunkernels.apply(a, "mean_squared_error", np.zeros(4))


def test_nan_propagates_like_numpy():
    a = np.arange(12.0).reshape(3, 4)
    a[1, 2] = np.nan
    for name, params in METRICS:
        got = chunkernels.apply(da.from_array(a, chunks=2), name, np.ones((3, 4)), **params).compute()
        assert np.isnan(got), name


def test_matches_scikit_image_itself():
    metrics_sk = pytest.importorskip("skimage.metrics")
    rng = np.random.default_rng(4)
    for dt in ("uint8", "float32", "float64"):
        a, b = random_array(rng, (40, 30), dt), random_array(rng, (40, 30), dt)
        sk_mse = getattr(metrics_sk.mean_squared_error, "__wrapped__", metrics_sk.mean_squared_error)
        sk_nrmse = getattr(metrics_sk.normalized_root_mse, "__wrapped__", metrics_sk.normalized_root_mse)
        assert_close(np.asarray(mse.reference(a, b)), np.asarray(sk_mse(a, b)), rtol=1e-15)
        for n in nrmse.NORMALIZATIONS:
            assert_close(np.asarray(nrmse.reference(a, b, normalization=n)),
                         np.asarray(sk_nrmse(a, b, normalization=n)), rtol=1e-15)
