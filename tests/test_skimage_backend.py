"""chunkernels as a scikit-image backend (``chunkernels.skimage_backend``, docs/skimage.md).

scikit-image decides when ``skimage.metrics`` is first imported whether backends are installed
(through the ``skimage_backends`` entry points), so these tests need chunkernels installed
(``pip install -e .``), as ``make test`` does; without the entry points they are skipped. Results
are compared with scikit-image's own, undispatched function (``__wrapped__``) on the NumPy data.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import warnings
from importlib.metadata import entry_points
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

import chunkernels
from chunkernels import cuda, metrics
from chunkernels import skimage_backend as ckb

pytest.importorskip("skimage", minversion="0.26")
import skimage.metrics  # noqa: E402 - after the importorskip
from skimage.util._backends import BackendInformation, DispatchNotification  # noqa: E402

if not hasattr(skimage.metrics.mean_squared_error, "__wrapped__"):
    pytest.skip(
        "scikit-image does not dispatch here: chunkernels' skimage_backends entry points are "
        "missing (install with pip install -e .) or SKIMAGE_NO_DISPATCHING=1 is set",
        allow_module_level=True,
    )

MSE = "skimage.metrics:mean_squared_error"
NRMSE = "skimage.metrics:normalized_root_mse"
NORMALIZATIONS = ("euclidean", "min-max", "mean")
# scikit-image's own functions, as they run when no backend takes the call
SK_MSE = skimage.metrics.mean_squared_error.__wrapped__
SK_NRMSE = skimage.metrics.normalized_root_mse.__wrapped__

SHAPE = (50, 37)
# chunks of the first and the second image: one chunk, even, uneven, and the two differing
CHUNKINGS = [
    (SHAPE, SHAPE),
    ((25, 37), (25, 37)),
    ((7, 9), (7, 9)),
    ((7, 9), (20, 11)),
    ((50, 1), (1, 37)),
]
DTYPE_PAIRS = [
    ("uint8", "uint8"),
    ("int32", "int64"),
    ("float32", "float32"),
    ("float64", "float64"),
    ("uint8", "float32"),
    ("int16", "float64"),
]


@pytest.fixture(autouse=True)
def _numpy_opt_in_off(monkeypatch):
    """No NumPy opt-in from the environment, and the GPU question asked afresh in every test."""
    monkeypatch.delenv(ckb.NUMPY_ENV, raising=False)
    monkeypatch.delenv(ckb.MIN_BYTES_ENV, raising=False)
    ckb._gpu_present.cache_clear()
    yield
    ckb._gpu_present.cache_clear()


@pytest.fixture
def fake_gpu(monkeypatch):
    """``fake_gpu(n)``: make the backend believe ``n`` GPUs are present (CPU machines)."""

    def set_count(n):
        monkeypatch.setattr(cuda, "gpu_count", lambda: n)
        ckb._gpu_present.cache_clear()

    return set_count


def image(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return rng.integers(low, high, shape, endpoint=True).astype(dtype)


def rtol_for(*dtypes):
    # scikit-image computes in float32 for float32 pairs, else in float64
    return 1e-6 if all(np.dtype(d) == np.float32 for d in dtypes) else 1e-12


def served(function, *args, **kwargs):
    """Call a scikit-image function and assert that chunkernels served this very call.

    The function's name is matched: scikit-image's own ``normalized_root_mse`` calls the
    dispatchable ``mean_squared_error`` inside, which could be served on its own.
    """
    name = f"skimage.metrics:{function.__name__}"
    with pytest.warns(DispatchNotification,
                      match=f"'{re.escape(name)}' was dispatched to the 'chunkernels' backend"):
        return function(*args, **kwargs)


def dispatched(function, *args, **kwargs):
    """Call a scikit-image function; assert chunkernels served it and returned a lazy 0-d array."""
    result = served(function, *args, **kwargs)
    assert isinstance(result, da.Array)
    assert result.shape == () and result.dtype == np.float64
    return result


def not_dispatched(function, *args, **kwargs):
    """Call a scikit-image function with DispatchNotification an error: no backend may take it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DispatchNotification)
        return function(*args, **kwargs)


# -- Dask arrays are served, and agree with scikit-image ------------------------------------------


