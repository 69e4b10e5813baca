"""Bad inputs refused before any work, with what is wrong and how to fix it (issue #20).

:data:`BAD_INPUTS` declares the cases in one table: the call, the error and the start of its
message. :func:`test_bad_input_is_refused_before_any_work` checks each, with every kernel run and
every task graph forbidden; the documentation's hook (``docs/hooks.py``) renders the same table
into ``docs/errors.md``, each row with the message as the library raises it when the docs are
built. A case added here is tested and documented at once.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.ndimage as ndi

import chunkernels
import chunkernels.metrics
import chunkernels.signal  # imported here: a module imported under no_work would keep its fakes
from chunkernels import UnknownChunkSizesError, UnknownKernelError, _graph, ndimage
from chunkernels.ndimage import (FilterArgumentError, InterpolationError, LabelError,
                                 NonFiniteError, NonFiniteZoomError, OutputTooLargeError)

READ_ONLY = (r"^output array is read-only \(output\.flags\.writeable is False\), so the result "
             r"cannot be written into it; nothing was computed\. Pass a writeable array of the "
             r"result's shape \(numpy\.empty_like\(output\), or a copy\), or a dtype such as "
             r"output=numpy\.{dtype} for a new array$")

X = np.random.default_rng(0).random((12, 10))


# -- the table: every bad input, as the documentation shows it -------------------------------------


@dataclasses.dataclass(frozen=True)
class Bad:
    """One bad input: ``call`` (Python, evaluated in :func:`namespace`) raises ``error`` (that
    type or a subclass) with a message that starts as the regular expression ``message`` says.
    ``topic`` is its section of ``docs/errors.md``."""

    topic: str
    call: str
    error: type[Exception]
    message: str


FINITE = "Parameters that must be finite numbers"
TOO_LARGE = "Outputs no machine could hold"
UNKNOWN = "Dask arrays with unknown chunk sizes"
OUTPUTS = "Output arrays"
INDEXES = "Labels and label indexes"
KERNELS = "Kernels, parameters and pipelines"

_SIGMA = (r"give the Gaussian's standard deviation in pixels \(axes with sigma <= 1e-15 are not "
          r"filtered\)$")
_TRUNCATE = (r"give the number of standard deviations at which the Gaussian is cut \(default "
             r"4\.0\)$")
_SIZE = r"give the filter's length in pixels \(sizes up to 1 leave an axis unfiltered\)$"
_ZOOM = r"give the factor by which to scale each axis \(the output length is round\(n \* zoom\)\)$"
_TOO_LARGE = (r"chunkernels refuses outputs over 256\.00 TiB \(2\*\*48 bytes\), more than any "
              r"machine or cluster holds, before any work\. Check the zoom factors or output "
              r"shape \(a factor meant for one axis given for all\?\), or zoom a region of the "
              r"input$")


def _unknown(who, name="input"):
    return (rf"{who}: {name} has unknown chunk sizes along axis 0; call "
            rf"{name}\.compute_chunk_sizes\(\) first \(2 of its 2 chunk\(s\) there have size NaN, "
            rf"as Dask leaves them after boolean indexing such as x\[x > 0\]; {who} needs every "
            rf"block's size and place in the array\)$")


BAD_INPUTS = (
    Bad(FINITE, "ndimage.gaussian_filter(x, sigma=np.inf)", NonFiniteError,
        r"sigma must be a finite number: sigma=inf; " + _SIGMA),
    Bad(FINITE, "ndimage.gaussian_filter(d, sigma=[1.0, np.nan])", NonFiniteError,
        r"sigma must be a finite number: sigma=nan; " + _SIGMA),
    Bad(FINITE, "ndimage.gaussian_filter(d, 2.0, truncate=np.nan)", NonFiniteError,
        r"truncate must be a finite number: truncate=nan; " + _TRUNCATE),
    Bad(FINITE, "ndimage.gaussian_filter(x, 2.0, truncate=np.inf, radius=3)", NonFiniteError,
        r"truncate must be a finite number: truncate=inf; " + _TRUNCATE),
    Bad(FINITE, "ndimage.gaussian_filter(x, 1e308, truncate=10.0)", NonFiniteError,
        r"the Gaussian's radius int\(truncate \* sigma \+ 0\.5\) is infinite: sigma=1e\+308, "
        r"truncate=10\.0; give a smaller sigma or truncate, or radius= in pixels$"),
    Bad(FINITE, "ndimage.gaussian_filter1d(d, np.nan)", NonFiniteError,
        r"sigma must be a finite number: sigma=nan; " + _SIGMA),
    Bad(FINITE, "ndimage.gaussian_laplace(x, -np.inf)", NonFiniteError,
        r"sigma must be a finite number: sigma=-inf; " + _SIGMA),
    Bad(FINITE, "ndimage.gaussian_gradient_magnitude(d, 1.0, truncate=np.inf)", NonFiniteError,
        r"truncate must be a finite number: truncate=inf; " + _TRUNCATE),
    Bad(FINITE, "ndimage.uniform_filter(x, size=np.nan)", NonFiniteError,
        r"size must be a finite number: size=nan; " + _SIZE),
    Bad(FINITE, "ndimage.uniform_filter(d, size=[3, np.inf])", NonFiniteError,
        r"size must be a finite number: size=inf; " + _SIZE),
    Bad(FINITE, "ndimage.zoom(x, np.nan)", NonFiniteZoomError,
        r"zoom must be a finite number: zoom=nan for axis 0; " + _ZOOM),
    Bad(FINITE, "ndimage.zoom(d, [2.0, np.inf])", NonFiniteZoomError,
        r"zoom must be a finite number: zoom=inf for axis 1; " + _ZOOM),
    Bad(FINITE, "ndimage.zoom(x, 1e308)", NonFiniteZoomError,
        r"zoom=1e\+308 gives an infinite output length along axis 0 \(of 20 samples\); " + _ZOOM),
    Bad(TOO_LARGE, "ndimage.zoom(d, 1e6)", OutputTooLargeError,
        r"zoom: the output would be 3\.41 PiB: shape \(20000000, 24000000\) of float64 from an "
        r"input of shape \(20, 24\); " + _TOO_LARGE),
    Bad(TOO_LARGE, "ndimage.resize(x, (2**25, 2**25), output=np.float32)", OutputTooLargeError,
        r"resize: the output would be 4\.00 PiB: shape \(33554432, 33554432\) of float32 from an "
        r"input of shape \(20, 24\); " + _TOO_LARGE),
    Bad(UNKNOWN, "ndimage.label(u > 0.5)", UnknownChunkSizesError, _unknown("label")),
    Bad(UNKNOWN, "ndimage.zoom(u, 2)", UnknownChunkSizesError, _unknown("zoom")),
    Bad(UNKNOWN, "ndimage.resize(u, (4, 5))", UnknownChunkSizesError, _unknown("resize")),
    Bad(UNKNOWN, "ndimage.spline_filter(u)", UnknownChunkSizesError, _unknown("spline_filter")),
    Bad(UNKNOWN, "ndimage.gaussian_filter(u, 2.0)", UnknownChunkSizesError,
        _unknown("gaussian_filter", "x")),
    # a halo along axis 1 still places every block along axis 0 (whose sizes are unknown)
    Bad(UNKNOWN, "ndimage.uniform_filter1d(u, 3, axis=1)", UnknownChunkSizesError,
        _unknown("uniform_filter", "x")),  # its kernel
    Bad(UNKNOWN, "ndimage.correlate1d(u, [1.0, 2.0, 1.0], axis=1)", UnknownChunkSizesError,
        _unknown("correlate1d", "x")),
    Bad(UNKNOWN, "ndimage.gaussian_filter(u, 1.0, axes=(1,))", UnknownChunkSizesError,
        _unknown("gaussian_filter", "x")),
    Bad(UNKNOWN, "chunkernels.sources.kappa_sigma_clip(u)", UnknownChunkSizesError,
        _unknown("kappa_sigma_clip", "x")),
    Bad(UNKNOWN, "ndimage.center_of_mass(u)", UnknownChunkSizesError, _unknown("center_of_mass")),
    Bad(UNKNOWN, "ndimage.find_objects(ul)", UnknownChunkSizesError, _unknown("find_objects")),
    Bad(UNKNOWN, "ndimage.sum_labels(u, ul, [1, 2])", UnknownChunkSizesError,
        _unknown("sum_labels")),
    Bad(UNKNOWN, "ndimage.mean(d, labels=ud)", UnknownChunkSizesError,
        _unknown("mean", "labels")),
    Bad(UNKNOWN, "ndimage.median(u, ul, 1)", UnknownChunkSizesError, _unknown("median")),
    Bad(UNKNOWN, "ndimage.histogram(u, 0, 1, 4)", UnknownChunkSizesError, _unknown("histogram")),
    Bad(UNKNOWN, "ndimage.labeled_comprehension(u, ul, [1], np.max, float, 0)",
        UnknownChunkSizesError, _unknown("labeled_comprehension")),
    Bad(UNKNOWN, "ndimage.measure(u, ul)", UnknownChunkSizesError, _unknown("measure")),
    Bad(UNKNOWN, "chunkernels.signal.convolve2d(u, np.ones((3, 3)))", UnknownChunkSizesError,
        _unknown("convolve2d", "in1")),
    Bad(UNKNOWN, "chunkernels.metrics.mean_squared_error(u, u)", UnknownChunkSizesError,
        _unknown("mean_squared_error", "image_true")),
    Bad(UNKNOWN, "chunkernels.apply(u, 'label')", UnknownChunkSizesError, _unknown("label", "x")),
    Bad(OUTPUTS, "ndimage.gaussian_filter(x, 1.5, output=read_only)", FilterArgumentError,
        READ_ONLY[1:].format(dtype="float64")),
    Bad(OUTPUTS, "ndimage.zoom(x, 1, output=read_only)", InterpolationError,
        READ_ONLY[1:].format(dtype="float64")),
    Bad(OUTPUTS, "ndimage.gaussian_filter(d, 1.5, output=np.empty((20, 24)))", TypeError,
        r"output= cannot be an array for a Dask input \(the result is lazy\); pass a dtype, e\.g\. "
        r"output='float64'$"),
    Bad(INDEXES, "ndimage.sum_labels(d, ld, [1.5])", ValueError,
        r"sum_labels: the index holds 1\.5, not integer label numbers\. With labels of dtype "
        r"int64, scipy\.ndimage truncates such values"),
    Bad(INDEXES, "ndimage.mean(x, labels, [2.0, np.nan])", ValueError,
        r"mean: the index holds nan, not integer label numbers"),
    Bad(INDEXES, "ndimage.sum_labels(d, ld, [-1, 2**64 - 1])", ValueError,
        r"index holds the integers -1 and 18446744073709551615, which no integer dtype holds "
        r"together"),
    Bad(INDEXES, "ndimage.find_objects(huge_label)", MemoryError,
        r"find_objects: the largest label is 4611686018427387904, and the result lists one "
        r"entry per label number from 1 to it, present or not"),
    Bad(INDEXES, "ndimage.label(x, structure=np.ones((3, 2)))", LabelError,
        r"structure dimensions must be equal to 3: got shape \(3, 2\); pass a structure of shape "
        r"\(3, 3\)$"),
    Bad(KERNELS, "chunkernels.apply(x, 'gaussian_filter', sigma=1, sigmaa=2)", TypeError,
        r"gaussian_filter got unknown parameter 'sigmaa' \(did you mean 'sigma'\?\); "
        r"gaussian_filter takes sigma \(required\), order, mode, cval, truncate, radius, axes, "
        r"output$"),
    Bad(KERNELS, "chunkernels.apply(x, 'broadcast_add', 'a')", TypeError,
        r"broadcast_add: operand other is str 'a'; expected an array \(NumPy, CuPy or Dask\) or "
        r"a number$"),
    Bad(KERNELS, "chunkernels.apply(d, 'broadcast_add', None)", TypeError,
        r"broadcast_add: operand other is NoneType None; expected an array"),
    Bad(KERNELS, "chunkernels.apply(x, 'broadcast_add', 1.0, strict='yes')", TypeError,
        r"broadcast_add: strict='yes'; expected True or False$"),
    Bad(KERNELS, "chunkernels.pipeline('gaussian_filter')", TypeError,
        r"pipeline\(\) takes a list of steps; got one step, 'gaussian_filter': wrap it in a list"),
    Bad(KERNELS, "chunkernels.apply(x, 'gausian_filter', sigma=1)", UnknownKernelError,
        r"no kernel named 'gausian_filter'; did you mean 'gaussian_filter' or 'spline_filter' or "
        r"'gaussian_laplace'\? registered kernels: "),
    Bad(KERNELS, "chunkernels.pipeline([('gaussian_filter', {'sigma': 2.0}), 'label'])", TypeError,
        r"pipeline step label is not blockwise"),
    Bad(KERNELS, "chunkernels.apply(d, 'gaussian_filter', sigma=30.0)", chunkernels.HaloError,
        r"gaussian_filter: the halo the kernel's parameters need is not smaller than the array "
        r"along an axis of several chunks"),
)


def namespace() -> dict:
    """The names the calls of :data:`BAD_INPUTS` use (``docs/errors.md`` lists them too)."""
    x = np.random.default_rng(0).random((20, 24))
    d = da.from_array(x, chunks=10)
    rows = d[:, 0] > -1  # every row, but Dask cannot know how many before computing it:
    u = d[rows]          # unknown chunk sizes along axis 0
    ul = (u > 0.5).astype(np.int64)
    labels = ndi.label(x > 0.5)[0].astype(np.int64)
    ld = da.from_array(labels, chunks=10)
    ud = ld[rows]
    huge_label = np.zeros((4, 4), np.int64)
    huge_label[1, 1] = 2**62
    read_only = np.zeros((20, 24))
    read_only.setflags(write=False)
    return {"np": np, "da": da, "chunkernels": chunkernels, "ndimage": ndimage, "x": x, "d": d,
            "u": u, "ul": ul, "labels": labels, "ld": ld, "ud": ud, "huge_label": huge_label,
            "read_only": read_only}


def raised(case: Bad, names: dict | None = None) -> BaseException | None:
    """What ``case.call`` raises (``None`` if nothing), warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            eval(case.call, namespace() if names is None else names)  # noqa: S307 - our table
        except Exception as exc:  # noqa: BLE001 - the table says which
            return exc
    return None


