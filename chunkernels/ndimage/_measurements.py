"""scipy.ndimage's measurements of labelled images on NumPy, CuPy and Dask arrays (PyTorch
tensors and xarray DataArrays: their data), and :func:`measure`, several properties of every
label in one pass.

NumPy inputs run scipy.ndimage itself. CuPy inputs run the ``label_statistics`` kernel on the
device; Dask inputs one partial-statistics task per chunk and one combine task (the kernel's
``dask_graph``), whatever the number of labels. Values equal scipy's; the containers follow, for
CuPy, cupyx.scipy.ndimage (0-d CuPy arrays where scipy returns scalars, CuPy arrays where it
returns arrays, host tuples of integers for positions, which index arrays) and, for Dask,
dask-image's ``dask_image.ndmeasure`` (lazy Dask arrays).

Every function checks its arguments before any work is done, with the same errors for every
array type.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import math
import numbers
import operator
import os
import sys

import numpy as np
import scipy.ndimage as ndi

from chunkernels import _graph, cuda
from chunkernels._graph import as_input, is_dask
from chunkernels.interop import array_entry
from chunkernels.kernels import label_statistics

#: The properties :func:`measure` returns by default.
DEFAULT_PROPERTIES = ("label", "area", "sum", "mean", "min", "max", "centroid", "bbox")
#: Every property :func:`measure` knows, and the statistics each needs from the kernel.
PROPERTIES = {
    "label": (), "area": ("count",), "sum": ("sum",), "mean": ("sum", "count"),
    "variance": ("m2",), "standard_deviation": ("m2",), "min": ("min",), "max": ("max",),
    "min_position": ("min_position",), "max_position": ("max_position",),
    "centroid": ("centroid",), "center_of_mass": ("com",), "bbox": ("bbox",),
}
_PER_AXIS = {"min_position", "max_position", "centroid", "center_of_mass"}
_EMPTY = "zero-size array to reduction operation {} which has no identity"
#: Measurements that refuse an index their labels' dtype cannot hold with scipy's own check and
#: message (:func:`_check_index_precision`), instead of :func:`_check_integral_index`.
_OWN_INDEX_CHECK = ("labeled_comprehension", "histogram")


# -- arguments -------------------------------------------------------------------------------------


class _Query:
    """A measurement's arguments, checked and normalised.

    ``backend`` is ``"numpy"``, ``"cupy"`` or ``"dask"``; ``x`` and ``labels`` are broadcast to
    one ``shape`` (``labels`` is ``x`` itself when there are none: every element is then one
    region); ``dtype`` is the input's. ``select`` and ``keys`` are the kernel's slots; ``values``
    is the flattened index and ``slots`` its entries' table rows (-1: no label can equal it);
    ``single`` results are scalar-shaped, others have ``out_shape``, the index's shape.
    """

    def __init__(self, backend, x, labels, dtype, shape):
        self.backend, self.x, self.dtype, self.shape = backend, x, dtype, shape
        self.labels = x if labels is None else labels
        self.select, self.keys, self.slots, self.values = "all", None, None, None
        self.single, self.identity, self.out_shape = True, True, ()
        self.scipy = None  # NumPy input: the arrays as given, for scipy.ndimage


def _query(name, input, labels, index=None, *, complex_ok=False):
    """Check and normalise ``input``, ``labels`` and ``index`` for measurement ``name``
    (``complex_ok``: its CuPy and Dask paths take complex values)."""
    x = as_input(input, name, chunk_sizes=True)
    lab = None if labels is None else as_input(labels, name, "labels", chunk_sizes=True)
    if x.dtype.kind not in "biufc":
        raise TypeError(f"{name}: input must be a boolean, integer or float array; got dtype "
                        f"{x.dtype}")
    if lab is not None and lab.dtype.kind not in "biuf":
        raise TypeError(f"{name}: labels must be a boolean, integer or float array; got dtype "
                        f"{lab.dtype}")
    dask = is_dask(x) or is_dask(lab)
    backend = "dask" if dask else "cupy" if cuda.is_cupy_array(x) else "numpy"
    if x.dtype.kind == "c" and backend != "numpy" and not complex_ok:
        raise TypeError(f"{name}: complex input is not supported here (scipy.ndimage takes it "
                        f"for NumPy input of sum_labels, mean and variance); got dtype {x.dtype}")
    shape = x.shape
    if lab is not None:
        try:
            shape = np.broadcast_shapes(x.shape, lab.shape)
        except ValueError:
            raise ValueError(
                f"input and labels must have the same shape (excepting dimensions with width 1): "
                f"input has shape {x.shape}, labels {lab.shape}; give labels of the input's shape "
                f"(or one that broadcasts to it)") from None
    values = None
    if lab is not None and index is not None:
        values = _host(index)
        if name not in _OWN_INDEX_CHECK:
            _check_integral_index(name, index, values, lab.dtype)
    if backend == "numpy":
        if cuda.is_cupy_array(lab):
            lab = lab.get()
        q = _Query(backend, np.broadcast_to(x, shape),
                   None if lab is None else np.broadcast_to(lab, shape), x.dtype, shape)
        q.scipy = (x, lab)
        return q
    dtype = x.dtype
    if backend == "dask":
        import dask.array as da

        if not is_dask(x):
            x = da.from_array(x, chunks=lab.chunks if lab.shape == x.shape else "auto",
                              asarray=False)
        if x.shape != shape:
            x = da.broadcast_to(x, shape)
        lab = x if lab is None else label_statistics.as_dask_operand(lab, x)
    else:
        cp = cuda.cupy()
        with x.device:
            lab = x if lab is None else cp.asarray(lab)
        x, lab = cp.broadcast_to(x, shape), cp.broadcast_to(lab, shape)
    q = _Query(backend, x, lab, dtype, shape)
    if labels is not None:
        _plan_index(q, values)
    return q


def _device(q):
    """The CuPy input's device as a context (allocations and launches go there); else none."""
    return q.x.device if q.backend == "cupy" else contextlib.nullcontext()


def _host(a):
    """A small array argument (the index) on the host; a list of integers exactly (NumPy makes
    ``[1, 2**64 - 1]`` float64, which holds ``2**64 - 1`` as ``2**64``)."""
    if isinstance(a, range):  # numpy.asarray would walk it item by item
        return np.arange(a.start, a.stop, a.step)
    if is_dask(a):
        a = a.compute()
    values = cuda.to_host(a)
    if values.dtype.kind in "fO" and isinstance(a, list | tuple):
        return _exact_integers(values, a)
    return values


def _exact_integers(values, given):
    """``given``, a (nested) list that NumPy made ``values`` of, as uint64 or int64 when it holds
    Python or NumPy integers only; else ``values`` unchanged."""
    items = np.asarray(given, dtype=object)
    flat = items.reshape(-1).tolist()
    if not flat or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool | np.bool_)
                           for v in flat):
        return values
    lo, hi = min(flat), max(flat)
    for dtype in (np.int64, np.uint64):
        if np.iinfo(dtype).min <= lo and hi <= np.iinfo(dtype).max:
            return np.array(flat, dtype=dtype).reshape(items.shape)
    raise ValueError(
        f"index holds the integers {lo} and {hi}, which no integer dtype holds together (labels "
        f"are int64 from {np.iinfo(np.int64).min} or uint64 up to {np.iinfo(np.uint64).max}); "
        f"give the index as an array of the labels' dtype, without the values it cannot hold "
        f"(no label can equal them)")