@pytest.mark.parametrize("dtypes", DTYPE_PAIRS, ids="-".join)
@pytest.mark.parametrize("chunks", CHUNKINGS, ids=str)
def test_mean_squared_error_on_dask(dtypes, chunks):
    rng = np.random.default_rng(0)
    a, b = image(rng, SHAPE, dtypes[0]), image(rng, SHAPE, dtypes[1])
    result = dispatched(skimage.metrics.mean_squared_error,
                        da.from_array(a, chunks=chunks[0]), da.from_array(b, chunks=chunks[1]))
    value = result.compute()
    expected = SK_MSE(a, b)
    assert isinstance(expected, np.float64)
    np.testing.assert_allclose(value, expected, rtol=rtol_for(*dtypes))


@pytest.mark.parametrize("normalization", [*NORMALIZATIONS, "Min-Max", "EUCLIDEAN"])
@pytest.mark.parametrize("dtypes", DTYPE_PAIRS, ids="-".join)
@pytest.mark.parametrize("chunks", CHUNKINGS[1:4], ids=str)
def test_normalized_root_mse_on_dask(normalization, dtypes, chunks):
    rng = np.random.default_rng(1)
    # a positive true image, so that 'mean' does not divide by a mean close to zero
    a = np.abs(image(rng, SHAPE, dtypes[0])) + 1
    b = image(rng, SHAPE, dtypes[1])
    result = dispatched(skimage.metrics.normalized_root_mse,
                        da.from_array(a, chunks=chunks[0]), da.from_array(b, chunks=chunks[1]),
                        normalization=normalization)
    np.testing.assert_allclose(result.compute(), SK_NRMSE(a, b, normalization=normalization),
                               rtol=rtol_for(*dtypes))


def test_default_normalization_keywords_and_three_dimensions():
    rng = np.random.default_rng(2)
    a, b = image(rng, (6, 11, 9), "float64"), image(rng, (6, 11, 9), "float64")
    x, y = da.from_array(a, chunks=(2, 5, 4)), da.from_array(b, chunks=(3, 11, 2))
    np.testing.assert_allclose(
        dispatched(skimage.metrics.normalized_root_mse, x, y).compute(), SK_NRMSE(a, b),
        rtol=1e-12)
    # images passed by keyword are found through the implementation's signature
    np.testing.assert_allclose(
        dispatched(skimage.metrics.mean_squared_error, image0=x, image1=y).compute(),
        SK_MSE(a, b), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["bool", "float16", "longdouble", "uint64", "int8"])
def test_dtypes_without_a_gpu_path_are_served_on_numpy_chunks(dtype):
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, 3, (2, 20, 9)).astype(dtype)
    x, y = da.from_array(a, chunks=(6, 4)), da.from_array(b, chunks=(7, 9))
    for normalization in NORMALIZATIONS:
        np.testing.assert_allclose(
            dispatched(skimage.metrics.normalized_root_mse, x, y,
                       normalization=normalization).compute(),
            SK_NRMSE(a, b, normalization=normalization), rtol=rtol_for(SK_MSE(a, a).dtype))
    np.testing.assert_allclose(dispatched(skimage.metrics.mean_squared_error, x, y).compute(),
                               SK_MSE(a, b), rtol=1e-12)


def test_dispatch_stays_lazy():
    """Neither can_has nor the dispatched call computes anything: the error comes at compute()."""

    def boom(block):
        raise RuntimeError("computed")

    good = da.ones((8, 8), chunks=4)
    bad = da.map_blocks(boom, good, dtype=good.dtype, meta=np.empty((0, 0)))
    assert ckb.can_has(MSE, bad, good)
    assert ckb.can_has(NRMSE, good, bad, normalization="min-max")
    result = dispatched(skimage.metrics.mean_squared_error, bad, good)
    with pytest.raises(RuntimeError, match="computed"):
        result.compute()


# -- errors, as scikit-image raises them ----------------------------------------------------------


def test_shape_mismatch_raises_scikit_image_error():
    a, b = np.ones((4, 5)), np.ones((5, 4))
    with pytest.raises(ValueError) as expected:
        SK_MSE(a, b)
    for function in (skimage.metrics.mean_squared_error, skimage.metrics.normalized_root_mse):
        with pytest.raises(ValueError, match=re.escape(str(expected.value))):
            not_dispatched(function, da.from_array(a, chunks=2), da.from_array(b, chunks=2))