@pytest.fixture
def names() -> dict:
    return namespace()


@pytest.fixture
def no_work(monkeypatch, names):
    """Every kernel run and every task graph chunkernels builds fails the test (once
    :func:`namespace` has made the arrays)."""
    def work(*args, **kwargs):
        raise AssertionError("work was done before the bad input was refused")

    for module in (chunkernels._apply, chunkernels._dispatch):
        monkeypatch.setattr(module, "run_block", work)
    monkeypatch.setattr(_graph.Tasks, "__init__", work)
    monkeypatch.setattr(chunkernels.kernels.zoom, "zoom_tables", work)
    monkeypatch.setattr(ndi, "label", work)


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda case: case.call)
def test_bad_input_is_refused_before_any_work(case, names, no_work):
    """Issue #20: each bad input gets its error, saying what is wrong, the values seen and the
    fix, before any kernel runs or any graph is built (a 3.8 PB zoom spent 24 s and 5 GB on its
    graph; unknown chunk sizes failed at compute with "cannot convert float NaN to integer";
    NaN and infinite parameters said only "cannot convert float NaN to integer")."""
    exc = raised(case, names)
    assert isinstance(exc, case.error), f"{case.call} raised {exc!r}, not {case.error.__name__}"
    assert re.match(case.message, str(exc)), f"{case.call}: {exc}"