def _scipy_truncates(labels_dtype) -> bool:
    """Whether scipy.ndimage converts an index to ``intp`` for labels of ``labels_dtype`` (its
    ``_safely_castable_to_int``), truncating non-integral values, instead of matching exactly."""
    dt = np.dtype(labels_dtype)
    size = np.dtype(np.intp).itemsize
    return (dt.kind == "i" and dt.itemsize <= size) or (dt.kind == "u" and dt.itemsize < size)


def _check_integral_index(name, index, values, labels_dtype):
    """Refuse an index sequence holding values that are not integers (2.5, NaN, infinity) with
    integer labels, before any work: scipy has no one answer for them (issue #20)."""
    if np.isscalar(index) or values.dtype.kind != "f" or not _scipy_truncates(labels_dtype):
        return  # a scalar is compared exactly by scipy (labels == index), as here
    with np.errstate(invalid="ignore"):
        bad = values[~(np.isfinite(values) & (values == np.trunc(values)))]
    if not bad.size:
        return
    shown = ", ".join(map(str, np.unique(bad)[:5].tolist())) + (", ..." if bad.size > 5 else "")
    raise ValueError(
        f"{name}: the index holds {shown}, not integer label numbers. With labels of dtype "
        f"{np.dtype(labels_dtype)}, scipy.ndimage truncates such values (2.5 to label 2) when "
        f"every label lies in 0..labels.size, matches no label otherwise, and raises for NaN or "
        f"infinity in some functions: the result would depend on the labels' values, so they "
        f"are refused. Give integer label numbers: index=numpy.trunc(index).astype(int) for "
        f"scipy's truncation, or leave those values out")


def _plan_index(q, index):
    """The slots of ``index`` (``None``: the labels > 0 as one region)."""
    if index is None:
        q.select = "positive"
        return
    values = _host(index)
    if values.dtype.kind not in "biuf":
        raise TypeError(f"index must hold label values (booleans, integers or floats); got "
                        f"dtype {values.dtype}")
    q.select, q.single = "index", values.ndim == 0
    q.out_shape = values.shape
    q.values = values.reshape(-1)
    flat = q.values
    if flat.size and not np.all(flat[1:] > flat[:-1]):
        unique, inverse = np.unique(flat, return_inverse=True)
    else:
        unique, inverse = flat, None
    valid, keys = label_statistics.label_keys(unique, q.labels.dtype)
    every = bool(valid.all())
    q.keys = keys if every else keys[valid]
    slot_of = np.arange(unique.size) if every else np.where(valid, np.cumsum(valid) - 1, -1)
    q.slots = slot_of if inverse is None else slot_of[inverse.reshape(-1)]
    q.identity = inverse is None and every


def _require_data(q, name):
    """scipy's error for an index of labels over an empty input (its ``labels.min()``)."""
    if q.select == "index" and not q.single and math.prod(q.shape) == 0:
        raise ValueError(_EMPTY.format("minimum"))


# -- the table and what is read from it -------------------------------------------------------------


def _table(q, stats):
    """The kernel's table for the query: computed (CuPy) or lazy (Dask)."""
    params = label_statistics.validate(len(q.shape), stats=stats, select=q.select, index=q.keys)
    if q.backend == "dask":
        return label_statistics.dask_graph(q.x, q.labels, **params)
    if q.backend == "cupy":
        # one row per slot, in order: the table
        return label_statistics.dispatch(q.x, q.labels, **params)
    return label_statistics.reference(q.x, q.labels, **params)


class _Rows:
    """How the table becomes a result: the row each output entry reads (an empty row where the
    label is absent), the result's shape, the input's dtype and shape. Picklable, so Dask tasks
    carry it."""

    def __init__(self, q, stats):
        self.single, self.slots, self.identity = q.single, q.slots, q.identity
        self.shape, self.dtype, self.array_shape = q.out_shape, q.dtype, q.shape
        self.lay = label_statistics.Layout.of(label_statistics.normalise_stats(stats), len(q.shape))

    def rows(self, table):
        if self.identity:
            return table
        xp = cuda.array_module(table)
        padded = xp.concatenate([table, label_statistics.empty_rows(xp, 1, self.lay)])
        return padded[xp.asarray(np.where(self.slots < 0, table.shape[0], self.slots))]

    def column(self, rows, name):
        return rows[:, getattr(self.lay, name)].reshape(self.shape)


def _result(q, stats, fmt, dtype, shape=None):
    """``fmt(_Rows, table)``: computed now for CuPy, as a lazy Dask array for Dask."""
    out = _Rows(q, stats)
    if q.backend != "dask":
        with _device(q):
            return fmt(out, _table(q, stats))
    table = _table(q, stats)
    return _lazy(functools.partial(fmt, out), table, q.out_shape if shape is None else shape,
                 dtype)


def _lazy(fn, table, shape, dtype, token=None):
    """A Dask array of one task computing ``fn(table)`` (the table's single block); ``token``
    names it in ``fn``'s stead (see :func:`chunkernels._graph.of_single_block`)."""
    xp = np if np.dtype(dtype) == object else cuda.array_module(table)
    return _graph.of_single_block(fn, table, shape, dtype,
                                  xp.empty((0,) * len(shape), dtype=dtype), token=token)


def _sum_dtype(dtype) -> np.dtype:
    """The dtype NumPy sums ``dtype`` in (scipy's scalar results)."""
    return np.add.reduce(np.zeros(1, dtype)).dtype


def _sums(out, table):
    values = out.column(out.rows(table), "sum")
    return values.astype(_sum_dtype(out.dtype)) if out.single else values


def _means(out, table):
    rows = out.rows(table)
    with np.errstate(invalid="ignore", divide="ignore"):
        return out.column(rows, "sum") / out.column(rows, "count")


def _variances(out, table):
    rows = out.rows(table)
    with np.errstate(invalid="ignore", divide="ignore"):
        return out.column(rows, "m2") / out.column(rows, "count")


def _deviations(out, table):
    return cuda.array_module(table).sqrt(_variances(out, table))


def _require_values(out, rows, name):
    """A single region must hold values (scipy: numpy's error for ``min()`` of nothing); reads
    one number back from the device."""
    if out.single and not bool(rows[0, out.lay.count] > 0):
        raise ValueError(_EMPTY.format("minimum" if name == "min" else "maximum"))


def _extremes(name, out, table):
    """Minima (``name='min'``) or maxima as scipy gives them: absent labels 0, a single region's
    minimum NaN as soon as one value is (``vals.min()``)."""
    xp = cuda.array_module(table)
    rows = out.rows(table)
    _require_values(out, rows, name)
    count, values = out.column(rows, "count"), out.column(rows, name)
    if out.single and name == "min":
        values = xp.where(xp.isnan(out.column(rows, "max")), np.nan, values)
    return xp.where(count > 0, values, 0).astype(out.dtype)