@pytest.mark.parametrize("normalization", ["median", "minmax", None])
def test_unsupported_normalization_is_left_to_scikit_image(normalization):
    x = da.ones((4, 4), chunks=2)
    assert not ckb.can_has(NRMSE, x, x, normalization=normalization)
    with pytest.raises((ValueError, AttributeError)) as expected:
        SK_NRMSE(np.ones((4, 4)), np.ones((4, 4)), normalization=normalization)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        not_dispatched(skimage.metrics.normalized_root_mse, x, x, normalization=normalization)


def test_complex_images_are_refused_as_scikit_image_does():
    x = da.ones((4, 4), chunks=2, dtype="complex128")
    assert not ckb.can_has(MSE, x, x)
    with pytest.raises(ValueError, match="complex valued input is not supported"):
        not_dispatched(skimage.metrics.mean_squared_error, x, x)


# -- what is declined -----------------------------------------------------------------------------


def test_numpy_arrays_are_declined_by_default():
    rng = np.random.default_rng(3)
    a, b = image(rng, (1024, 1024), "float32"), image(rng, (1024, 1024), "float32")  # 4 MiB each
    assert not ckb.can_has(MSE, a, b)
    result = not_dispatched(skimage.metrics.mean_squared_error, a, b)
    assert isinstance(result, np.float64) and result == SK_MSE(a, b)
    result = not_dispatched(skimage.metrics.normalized_root_mse, a, b, normalization="mean")
    assert isinstance(result, np.float64) and result == SK_NRMSE(a, b, normalization="mean")


def test_numpy_opt_in_without_a_gpu_is_declined(monkeypatch, fake_gpu):
    fake_gpu(0)
    a = np.ones((512, 512))  # 2 MiB
    with ckb.accept_numpy(min_bytes=0):
        assert not ckb.can_has(MSE, a, a)
        assert not_dispatched(skimage.metrics.mean_squared_error, a, a) == 0.0
    monkeypatch.setenv(ckb.NUMPY_ENV, "1")
    assert not ckb.can_has(MSE, a, a)
    assert not_dispatched(skimage.metrics.normalized_root_mse, a, a) == 0.0


def test_numpy_opt_in_with_a_gpu_takes_large_arrays(monkeypatch, fake_gpu):
    """What the opt-in accepts, on a CPU machine that pretends to have a GPU (can_has only)."""
    fake_gpu(1)
    small, large = np.ones((100, 100)), np.ones((512, 512))  # 80 kB and 2 MiB
    assert not ckb.can_has(MSE, large, large)  # not opted in
    with ckb.accept_numpy():  # default threshold, 1 MiB
        assert ckb.can_has(MSE, large, large)
        assert ckb.can_has(NRMSE, large, large, normalization="Mean")
        assert not ckb.can_has(MSE, small, small)
        assert not ckb.can_has(MSE, large, large.astype("float16"))  # no GPU path for float16
        assert not ckb.can_has(NRMSE, large, large, normalization="median")
        with ckb.accept_numpy(enabled=False):
            assert not ckb.can_has(MSE, large, large)
        assert ckb.can_has(MSE, large, large)
    with ckb.accept_numpy(min_bytes=80_000):
        assert ckb.can_has(MSE, small, small)
        assert not ckb.can_has(MSE, small[:-1], small[:-1])
    monkeypatch.setenv(ckb.NUMPY_ENV, "1")
    assert ckb.numpy_policy() == (True, ckb.DEFAULT_MIN_BYTES)
    assert ckb.can_has(MSE, large, large) and not ckb.can_has(MSE, small, small)
    monkeypatch.setenv(ckb.MIN_BYTES_ENV, "80000")
    assert ckb.can_has(MSE, small, small)
    with ckb.accept_numpy(enabled=False):
        assert not ckb.can_has(MSE, large, large)
    monkeypatch.setenv(ckb.MIN_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match="CHUNKERNELS_SKIMAGE_MIN_BYTES='lots'"):
        ckb.can_has(MSE, large, large)


@pytest.mark.parametrize("min_bytes", [-1, 1.5, "1"])
def test_accept_numpy_checks_min_bytes(min_bytes):
    with pytest.raises(ValueError, match="min_bytes"), ckb.accept_numpy(min_bytes=min_bytes):
        pass