# -- read-only outputs -----------------------------------------------------------------------------

FRONT_ENDS = {
    "gaussian_filter": (lambda out: ndimage.gaussian_filter(X, 1.5, output=out), X.shape),
    "gaussian_filter1d": (lambda out: ndimage.gaussian_filter1d(X, 1.5, output=out), X.shape),
    "uniform_filter": (lambda out: ndimage.uniform_filter(X, 3, output=out), X.shape),
    "correlate1d": (lambda out: ndimage.correlate1d(X, [1, 2, 1], output=out), X.shape),
    "convolve": (lambda out: ndimage.convolve(X, np.ones((3, 3)), output=out), X.shape),
    "sobel": (lambda out: ndimage.sobel(X, output=out), X.shape),
    "laplace": (lambda out: ndimage.laplace(X, output=out), X.shape),
    "gaussian_gradient_magnitude": (
        lambda out: ndimage.gaussian_gradient_magnitude(X, 1.0, output=out), X.shape),
    "zoom": (lambda out: ndimage.zoom(X, 2, output=out), (24, 20)),
    "resize": (lambda out: ndimage.resize(X, (7, 9), output=out), (7, 9)),
    "spline_filter": (lambda out: ndimage.spline_filter(X, output=out), X.shape),
    "label": (lambda out: ndimage.label(X > 0.5, output=out), X.shape),
}
ERRORS = {"zoom": ndimage.InterpolationError, "resize": ndimage.InterpolationError,
          "spline_filter": ndimage.InterpolationError, "label": ndimage.LabelError}