def _positions(name, out, table):
    """Coordinates of the first minimum / maximum, ``(len(index), ndim)`` (``(ndim,)`` for a
    single region); absent labels give 0."""
    xp = cuda.array_module(table)
    rows = out.rows(table)
    _require_values(out, rows, name)
    lay = out.lay
    flat = xp.where(rows[:, lay.count] > 0, rows[:, getattr(lay, f"{name}_position")], 0)
    dims = xp.asarray(out.array_shape, dtype=np.int64)
    strides = xp.asarray([math.prod(out.array_shape[a + 1:]) for a in range(dims.size)],
                         dtype=np.int64)
    coords = (flat.astype(np.int64)[:, None] // strides) % dims
    return coords[0] if out.single else coords


def _as_tuples(coords, single):
    """Host tuples of NumPy integers, as scipy returns positions (so that they index arrays)."""
    host = cuda.to_host(coords)
    return tuple(host) if single else [tuple(c) for c in host]


def _centers(out, table):
    """``center_of_mass`` as scipy arranges it: ``(ndim,)`` for a single region, else the
    per-axis results (shaped like the index) transposed, ``(len(index), ndim)`` for a 1-D
    index."""
    rows = out.rows(table)
    lay = out.lay
    with np.errstate(invalid="ignore", divide="ignore"):
        centers = rows[:, lay.cols("com")] / rows[:, lay.sum][:, None]
    if out.single:
        return centers[0]
    return centers.T.reshape((lay.ndim, *out.shape)).T


# -- scipy.ndimage's functions -----------------------------------------------------------------------


@array_entry("input", "labels", returns="values")
def sum_labels(input, labels=None, index=None):
    """Sum of the values of the array over labelled regions.

    Parameters
    ----------
    input : array_like, cupy.ndarray or dask.array.Array
        Values to sum.
    labels : array_like, optional
        Labels of the regions, of the input's shape or broadcastable to it. Without labels the
        whole input is one region.
    index : int or sequence of ints, optional
        Labels of the regions to measure. ``None``: all elements whose label is > 0, as one
        region.

    Returns
    -------
    scalar or array
        For a scalar ``index`` (or none), the sum in NumPy's sum dtype of the input; else an
        array of float64 sums shaped like ``index`` (0 for labels absent from ``labels``). CuPy
        input: 0-d or N-d CuPy arrays; Dask input: lazy Dask arrays.

    Raises
    ------
    ValueError
        ``labels`` does not broadcast to the input's shape; an index of labels over an empty
        input.
    """
    q = _query("sum_labels", input, labels, index)
    if q.backend == "numpy":
        return ndi.sum_labels(*q.scipy, index)
    _require_data(q, "sum")
    dtype = _sum_dtype(q.dtype) if q.single else np.dtype(np.float64)
    return _result(q, ("sum",), _sums, dtype)


@array_entry("input", "labels", returns="values")
def area(input, labels=None, index=None):
    """Number of elements in labelled regions, as ``dask_image.ndmeasure.area``.

    scipy.ndimage has no such function; this is ``sum_labels`` of ones, counted exactly in
    int64 (no float sums) and without making the array of ones.

    Parameters
    ----------
    input : array_like, cupy.ndarray or dask.array.Array
        The image; only its shape (and its array type, which the result follows) counts.
    labels : array_like, optional
        Labels of the regions, of the input's shape or broadcastable to it. Without labels the
        result is the number of elements of the input (``index`` is then ignored, as scipy's
        measurements ignore it).
    index : int or sequence of ints, optional
        Labels of the regions to count. ``None``: all elements whose label is > 0, as one region.

    Returns
    -------
    int64 scalar or array
        For a scalar ``index`` (or none), the count; else an int64 array of counts shaped like
        ``index`` (0 for labels absent from ``labels``). NumPy input: a NumPy int64 scalar or
        array; CuPy input: 0-d or N-d CuPy arrays; Dask input: lazy Dask arrays.

    Raises
    ------
    ValueError
        ``labels`` does not broadcast to the input's shape.
    TypeError
        An input, labels or index of a type that holds no numbers.
    """
    q = _query("area", input, labels, index)
    if labels is None:
        count = np.int64(math.prod(q.shape))
        if q.backend == "numpy":
            return count
        if q.backend == "cupy":
            with _device(q):
                return cuda.cupy().asarray(count)
        import dask.array as da

        return da.from_array(np.asarray(count), chunks=(), asarray=False)
    if q.backend == "numpy":
        _plan_index(q, index)
    counts = _result(q, ("count",), _counts, np.dtype(np.int64))
    return counts[()] if q.backend == "numpy" and q.single else counts


def _counts(out, table):
    return out.column(out.rows(table), "count").astype(np.int64)


def sum(input, labels=None, index=None):  # noqa: A001 - scipy.ndimage's name
    """Sum of the values of the array over labelled regions: an alias of :func:`sum_labels`, as
    in scipy.ndimage."""
    return sum_labels(input, labels, index)


@array_entry("input", "labels", returns="values")
def mean(input, labels=None, index=None):
    """Mean of the values of the array over labelled regions.

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    float or array
        float64 means, shaped like ``index`` (a scalar for a scalar ``index`` or none); NaN for
        labels absent from ``labels``.
    """
    q = _query("mean", input, labels, index)
    if q.backend == "numpy":
        return ndi.mean(*q.scipy, index)
    _require_data(q, "mean")
    return _result(q, ("sum", "count"), _means, np.float64)


@array_entry("input", "labels", returns="values")
def variance(input, labels=None, index=None):
    """Variance of the values of the array over labelled regions (centred sums, as scipy).

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    float or array
        float64 variances, shaped like ``index``; NaN for absent labels.
    """
    q = _query("variance", input, labels, index)
    if q.backend == "numpy":
        return ndi.variance(*q.scipy, index)
    _require_data(q, "variance")
    return _result(q, ("m2",), _variances, np.float64)


@array_entry("input", "labels", returns="values")
def standard_deviation(input, labels=None, index=None):
    """Standard deviation of the values of the array over labelled regions.

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    float or array
        float64 standard deviations, shaped like ``index``; NaN for absent labels.
    """
    q = _query("standard_deviation", input, labels, index)
    if q.backend == "numpy":
        return ndi.standard_deviation(*q.scipy, index)
    _require_data(q, "standard_deviation")
    return _result(q, ("m2",), _deviations, np.float64)


@array_entry("input", "labels", returns="values")
def minimum(input, labels=None, index=None):
    """Minimum of the values of the array over labelled regions.

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    scalar or array
        Minima in the input's dtype, shaped like ``index``; 0 for absent labels. A list of
        labels skips NaN unless a region holds only NaN; a single region's minimum is NaN as
        soon as one value is (scipy's two rules).

    Raises
    ------
    ValueError
        A single region without elements (numpy's error for the minimum of nothing).
    """
    return _extreme("minimum", "min", input, labels, index)


@array_entry("input", "labels", returns="values")
def maximum(input, labels=None, index=None):
    """Maximum of the values of the array over labelled regions.

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    scalar or array
        Maxima in the input's dtype, shaped like ``index``; 0 for absent labels; NaN where a
        region holds a NaN.

    Raises
    ------
    ValueError
        A single region without elements.
    """
    return _extreme("maximum", "max", input, labels, index)


def _extreme(fname, name, input, labels, index):
    q = _query(fname, input, labels, index)
    if q.backend == "numpy":
        return getattr(ndi, fname)(*q.scipy, index)
    _require_data(q, fname)
    stats = ("min", "max") if name == "min" else ("max",)
    return _result(q, stats, functools.partial(_extremes, name), q.dtype)


@array_entry("input", "labels", returns="values")
def minimum_position(input, labels=None, index=None):
    """Position of the first minimum (raster order) of the values over labelled regions.

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    tuple or list of tuples
        A tuple of integer coordinates for a scalar ``index`` (or none), else a list of them in
        the order of the flattened ``index``; absent labels give the origin. CuPy input: the
        same host tuples (scipy's and cupyx's convention: they index arrays); Dask input: a lazy
        int64 array, ``(ndim,)`` or ``(len(index), ndim)``, as dask-image.

    Notes
    -----
    Ties go to the first element in raster order, which is scipy's rule for a single region;
    for a list of labels scipy's order among equal values depends on its sort.
    """
    return _position("min", "minimum_position", input, labels, index)


@array_entry("input", "labels", returns="values")
def maximum_position(input, labels=None, index=None):
    """Position of the first maximum (raster order) of the values over labelled regions.

    Parameters and results are those of :func:`minimum_position`.
    """
    return _position("max", "maximum_position", input, labels, index)


def _position(name, fname, input, labels, index):
    q = _query(fname, input, labels, index)
    if q.backend == "numpy":
        return getattr(ndi, fname)(*q.scipy, index)
    _require_data(q, fname)
    shape = (len(q.shape),) if q.single else (math.prod(q.out_shape), len(q.shape))
    coords = _result(q, (f"{name}_position",), functools.partial(_positions, name), np.int64,
                     shape)
    return coords if q.backend == "dask" else _as_tuples(coords, q.single)


@array_entry("input", "labels", returns="values")
def extrema(input, labels=None, index=None):
    """Minima, maxima and their first positions over labelled regions, in one pass.

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    minimums, maximums : scalar or array
        As :func:`minimum` and :func:`maximum`.
    min_positions, max_positions : tuple or list of tuples
        As :func:`minimum_position` and :func:`maximum_position`.
    """
    q = _query("extrema", input, labels, index)
    if q.backend == "numpy":
        return ndi.extrema(*q.scipy, index)
    _require_data(q, "extrema")
    stats = ("min", "max", "min_position", "max_position")
    out = _Rows(q, stats)
    with _device(q):
        table = _table(q, stats)
    shape = (len(q.shape),) if q.single else (math.prod(q.out_shape), len(q.shape))
    parts = ((functools.partial(_extremes, "min"), q.dtype, q.out_shape),
             (functools.partial(_extremes, "max"), q.dtype, q.out_shape),
             (functools.partial(_positions, "min"), np.int64, shape),
             (functools.partial(_positions, "max"), np.int64, shape))
    if q.backend == "dask":
        return tuple(_lazy(functools.partial(fn, out), table, s, dt) for fn, dt, s in parts)
    with _device(q):
        lo, hi, lo_at, hi_at = (fn(out, table) for fn, _, _ in parts)
    return lo, hi, _as_tuples(lo_at, q.single), _as_tuples(hi_at, q.single)


@array_entry("input", "labels", returns="values")
def center_of_mass(input, labels=None, index=None):
    """Center of mass of the values of the array over labelled regions.

    Parameters are those of :func:`sum_labels`; the values are the masses (any sign).

    Returns
    -------
    tuple, list of tuples or array
        NumPy input: scipy's tuple (scalar ``index`` or none) or list of tuples. CuPy input: a
        tuple of 0-d CuPy arrays, or one CuPy array of shape ``(len(index), ndim)``, whose rows
        are what cupyx returns as a list (one array instead of a list of thousands keeps the
        result on the device without per-label objects). Dask input: a lazy float64 array,
        ``(ndim,)`` or ``(len(index), ndim)``. Absent labels and zero total mass give NaN.
    """
    q = _query("center_of_mass", input, labels, index)
    if q.backend == "numpy":
        return ndi.center_of_mass(*q.scipy, index)
    _require_data(q, "center_of_mass")
    ndim = len(q.shape)
    shape = (ndim,) if q.single else (*q.out_shape[::-1], ndim)
    centers = _result(q, ("sum", "com"), _centers, np.float64, shape)
    return tuple(centers) if q.single and q.backend == "cupy" else centers


@array_entry("input", returns="values")
def find_objects(input, max_label=0):
    """Bounding boxes of the labelled objects, as tuples of slices.

    Parameters
    ----------
    input : array_like of ints, cupy.ndarray or dask.array.Array
        Labels; 0 and negative labels are background. Boolean and float labels are truncated
        to integers (``max_label`` is then needed).
    max_label : int, optional
        Largest label to report; by default the largest label in ``input``.

    Returns
    -------
    list of tuples of slices, or dask.delayed.Delayed
        Entry ``l - 1`` is the box of label ``l``, ``None`` where the label is absent. Dask
        input: a Delayed computing that list (the boxes of each chunk are found in one task per
        chunk, then merged).

    Raises
    ------
    TypeError
        Complex labels; boolean or float labels without ``max_label``.
    MemoryError
        A largest label (or ``max_label``) whose list of boxes no memory here could hold, before
        any work where it is known then (given, or NumPy and CuPy labels), else at compute.
    """
    x = as_input(input, "find_objects", chunk_sizes=True)
    if x.dtype.kind == "c":
        raise TypeError("Complex type not supported")
    max_label = operator.index(max_label)
    if x.dtype.kind not in "iu" and max_label < 1:
        raise TypeError(f"find_objects: the largest value of {x.dtype} labels is no label "
                        f"number; give max_label= (boolean and float labels are then truncated "
                        f"to integers, as scipy does), or integer labels")
    if max_label >= 1:
        _check_box_count(max_label, "max_label")
    if not (is_dask(x) or cuda.is_cupy_array(x)):
        if max_label < 1 and x.size:
            _check_box_count(int(x.max()), "the largest label")  # scipy's MemoryError says nothing
        return ndi.find_objects(x, max_label)
    if x.dtype.kind not in "iu":
        x = x.astype(np.int64)
    if max_label < 1 and x.size == 0:
        raise ValueError(_EMPTY.format("maximum"))
    q = _Query("dask" if is_dask(x) else "cupy", x, x, x.dtype, x.shape)
    if max_label < 1 and q.backend == "cupy":
        max_label = int(x.max())
        _check_box_count(max_label, "the largest label")
    if max_label >= 1:
        _plan_index(q, np.arange(1, max_label + 1, dtype=np.int64))
    else:
        q.select = "labels"
    with _device(q):
        table = _table(q, ("bbox",))
    layout = label_statistics.Layout.of(label_statistics.normalise_stats(("bbox",)), x.ndim)
    boxes = functools.partial(_boxes, layout, max_label if max_label >= 1 else None)
    if q.backend == "cupy":
        return boxes(table)
    # one task over the table's block, in the table's graph: dask.delayed would optimise that
    # graph on its own, and a labelling computed with it (dask.compute(find_objects(labels),
    # count)) would run twice
    return _graph.delayed_of_single_block(boxes, table, token=("find_objects", max_label, x.ndim))


def _boxes(lay, max_label, table):
    """scipy's list of slice tuples from a table of bounding boxes."""
    host = cuda.to_host(table)
    if max_label is None:  # keys are the labels found
        labels = host[:, lay.key].astype(np.int64)
        max_label = int(labels.max()) if labels.size else 0
        _check_box_count(max_label, "the largest label")  # known only now, for Dask labels
    else:
        labels = np.arange(1, max_label + 1)
    out = [None] * max_label
    for label, row in zip(labels.tolist(), host):
        if row[lay.count] > 0:
            out[label - 1] = tuple(slice(int(lo), int(hi) + 1) for lo, hi in
                                   zip(row[lay.cols("bbox_lo")], row[lay.cols("bbox_hi")]))
    return out


def _check_box_count(max_label: int, what: str) -> None:
    """Refuse a list of ``max_label`` boxes that the memory here could never hold.

    scipy's result has an entry for every label number from 1 to the largest, present or not,
    so one label of 2**62 asks for 2**62 entries: scipy (and the Dask path, at compute) then
    raised a MemoryError with an empty message. Eight bytes per entry (the list's pointer) is
    what it needs at least; the boxes and, for CuPy and Dask labels, a table row per label
    come on top.
    """
    need = 8 * max_label
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows): the address space
        memory = None
    limit = min(memory or sys.maxsize, sys.maxsize)
    if need <= limit:
        return
    from dask.utils import format_bytes

    here = f"this machine has {format_bytes(memory)} of memory" if memory else \
        "more than a 64-bit address space holds"
    raise MemoryError(
        f"find_objects: {what} is {max_label}, and the result lists one entry per label number "
        f"from 1 to it, present or not: {max_label} entries, at least {format_bytes(need)} "
        f"({here}). Renumber the labels to 1..n first (skimage.segmentation.relabel_sequential, "
        f"or numpy.unique(labels, return_inverse=True)), or pass a smaller max_label")