def test_accept_numpy_is_per_thread():
    inside, outside = threading.Barrier(2), []

    def opted_in():
        with ckb.accept_numpy(min_bytes=0):
            inside.wait()  # the other thread looks while this one is opted in
            inside.wait()

    def looks():
        inside.wait()
        outside.append(ckb.numpy_policy())
        inside.wait()

    threads = [threading.Thread(target=opted_in), threading.Thread(target=looks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outside == [(False, ckb.DEFAULT_MIN_BYTES)]
    assert ckb.numpy_policy() == (False, ckb.DEFAULT_MIN_BYTES)


def _declined_calls():
    x = da.from_array(np.arange(20.0).reshape(4, 5), chunks=2)
    n = np.arange(20.0).reshape(4, 5)
    masked = da.ma.masked_array(x)
    yield "numpy", MSE, (n, n), {}
    yield "lists", MSE, (n.tolist(), n.tolist()), {}
    yield "dask and numpy", MSE, (x, n), {}
    yield "numpy and dask", NRMSE, (n, x), {}
    yield "masked chunks", MSE, (masked, masked), {}
    yield "unknown shape", MSE, (x[x > 3], x[x > 3]), {}
    yield "different shapes", MSE, (x, x.T), {}
    yield "empty", MSE, (x[:0], x[:0]), {}
    yield "complex", MSE, (x, x.astype("complex64")), {}
    yield "object", MSE, (x.astype(object), x), {}
    yield "datetime", MSE, (x.astype("datetime64[s]"), x.astype("datetime64[s]")), {}
    yield "unknown keyword", MSE, (x, x), {"data_range": 1}
    yield "extra argument", MSE, (x, x, x), {}
    yield "missing argument", NRMSE, (x,), {}
    yield "normalization", NRMSE, (x, x), {"normalization": "median"}
    yield "not implemented", "skimage.metrics:peak_signal_noise_ratio", (x, x), {}
    yield "not a name", "mean_squared_error", (x, x), {}


@pytest.mark.parametrize(("name", "args", "kwargs"),
                         [c[1:] for c in _declined_calls()], ids=[c[0] for c in _declined_calls()])
def test_can_has_declines(name, args, kwargs):
    assert ckb.can_has(name, *args, **kwargs) is False


def test_served_dask_calls_and_declined_numpy_calls_do_not_touch_cupy():
    """No CuPy import is attempted and chunkernels asks for neither CuPy nor the GPU count.

    Both are checked because Dask imports CuPy itself where it is installed: an import statement
    for a module already imported reaches no import hook.
    """
    script = textwrap.dedent("""
        import json, sys
        import numpy as np, dask.array as da, skimage.metrics
        from chunkernels import cuda

        attempts, calls = [], []

        class Recorder:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("cupy", "cupyx", "cupy_backends"):
                    attempts.append(name)
                return None

        def spy(name):
            real = getattr(cuda, name)
            return lambda: (calls.append(name), real())[1]

        x = da.ones((8, 8), chunks=4)
        n = np.ones((1024, 1024))
        sys.meta_path.insert(0, Recorder())
        cuda.cupy, cuda.gpu_count = spy("cupy"), spy("gpu_count")
        skimage.metrics.mean_squared_error(x, x).compute()
        skimage.metrics.normalized_root_mse(x, x, normalization="min-max").compute()
        skimage.metrics.mean_squared_error(n, n)
        skimage.metrics.normalized_root_mse(n, n)
        print(json.dumps({"attempts": attempts, "calls": calls}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKERNELS_SKIMAGE")}
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"attempts": [], "calls": []}


# -- what the backend says it supports -------------------------------------------------------------


def test_info_lists_the_registry_mappings():
    from_registry = sorted({s for k in chunkernels.registered() for s in chunkernels.get(k).skimage})
    information = ckb.info()
    assert isinstance(information, BackendInformation)
    assert information.supported_functions == from_registry == [MSE, NRMSE]
    assert ckb.supported_functions() == from_registry


def test_the_documentation_lists_every_supported_function():
    page = (Path(__file__).resolve().parents[1] / "docs" / "skimage.md").read_text()
    for name in ckb.supported_functions():
        assert f"| `{name}` |" in page, f"docs/skimage.md does not list {name}"


def test_entry_points_name_the_backend():
    (backend,) = entry_points(group="skimage_backends", name="chunkernels")
    (info,) = entry_points(group="skimage_backend_infos", name="chunkernels")
    assert backend.load() is ckb.backend_interface
    assert info.load() is ckb.info
    assert ckb.backend_interface.can_has(MSE, da.ones(3, chunks=2), da.ones(3, chunks=2))
    assert ckb.backend_interface.get_implementation(MSE).__wrapped__ is metrics.mean_squared_error


def test_a_kernel_registered_later_is_listed_and_served():
    def negate(x):
        return np.negative(x)

    chunkernels.register(name="ck_test_negate", cpu=negate, skimage=("skimage.util:negate_it",))
    assert "skimage.util:negate_it" in ckb.info().supported_functions
    x = da.from_array(np.arange(12.0).reshape(3, 4), chunks=2)
    assert ckb.can_has("skimage.util:negate_it", x)
    assert not ckb.can_has("skimage.util:negate_it", x, x)  # the kernel takes no operand
    result = ckb.get_implementation("skimage.util:negate_it")(x)
    assert isinstance(result, da.Array)
    np.testing.assert_array_equal(result.compute(), -np.arange(12.0).reshape(3, 4))
    chunkernels.unregister("ck_test_negate")
    assert "skimage.util:negate_it" not in ckb.info().supported_functions
    assert not ckb.can_has("skimage.util:negate_it", x)
    with pytest.raises(KeyError, match="negate_it"):
        ckb.get_implementation("skimage.util:negate_it")


# -- on a GPU --------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtypes", DTYPE_PAIRS, ids="-".join)
def test_cupy_arrays_give_a_cupy_scalar(dtypes):
    import cupy as cp

    rng = np.random.default_rng(4)
    a, b = np.abs(image(rng, SHAPE, dtypes[0])) + 1, image(rng, SHAPE, dtypes[1])
    result = served(skimage.metrics.mean_squared_error, cp.asarray(a), cp.asarray(b))
    assert isinstance(result, cp.ndarray) and result.shape == () and result.dtype == np.float64
    np.testing.assert_allclose(result.get(), SK_MSE(a, b), rtol=rtol_for(*dtypes))
    for normalization in NORMALIZATIONS:
        result = served(skimage.metrics.normalized_root_mse, cp.asarray(a), cp.asarray(b),
                        normalization=normalization)
        assert isinstance(result, cp.ndarray) and result.shape == ()
        np.testing.assert_allclose(result.get(), SK_NRMSE(a, b, normalization=normalization),
                                   rtol=rtol_for(*dtypes))


@pytest.mark.gpu
def test_dask_with_cupy_chunks_stays_on_the_gpu():
    import cupy as cp

    rng = np.random.default_rng(5)
    a, b = image(rng, (300, 200), "float32"), image(rng, (300, 200), "uint8")
    x = da.from_array(cp.asarray(a), chunks=(64, 50), asarray=False)
    y = da.from_array(cp.asarray(b), chunks=(100, 37), asarray=False)
    result = dispatched(skimage.metrics.normalized_root_mse, x, y, normalization="min-max")
    assert isinstance(result._meta, cp.ndarray)
    value = result.compute()
    assert isinstance(value, cp.ndarray)
    np.testing.assert_allclose(value.get(), SK_NRMSE(a, b, normalization="min-max"), rtol=1e-12)


@pytest.mark.gpu
def test_numpy_opt_in_runs_on_the_gpu_and_returns_a_float(monkeypatch):
    rng = np.random.default_rng(6)
    a, b = image(rng, (512, 512), "float64"), image(rng, (512, 512), "float64")  # 2 MiB each
    # scikit-image's own results, before opting in: its normalized_root_mse calls the
    # dispatchable mean_squared_error, which the opt-in would send to the GPU
    expected_mse, expected_small = SK_MSE(a, b), SK_MSE(a[:10], b[:10])
    expected_nrmse = SK_NRMSE(a, b, normalization="mean")
    with ckb.accept_numpy():
        result = served(skimage.metrics.mean_squared_error, a, b)
        assert type(result) is np.float64
        np.testing.assert_allclose(result, expected_mse, rtol=1e-12)
        small = not_dispatched(skimage.metrics.mean_squared_error, a[:10], b[:10])
        assert small == expected_small
    monkeypatch.setenv(ckb.NUMPY_ENV, "1")
    result = served(skimage.metrics.normalized_root_mse, a, b, normalization="mean")
    assert type(result) is np.float64
    np.testing.assert_allclose(result, expected_nrmse, rtol=1e-12)


@pytest.mark.gpu
def test_mixed_cupy_and_numpy_is_declined():
    import cupy as cp

    a = np.ones((512, 512))
    with ckb.accept_numpy(min_bytes=0):
        assert not ckb.can_has(MSE, cp.asarray(a), a)
        assert not ckb.can_has(MSE, a, da.from_array(cp.asarray(a), asarray=False))