@pytest.mark.parametrize("name", FRONT_ENDS)
def test_a_read_only_output_array_is_refused_before_any_work(name, monkeypatch):
    """Issue #20: a read-only ``output=`` failed only once the whole filter had run (and SciPy's
    ``label`` writes into it regardless)."""
    call, shape = FRONT_ENDS[name]
    dtype = np.int32 if name == "label" else np.float64
    out = np.zeros(shape, dtype)
    out.setflags(write=False)

    def no_work(*args, **kwargs):
        raise AssertionError("the kernel ran before the output was checked")

    monkeypatch.setattr(chunkernels._apply, "run_block", no_work)
    monkeypatch.setattr(ndi, "label", no_work)
    with pytest.raises(ERRORS.get(name, ndimage.FilterArgumentError),
                       match=READ_ONLY.format(dtype=np.dtype(dtype).name)) as caught:
        call(out)
    assert isinstance(caught.value, ValueError)  # what scipy raises ("output array is read-only")
    assert not out.any()
    monkeypatch.undo()
    writable = np.zeros(shape, dtype)
    call(writable)  # the same call with a writeable output fills it
    assert writable.any()


# -- big-endian data: taken as SciPy takes it ------------------------------------------------------

B = np.random.default_rng(1).random((12, 10))
LB = ndi.label(B > 0.5)[0]