# -- functions of every value of a region: median, labeled_comprehension, histogram ----------------


def _per_block(q, label, block_fn, combine_fn, shape, dtype, token):
    """``combine_fn([block_fn(origin, x, labels) for each block])``: now on a CuPy array (one
    block), as a Dask graph of one task per chunk and one combine task for a Dask array."""
    if q.backend == "cupy":
        with _device(q):
            return combine_fn([block_fn((0,) * len(q.shape), q.x, q.labels)])
    xp = np if np.dtype(dtype) == object else cuda.array_module(q.x)
    return _graph.blocks_then_combine(label, q.x, [q.labels], block_fn, combine_fn, token=token,
                                      chunks=tuple((n,) for n in shape), dtype=dtype,
                                      meta=xp.empty((0,) * len(shape), dtype=dtype))


def _selected(select, keys, shape, positions, origin, x, labels):
    """The elements of a block that fall in a slot, in raster order: their slots, values and
    (``positions``) global flat indices."""
    xp = cuda.array_module(x)
    if x.ndim == 0:  # nonzero() of 0-d arrays is refused; one element, flat index 0
        x, labels, shape, origin = x.reshape(1), labels.reshape(1), (1,), (0,)
    slot, _ = label_statistics.element_slots(labels, select, keys)
    chosen = slot >= 0
    flat = None
    if positions:
        coords = tuple(c + o for c, o in zip(xp.nonzero(chosen), origin))
        flat = xp.ravel_multi_index(coords, shape).astype(np.int64)
    return slot[chosen], x[chosen], flat


