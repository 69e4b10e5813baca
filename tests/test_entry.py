"""The public entry (chunkernels.interop.array_entry) and the array kind it decides
(chunkernels._kind.ArrayKind): decided once per call, passed down, never part of the public
signature. Tensors and DataArrays through it: tests/test_interop.py, tests/test_xarray.py."""

from __future__ import annotations

import inspect

import dask.array as da
import numpy as np
import pytest

import chunkernels
from chunkernels import _kind, cuda, metrics, ndimage, signal, sources
from chunkernels._kind import CUPY, DASK_CUPY, DASK_NUMPY, NUMPY, ArrayKind
from chunkernels.interop import array_entry


def test_kinds_of_arrays():
    x = np.arange(6.0).reshape(2, 3)
    assert ArrayKind.of(x) == NUMPY and ArrayKind.of(x[:, ::-1]) == NUMPY
    assert ArrayKind.of(da.from_array(x, chunks=1)) == DASK_NUMPY
    for other in ([1, 2], 3.0, None, "x"):
        assert ArrayKind.of(other) is None
    assert (NUMPY.dask, NUMPY.gpu, DASK_NUMPY.dask, DASK_CUPY.gpu) == (False, False, True, True)
    assert DASK_NUMPY.chunks == NUMPY and DASK_CUPY.chunks == CUPY and NUMPY.chunks == NUMPY
    assert NUMPY.xp is np
    assert repr(DASK_NUMPY) == "ArrayKind(dask of numpy)" and repr(CUPY) == "ArrayKind(cupy)"


def test_kind_conversions():
    x = np.arange(6.0).reshape(2, 3)
    meta = DASK_NUMPY.meta(np.float32, 3)
    assert type(meta) is np.ndarray and meta.shape == (0, 0, 0) and meta.dtype == np.float32
    lazy = DASK_NUMPY.from_host(x)
    assert isinstance(lazy, da.Array) and lazy.numblocks == (1, 1)
    np.testing.assert_array_equal(DASK_NUMPY.to_host(lazy), x)
    assert NUMPY.from_host(x) is x and NUMPY.to_host(x) is x
    assert DASK_NUMPY.from_host(np.float64(2.0)).shape == ()


@pytest.mark.gpu
def test_cupy_kinds():
    cp = cuda.cupy()
    x = cp.arange(6.0)
    assert ArrayKind.of(x) == CUPY and CUPY.xp is cp
    assert ArrayKind.of(da.from_array(x, chunks=2, asarray=False)) == DASK_CUPY
    assert isinstance(DASK_CUPY.meta(np.float64, 1), cp.ndarray)
    assert isinstance(CUPY.to_host(x), np.ndarray)
    assert isinstance(DASK_CUPY.from_host(np.ones(3))._meta, cp.ndarray)


def test_is_dask_imports_nothing():
    assert _kind.is_dask(da.ones(3)) and not _kind.is_dask(np.ones(3))
    assert chunkernels._graph.is_dask is _kind.is_dask


# -- the decorator ---------------------------------------------------------------------------------


@array_entry("x", "out")
def _probe(kind, x, scale=1.0, out=None):
    """A public function: gets the kind."""
    return kind, x


@array_entry("x", coerce=False)
def _strict(kind, x):
    return kind, x


class _Holder:
    @array_entry("x")
    def method(self, kind, x, *, k=1):
        return self, kind, x


def test_the_kind_is_passed_and_hidden_from_the_signature():
    x = np.ones(3)
    kind, got = _probe(x)
    assert kind == NUMPY and got is x
    assert _probe(x=da.ones(3))[0] == DASK_NUMPY
    assert list(inspect.signature(_probe).parameters) == ["x", "scale", "out"]
    with pytest.raises(TypeError, match="kind"):
        _probe(x, kind=NUMPY)
    holder = _Holder()
    assert holder.method(x, k=2) == (holder, NUMPY, x)
    assert list(inspect.signature(_Holder.method).parameters) == ["self", "x", "k"]


def test_array_likes_are_made_numpy_unless_refused():
    kind, got = _probe([[1, 2], [3, 4]])
    assert kind == NUMPY and isinstance(got, np.ndarray) and got.shape == (2, 2)
    assert _strict([1, 2]) == (None, [1, 2])
    with pytest.raises(TypeError, match=r"apply takes a dask.array.Array.*got builtins.list"):
        chunkernels.apply([1.0, 2.0], "threshold", value=0.5)
    with pytest.raises(TypeError, match="a pipeline takes"):
        chunkernels.pipeline(["threshold"])([1.0, 2.0])


def test_a_missing_input_is_named():
    with pytest.raises(TypeError, match="required argument: 'x'"):
        _probe(scale=2.0)
    with pytest.raises(TypeError, match="input"):
        ndimage.sobel()


def test_public_signatures_have_no_kind():
    """Every public function under the entry shows the signature a caller uses."""
    public = [chunkernels.apply, chunkernels.Pipeline.apply, signal.convolve2d,
              metrics.mean_squared_error, metrics.normalized_root_mse, sources.threshold,
              sources.kappa_sigma_clip, sources.find_sources]
    public += [getattr(ndimage, name) for name in dir(ndimage)
               if callable(getattr(ndimage, name)) and not name[0].isupper()
               and not name.startswith("_")]
    for fn in public:
        assert "kind" not in inspect.signature(fn).parameters, fn.__qualname__


def test_apply_passes_a_kernel_parameter_named_kind_to_the_kernel():
    """``apply``'s kind is positional-only: ``kind=`` among the kernel's parameters is theirs."""
    with pytest.raises(TypeError, match="threshold got unknown parameter 'kind'"):
        chunkernels.apply(np.ones(3), "threshold", value=0.5, kind="the kernel's")


# -- decided once ------------------------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda x: signal.convolve2d(x, np.ones((3, 3))),
    lambda x: signal.convolve2d(x, np.ones((3, 3)), "valid"),
    lambda x: ndimage.gaussian_filter(x, 2.0),
    lambda x: ndimage.uniform_filter(x, 3, output=np.float32),
    lambda x: ndimage.spline_filter(x, 3),
    lambda x: sources.threshold(x, 0.5),
    lambda x: metrics.mean_squared_error(x, x * 2),
    lambda x: chunkernels.pipeline([("threshold", {"value": 0.5})])(x),
    lambda x: chunkernels.apply(x, "broadcast_add", np.ones(40)),
], ids=["convolve2d full", "convolve2d valid", "gaussian_filter", "uniform_filter",
        "spline_filter", "threshold", "mean_squared_error", "pipeline", "apply"])
def test_the_kind_is_asked_once(monkeypatch, call):
    """The entry decides the kind; building the graph below it never asks the array again."""
    x = da.from_array(np.random.default_rng(0).random((40, 40)), chunks=16)
    asked = []
    original = ArrayKind.of
    monkeypatch.setattr(ArrayKind, "of", staticmethod(lambda a: asked.append(a) or original(a)))

    def no_more(a, *rest):
        raise AssertionError(f"the kind of {type(a).__name__} asked again below the entry")

    monkeypatch.setattr(cuda, "array_module", no_more)
    monkeypatch.setattr(chunkernels._graph, "meta", no_more)
    result = call(x)
    assert sum(a is x for a in asked) == 1
    assert isinstance(result, da.Array)


def test_accepts_tensors_is_the_deprecated_name_of_array_entry():
    with pytest.warns(DeprecationWarning, match="use array_entry"):
        decorate = chunkernels.interop.accepts_tensors("x")

    @decorate
    def double(x):
        return x * 2

    np.testing.assert_array_equal(double(np.arange(3)), [0, 2, 4])