#: One call of every front end family, on ``(x, labels)``: name -> function.
BYTE_ORDER_CALLS = {
    "gaussian_filter": lambda x, lab: ndimage.gaussian_filter(x, 1.5),
    "gaussian_filter1d": lambda x, lab: ndimage.gaussian_filter1d(x, 2.0, order=1),
    "uniform_filter": lambda x, lab: ndimage.uniform_filter(x, 3, mode="wrap"),
    "uniform_filter1d": lambda x, lab: ndimage.uniform_filter1d(x, 4),
    "correlate1d": lambda x, lab: ndimage.correlate1d(x, np.array([1, 2, 1], ">f8")),
    "convolve1d": lambda x, lab: ndimage.convolve1d(x, [1, -1, 3]),
    "correlate": lambda x, lab: ndimage.correlate(x, np.ones((3, 2), ">i4")),
    "convolve": lambda x, lab: ndimage.convolve(x, np.ones((3, 3)), mode="nearest"),
    "sobel": lambda x, lab: ndimage.sobel(x, axis=0),
    "prewitt": lambda x, lab: ndimage.prewitt(x),
    "laplace": lambda x, lab: ndimage.laplace(x),
    "gaussian_laplace": lambda x, lab: ndimage.gaussian_laplace(x, 1.0),
    "gaussian_gradient_magnitude": lambda x, lab: ndimage.gaussian_gradient_magnitude(x, 1.0),
    "zoom": lambda x, lab: ndimage.zoom(x, 1.5),
    "resize": lambda x, lab: ndimage.resize(x, (7, 15), order=1),
    "spline_filter": lambda x, lab: ndimage.spline_filter(x),
    "spline_filter1d": lambda x, lab: ndimage.spline_filter1d(x, axis=0),
    "label": lambda x, lab: ndimage.label(x > 0.5)[0],
    "sum_labels": lambda x, lab: ndimage.sum_labels(x, lab, [1, 2, 3]),
    "mean": lambda x, lab: ndimage.mean(x, lab, [1, 2]),
    "variance": lambda x, lab: ndimage.variance(x, lab),
    "minimum": lambda x, lab: ndimage.minimum(x, lab, [1, 2]),
    "maximum_position": lambda x, lab: ndimage.maximum_position(x, lab, [1, 2]),
    "extrema": lambda x, lab: ndimage.extrema(x, lab, 1)[:2],
    "center_of_mass": lambda x, lab: ndimage.center_of_mass(x, lab, [1, 2]),
    "median": lambda x, lab: ndimage.median(x, lab, [1, 2]),
    "histogram": lambda x, lab: ndimage.histogram(x, 0, 100, 5, lab, 1),
    "area": lambda x, lab: ndimage.area(x, lab, [1, 2]),
    "find_objects": lambda x, lab: ndimage.find_objects(lab),
    "convolve2d": lambda x, lab: chunkernels.signal.convolve2d(x, np.ones((2, 3)), mode="same"),
    "mean_squared_error": lambda x, lab: chunkernels.metrics.mean_squared_error(x, x[::-1]),
}