def _value_order(xp, values):
    """A stable order of ``values`` with NaN last (NumPy's order, whatever the device's)."""
    if values.dtype.kind != "f":
        return xp.argsort(values, kind="stable")
    nan = xp.isnan(values)
    order = xp.argsort(xp.where(nan, np.inf, values), kind="stable")
    return order[xp.argsort(nan[order].astype(np.int8), kind="stable")]


def _median_block(select, keys, floor, origin, x, labels):
    slots, values, _ = _selected(select, keys, x.shape, False, origin, x, labels)
    return slots, values, _label_floor(x, labels) if floor else None


def _label_floor(x, labels):
    """The block's smallest label and the smallest value (NaN last) among its elements. scipy's
    median of a list of labels gives absent labels the mean of that value with itself (its
    sorted order starts there)."""
    if labels.size == 0:
        return None
    xp = cuda.array_module(x)
    low = labels.min()
    values = x[labels == low].astype(_median_dtype(x.dtype))
    order = _value_order(xp, values)
    return low.item(), values[order[0]].item()


def _median_dtype(dtype) -> np.dtype:
    """scipy's median dtype: floats keep theirs, integers and booleans give float64."""
    return np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)


def _medians(single, slots, out_shape, dtype, parts):
    xp = cuda.array_module(parts[0][1])
    s = xp.concatenate([p[0] for p in parts])
    v = xp.concatenate([p[1] for p in parts]).astype(_median_dtype(dtype))
    order = _value_order(xp, v)
    order = order[xp.argsort(s[order], kind="stable")]
    s, v = s[order], v[order]
    if single:  # numpy.median of the region: NaN for no values or any NaN
        n = v.size
        if n == 0 or bool(xp.isnan(v[-1])):
            return xp.asarray(np.nan, dtype=v.dtype)
        middle = (v[n // 2 - 1] + v[n // 2]) / 2 if n % 2 == 0 else v[n // 2]
        return xp.asarray(middle, dtype=v.dtype)
    floors = [p[2] for p in parts if p[2] is not None]
    low = builtins.min(f[0] for f in floors)
    fill = builtins.min((f[1] for f in floors if f[0] == low), key=lambda f: (f != f, f))
    nslots = int(slots.max()) + 1 if slots.size else 0
    first = xp.searchsorted(s, xp.arange(nslots), side="left")
    last = xp.searchsorted(s, xp.arange(nslots), side="right") - 1
    v = xp.concatenate([v, xp.asarray([fill], dtype=v.dtype)])
    # scipy's arithmetic: move both ends halfway towards each other, then average them
    step = (last - first) // 2
    lo = xp.where(last >= first, first + step, v.size - 1)
    hi = xp.where(last >= first, last - step, v.size - 1)
    at = xp.asarray(np.where(slots < 0, nslots, slots))  # absent entries read the fill
    absent = xp.asarray([v.size - 1])
    lo, hi = xp.concatenate([lo, absent])[at], xp.concatenate([hi, absent])[at]
    return ((v[lo] + v[hi]) / 2).reshape(out_shape)


@array_entry("input", "labels", returns="values")
def median(input, labels=None, index=None):
    """Median of the values of the array over labelled regions.

    Parameters are those of :func:`sum_labels`.

    Returns
    -------
    float or array
        Medians (float64; float inputs keep their dtype), shaped like ``index``. For absent
        labels of a list, scipy's value: the smallest value under the smallest label.

    Notes
    -----
    Exact: the values of every region are gathered (on Dask, one task per chunk extracts the
    chunk's labelled values, one task sorts them), so this moves the labelled data once, unlike
    the one-pass statistics.
    """
    q = _query("median", input, labels, index)
    if q.backend == "numpy":
        return ndi.median(*q.scipy, index)
    _require_data(q, "median")
    dtype = _median_dtype(q.dtype)
    block = functools.partial(_median_block, q.select, q.keys, not q.single)
    slots = np.zeros(1, np.int64) if q.slots is None else q.slots
    combine = functools.partial(_medians, q.single, slots, q.out_shape, q.dtype)
    return _per_block(q, "median", block, combine, q.out_shape, dtype,
                      (q.select, q.keys, q.slots))


def _comprehend(func, out_dtype, default, pass_positions, raw, slots, values, out_shape, parts):
    """scipy's labeled_comprehension over the gathered elements (raster order per label)."""
    xp = cuda.array_module(parts[0][1])
    s = xp.concatenate([p[0] for p in parts])
    v = xp.concatenate([p[1] for p in parts])
    flat = xp.concatenate([p[2] for p in parts])
    order = xp.argsort(flat, kind="stable")
    order = order[xp.argsort(s[order], kind="stable")]
    s, v, flat = s[order], v[order], flat[order]
    args = (v, flat) if pass_positions else (v,)
    if raw:  # no labels, or no index: func of every element, as it returns it
        return func(*args)
    nslots = int(slots.max()) + 1 if slots.size else 0
    edges = xp.searchsorted(s, xp.arange(nslots + 1), side="left")
    edges = edges.get() if cuda.is_cupy_array(edges) else edges
    obj = np.dtype(out_dtype) == object
    out = np.empty(slots.size, object) if obj else xp.empty(slots.size, out_dtype)
    if default is None and not obj and out.dtype.kind in "fc":
        default = np.nan  # NumPy turns None into NaN for floats; CuPy does not, so say it
    out[:] = default
    for entry in np.argsort(values, kind="stable"):  # scipy evaluates in sorted index order
        slot = slots[entry]
        if slot >= 0 and edges[slot] < edges[slot + 1]:
            out[entry] = func(*(a[edges[slot]:edges[slot + 1]] for a in args))
    return out.reshape(out_shape)


@array_entry("input", "labels", returns="values")
def labeled_comprehension(input, labels, index, func, out_dtype, default, pass_positions=False):
    """``func`` of the values of each labelled region, roughly ``[func(input[labels == i]) for i
    in index]``.

    Parameters
    ----------
    input : array_like, cupy.ndarray or dask.array.Array
        Values.
    labels : array_like or None
        Labels of the regions (broadcastable to the input's shape). ``None``: ``func`` of every
        value.
    index : int, sequence of ints or None
        Labels to apply ``func`` to. ``None``: all values whose label is > 0, at once.
    func : callable
        Called with the region's values (raster order) and, with ``pass_positions``, their
        flat indices: NumPy arrays for NumPy and NumPy-chunked Dask inputs, CuPy arrays for
        CuPy ones.
    out_dtype : dtype
        Dtype of the result, for an index (with no labels or no index, SciPy ignores it, and so
        does this: the result is ``func``'s, and a Dask result is a 0-d object array computing
        to it).
    default : scalar or None
        Result for labels of ``index`` absent from ``labels``.
    pass_positions : bool
        Pass the flat indices as a second argument.

    Returns
    -------
    array or scalar
        Shaped like ``index``; with no labels or no index, whatever ``func`` returns. CuPy
        input: CuPy arrays (a list for ``out_dtype=object``), as cupyx; Dask input: a lazy Dask
        array (0-d with no labels, no index or a scalar index), as dask-image. A 0-d result of
        ``out_dtype=object`` computes to the object itself (an array, ``None``, a number),
        except a tuple or list, which it holds in a 0-d object array.

    Raises
    ------
    ValueError
        An index without labels; index values the labels' dtype cannot hold.
    """
    if labels is None and index is not None:
        raise ValueError("index without defined labels")
    q = _query("labeled_comprehension", input, labels, index, complex_ok=True)
    if q.backend == "numpy":
        return ndi.labeled_comprehension(*q.scipy, index,
                                         func, out_dtype, default, pass_positions)
    if q.select == "index":
        _check_index_precision(q)
    raw = q.select != "index"
    slots = np.zeros(1, np.int64) if q.slots is None else q.slots
    values = np.zeros(1) if q.values is None else q.values
    block = functools.partial(_comprehension_block, q.select, q.keys, q.shape)
    combine = functools.partial(_comprehend, func, out_dtype, default, bool(pass_positions),
                                raw, slots, values, q.out_shape)
    if q.backend == "cupy":  # cupyx's containers: a list for object results, 0-d for a scalar
        with _device(q):
            result = combine([block((0,) * len(q.shape), q.x, q.labels)])
        if raw:
            return result
        if q.single:
            return result.reshape(-1)[0]
        return list(result.reshape(-1)) if result.dtype == object else result
    if raw:  # scipy returns func's result as it is, whatever out_dtype says: a 0-d object
        combine = functools.partial(_as_0d, combine, object)  # result computes to it
    elif np.dtype(out_dtype) == object and not q.out_shape:
        combine = functools.partial(_unboxed, combine)
    return _per_block(q, "labeled_comprehension", block, combine, q.out_shape,
                      np.dtype(object if raw else out_dtype),
                      (q.select, q.keys, q.slots, func, default))


def _comprehension_block(select, keys, shape, origin, x, labels):
    return _selected(select, keys, shape, True, origin, x, labels)


def _as_0d(combine, out_dtype, parts):
    """A function's raw result as the 0-d Dask result holds it: an array of ``out_dtype``, or for
    ``object`` the result itself (see :func:`_unbox`)."""
    result = combine(parts)
    if np.dtype(out_dtype) == object:
        return _unbox(result)
    return cuda.array_module(result).asarray(result, dtype=out_dtype)


def _unboxed(combine, parts):
    """A 0-d object result as the object it holds (:func:`_unbox`)."""
    return _unbox(combine(parts)[()])


def _unbox(value):
    """The block a 0-d object Dask result holds: ``value`` itself, which computing the lazy
    result returns as it is (scipy's value, ``func``'s result or ``default``, as dask-image's
    results compute to), except a tuple or list, which Dask's finalize would read as nested
    blocks: that stays in a 0-d object array."""
    if isinstance(value, tuple | list):
        box = np.empty((), object)
        box[()] = value
        return box
    return value


def _check_index_precision(q):
    """scipy's check that the index survives conversion to the labels' dtype."""
    values = np.atleast_1d(q.values)
    dt = q.labels.dtype
    if values.dtype.kind in "iu" and dt.kind in "iu" and values.size:
        # integers out of the labels' range can wrap around and back unchanged (2**64 - 1 to
        # int64 -1 and back): compare with the range instead
        lossy = values.min() < np.iinfo(dt).min or values.max() > np.iinfo(dt).max
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            lossy = np.any(values.astype(dt).astype(values.dtype) != values)
    if lossy:
        raise ValueError(f"Cannot convert index values from <{values.dtype}> to "
                         f"<{q.labels.dtype}> (labels' type) without loss of precision")


def _bincount(xp, index, length):
    """Counts of each value of ``index`` in ``[0, length)`` (no read-back on the device)."""
    if xp is np:
        return np.bincount(index, minlength=length)
    import cupyx

    counts = xp.zeros(length, np.uint64)
    cupyx.scatter_add(counts, index, np.uint64(1))
    return counts.astype(np.int64)


def _histogram_block(select, keys, edges, nslots, origin, x, labels):
    """Per slot, the histogram of the block's values and the number of its elements."""
    xp = cuda.array_module(x)
    slot, _ = label_statistics.element_slots(labels, select, keys)
    values = x.astype(np.float64).reshape(-1)
    slot = slot.reshape(-1)
    e = xp.asarray(edges)
    bins = e.size - 1
    # numpy.histogram's bins: [e_i, e_i+1), the last one closed; NaN and outliers fall out
    b = xp.searchsorted(e, values, side="right") - 1
    b = xp.where(values == e[-1], bins - 1, b)
    inside = (slot >= 0) & (b >= 0) & (b < bins)
    counts = _bincount(xp, xp.where(inside, slot * bins + b, nslots * bins), nslots * bins + 1)
    sizes = _bincount(xp, xp.where(slot >= 0, slot, nslots), nslots + 1)
    return counts[:-1].reshape(nslots, bins), sizes[:-1]


def _histograms(single, slots, out_shape, absent_is_none, parts):
    counts = builtins.sum(p[0] for p in parts)
    sizes = builtins.sum(p[1] for p in parts)
    if single:
        return None if absent_is_none and not int(sizes[0]) else counts[0]
    host_sizes = sizes.get() if cuda.is_cupy_array(sizes) else sizes
    out = np.empty(slots.size, object)
    for entry, slot in enumerate(slots):
        out[entry] = counts[slot] if slot >= 0 and host_sizes[slot] > 0 else None
    return out.reshape(out_shape)


@array_entry("input", "labels", returns="values")
def histogram(input, min, max, bins, labels=None, index=None):  # noqa: A002 - scipy's names
    """Histogram of the values of the array, optionally per labelled region.

    Parameters
    ----------
    input : array_like, cupy.ndarray or dask.array.Array
        Values.
    min, max : scalar
        Range of the bins.
    bins : int
        Number of bins (``numpy.linspace(min, max, bins + 1)`` edges; the last bin is closed).
    labels, index
        As :func:`sum_labels`.

    Returns
    -------
    array or object array
        int64 counts for no index or a scalar one; for a list of labels an object array of
        counts (``None`` for absent labels), as scipy. CuPy input: CuPy counts (a list for a
        list of labels, as cupyx); Dask input: lazy Dask arrays (object dtype for a list). A
        scalar label absent from ``labels`` gives ``None`` for NumPy input, as scipy, and for
        Dask input (the lazy array of ``bins`` counts computes to ``None``, as dask-image's
        does); zero counts for CuPy input, as cupyx.

    Raises
    ------
    ValueError
        An index without labels; bin edges that decrease.
    """
    if labels is None and index is not None:
        raise ValueError("index without defined labels")
    q = _query("histogram", input, labels, index)
    if q.backend == "numpy":
        x, lab = q.scipy
        return ndi.histogram(x, min, max, bins, lab, index)
    edges = np.linspace(min, max, operator.index(bins) + 1)
    if np.any(edges[:-1] > edges[1:]):
        raise ValueError("`bins` must increase monotonically, when an array")
    if q.select == "index":
        _check_index_precision(q)
    nslots = 1 if q.keys is None else q.keys.size
    slots = np.zeros(1, np.int64) if q.slots is None else q.slots
    block = functools.partial(_histogram_block, q.select, q.keys, edges, nslots)
    # a scalar label absent from the labels: scipy's None for Dask input (as dask-image's
    # result computes to), cupyx's zero counts for CuPy input
    absent_is_none = q.backend == "dask" and q.select == "index"
    combine = functools.partial(_histograms, q.single, slots, q.out_shape, absent_is_none)
    shape, dtype = ((edges.size - 1,), np.int64) if q.single else (q.out_shape, object)
    result = _per_block(q, "histogram", block, combine, shape, dtype, (q.select, q.keys, edges))
    if q.backend == "cupy" and not q.single:
        return list(result.reshape(-1))
    return result


# -- measure: several properties of every label, one pass ------------------------------------------


def _column(name, axis, rows_of, labels_dtype, table):
    """Column ``name`` (axis ``axis`` of a per-axis property) of the measure table."""
    xp = cuda.array_module(table)
    out = rows_of
    rows = out.rows(table)
    lay = out.lay
    count = rows[:, lay.count] if lay.count is not None else None
    with np.errstate(invalid="ignore", divide="ignore"):
        if name == "label":
            if out.slots is None or out.values is None:  # the labels found
                return rows[:, lay.key].astype(labels_dtype)
            return xp.asarray(out.values)
        if name == "area":
            return count.astype(np.int64)
        if name == "sum":
            return rows[:, lay.sum]
        if name == "mean":
            return rows[:, lay.sum] / count
        if name in ("variance", "standard_deviation"):
            var = rows[:, lay.m2] / count
            return var if name == "variance" else xp.sqrt(var)
        if name in ("min", "max"):
            return xp.where(count > 0, rows[:, getattr(lay, name)], 0).astype(out.dtype)
        if name in ("min_position", "max_position"):
            return _positions(name[:3], out, table)[:, axis]
        if name == "centroid":
            return rows[:, lay.centroid + axis] / count
        if name == "center_of_mass":
            return rows[:, lay.com + axis] / rows[:, lay.sum]
    # bbox: the box's start for axes 0..ndim-1, its stop for ndim..2*ndim-1; absent: empty
    filled = count > 0
    if axis < lay.ndim:
        return xp.where(filled, rows[:, lay.bbox_lo + axis], 0).astype(np.int64)
    return xp.where(filled, rows[:, lay.bbox_hi + axis - lay.ndim] + 1, 0).astype(np.int64)


class _MeasureRows(_Rows):
    """:class:`_Rows` for :func:`measure`: one row per label, plus the index values."""

    def __init__(self, q, stats):
        super().__init__(q, stats)
        self.single, self.shape = False, (-1,)
        self.values = q.values
        if q.select == "labels":
            self.slots = None


@array_entry("input", "labels", returns="values")
def measure(input, labels, index=None,
            properties=DEFAULT_PROPERTIES, as_frame=None):
    """Several properties of every labelled region, in one pass over the data.

    Parameters
    ----------
    input : array_like, cupy.ndarray or dask.array.Array
        Values (intensities).
    labels : array_like, cupy.ndarray or dask.array.Array
        Labels, of the input's shape or broadcastable to it; 0 and negative labels are
        background.
    index : int or sequence of ints, optional
        Labels to measure, in this order (repeats allowed; absent labels give empty regions).
        ``None``: every label > 0, in increasing order.
    properties : sequence of str
        Any of ``label``, ``area`` (elements), ``sum``, ``mean``, ``variance``,
        ``standard_deviation``, ``min``, ``max`` (input dtype; 0 for absent labels, as scipy),
        ``min_position``, ``max_position`` (first in raster order), ``centroid`` (mean
        coordinates), ``center_of_mass`` (value-weighted, scipy's), ``bbox`` (start and stop per
        axis, scikit-image's order).
    as_frame : bool or None
        ``True``: a pandas DataFrame (computing a Dask result; copying a CuPy one to the host).
        ``False``: a dict of arrays. ``None``: a DataFrame for NumPy input when pandas is
        installed, else the dict (CuPy results stay on the device, Dask results lazy).

    Returns
    -------
    dict or pandas.DataFrame
        One 1-D column per property, per-axis properties as ``name-0``, ``name-1``, ... (bbox:
        ``bbox-0`` ... ``bbox-{2*ndim-1}``, the starts then the stops), as
        ``skimage.measure.regionprops_table`` names them. Columns of NumPy / CuPy / Dask arrays
        follow the input; Dask columns share one graph, with unknown length when ``index`` is
        ``None``: the dict's ``compute()`` computes them all in one task, ``compute(host=True)``
        as NumPy arrays whatever the chunks (``dask.compute(*table.values())`` too, with two
        tasks a column).

    Raises
    ------
    ValueError
        An unknown property; labels that do not broadcast to the input.
    ImportError
        ``as_frame=True`` without pandas.
    """
    if isinstance(properties, str):
        properties = (properties,)
    unknown = [p for p in properties if p not in PROPERTIES]
    if unknown:
        raise ValueError(f"measure: unknown properties {unknown}; known: {', '.join(PROPERTIES)}")
    if labels is None:
        raise ValueError("measure needs labels (use labels=numpy.ones(input.shape, int) to "
                         "measure the whole input as one region)")
    q = _query("measure", input, labels, None)
    with _device(q):
        columns = _measure_columns(q, index, properties)
    return _as_table(columns, q.backend, as_frame)


def _measure_columns(q, index, properties):
    """measure's columns: computed for NumPy and CuPy, lazy (one shared table) for Dask."""
    if index is None:
        if q.backend == "dask":
            q.select = "labels"
        else:
            found = q.labels[q.labels > 0]
            _plan_index(q, cuda.array_module(found).unique(found))
    else:
        _plan_index(q, np.atleast_1d(_host(index)))
    stats = tuple(s for p in properties for s in PROPERTIES[p]) or ("count",)
    table = _table(q, stats)
    rows_of = _MeasureRows(q, stats)
    ndim = len(q.shape)
    n = math.nan if q.select == "labels" else q.slots.size
    # what the columns' functions hold, tokenized once (Dask pickles a partial to tokenize it:
    # a millisecond a column, on the client, for a table that takes a few to compute)
    token = _graph.tokenize(rows_of, q.labels.dtype) if q.backend == "dask" else None
    columns, fns = {}, {}
    for name in properties:
        per_axis = 2 * ndim if name == "bbox" else ndim if name in _PER_AXIS else 0
        for axis in range(per_axis) if per_axis else (None,):
            key = name if axis is None else f"{name}-{axis}"
            fn = fns[key] = functools.partial(_column, name, axis, rows_of, q.labels.dtype)
            if q.backend == "dask":
                columns[key] = _lazy(fn, table, (n,), _column_dtype(name, q, rows_of),
                                     token=(token, key))
    if q.backend != "dask":
        return _all_columns(tuple(fns.items()), False, table)
    return DaskColumns(columns, table, fns)


class DaskColumns(dict):
    """What :func:`measure` returns for Dask input with ``as_frame=False``: a dict of lazy 1-D
    Dask arrays, one per column, over one shared table; :meth:`compute` computes them all."""

    def __init__(self, columns, table, fns):
        super().__init__(columns)
        self._table, self._fns = table, tuple(fns.items())
        # the columns' names stand for their functions in the task's name (see _lazy)
        self._token = tuple(columns[key].name for key in fns)

    def compute(self, host: bool = False) -> dict:
        """The columns computed, all of them by one task from the shared table: NumPy or CuPy
        arrays, as the input's chunks, or with ``host=True`` NumPy arrays whatever the chunks
        (the task copies the table off its device once, and the columns travel as host
        memory, not as device buffers the client would take onto its own GPU).
        ``dask.compute(*columns.values())`` gives the same arrays with two tasks a column
        (Dask's handling of each, a few milliseconds on a cluster, is what a column costs)."""
        import dask

        return dask.compute(self.to_delayed(host))[0]

    def to_delayed(self, host: bool = False):
        """The one task :meth:`compute` runs, as a ``dask.delayed`` value (the dict of columns),
        to compute or persist together with other collections: ``dask.persist(labels, count,
        table.to_delayed())`` sends the labelling and its measurements to a cluster in one
        graph, where computing them one after the other pays the scheduler's round trip twice."""
        fn = functools.partial(_all_columns, self._fns, bool(host))
        return _graph.delayed_of_single_block(fn, self._table, token=(self._token, bool(host)))


def _all_columns(fns, host, table):
    table = _by_column(table)
    if host and cuda.is_cupy_array(table):
        table = table.get(order="F")
    return {key: fn(table) for key, fn in fns}


def _by_column(table):
    """A CuPy table in Fortran order, each column contiguous (a copy on the device, at its
    bandwidth), where a catalogue's columns, and a host copy of it, are read: out of a C-order
    table every column is a strided read, 7 to 10 times slower (the 14 columns of the demo's
    catalogue for 364,576 labels, on a CPU: 58 ms from C order, 7 ms from Fortran order). A
    NumPy table stays as it is: the host's own transpose costs about what it saves."""
    if cuda.is_cupy_array(table):
        return cuda.cupy().asfortranarray(table)
    return table


def _column_dtype(name, q, rows_of):
    if name == "label":
        return q.labels.dtype if rows_of.values is None else rows_of.values.dtype
    if name in ("area", "bbox", "min_position", "max_position"):
        return np.dtype(np.int64)
    return q.dtype if name in ("min", "max") else np.dtype(np.float64)


def _as_table(columns, backend, as_frame):
    """The columns as a dict, or as a pandas DataFrame (see :func:`measure`)."""
    if as_frame is None:
        try:
            import pandas  # noqa: F401
        except ImportError:
            as_frame = False
        else:
            as_frame = backend == "numpy"
    if not as_frame:
        return columns
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("measure(..., as_frame=True) needs pandas, which is not installed: "
                          "pip install pandas, or pass as_frame=False for a dict of arrays") from None
    if backend == "dask":
        columns = columns.compute(host=True)
    host = {k: cuda.to_host(v) for k, v in columns.items()}
    return pd.DataFrame(host)