def _computed(result):
    """A result of any front end with Dask parts computed, as nested NumPy values."""
    from dask.delayed import Delayed

    if isinstance(result, (list, tuple)):
        return [_computed(r) for r in result]
    if _graph.is_dask(result) or isinstance(result, Delayed):
        return _computed(result.compute())
    return result


@pytest.mark.parametrize("backend", ["numpy", "dask"])
@pytest.mark.parametrize("dtype", [">f8", ">i4", ">u2"])
@pytest.mark.parametrize("name", BYTE_ORDER_CALLS)
def test_big_endian_input_gives_what_native_input_gives(name, dtype, backend):
    """Issue #20: big-endian input (``>f8`` from FITS files) got "array type >f8 not supported"
    from the filters and zoom, which SciPy takes. It is swapped to native once at the entry, on
    NumPy and Dask arrays: the results equal the native input's, in the dtype SciPy gives."""
    call = BYTE_ORDER_CALLS[name]
    native = (B * 100).astype(np.dtype(dtype).newbyteorder("="))
    native_labels = LB.astype(np.int64 if dtype != ">u2" else np.uint16)
    swapped, labels = native.astype(dtype), native_labels.astype(native_labels.dtype.newbyteorder())
    assert not swapped.dtype.isnative and not labels.dtype.isnative
    if backend == "dask":
        native, native_labels, swapped, labels = (da.from_array(a, chunks=5) for a in (
            native, native_labels, swapped, labels))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = _computed(call(native, native_labels))
        got = _computed(call(swapped, labels))
    if isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.dtype.isnative, (got.dtype, expected.dtype)
    np.testing.assert_equal(got, expected)


@pytest.mark.parametrize("backend", ["numpy", "dask"])
@pytest.mark.parametrize("fn, args", [
    ("gaussian_filter", (1.0,)), ("uniform_filter", (3,)), ("correlate1d", ([1.0, 2.0],)),
    ("zoom", (2,)), ("spline_filter", ())])
def test_a_big_endian_output_dtype_is_returned_as_scipy_returns_it(fn, args, backend):
    """SciPy returns the byte order an ``output`` dtype asks for (``'>f8'``); so do these, having
    computed in the native one."""
    expected = getattr(ndi, fn)(B, *args, output=">f8")
    x = da.from_array(B, chunks=5) if backend == "dask" else B
    got = getattr(ndimage, fn)(x, *args, output=">f8")
    assert got.dtype == np.dtype(">f8") == expected.dtype
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-13)
    out = np.empty(expected.shape, ">f8")  # an output array of that dtype is filled in place
    if backend == "numpy":
        assert getattr(ndimage, fn)(B, *args, output=out) is out
        np.testing.assert_allclose(out, expected, rtol=1e-13)
