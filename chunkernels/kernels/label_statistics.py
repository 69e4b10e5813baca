"""label_statistics: per-label statistics of an image over a label array, as one table.

The measurements of :mod:`chunkernels.ndimage` (``sum_labels``, ``mean``, ``variance``,
``minimum``, ``maximum_position``, ``extrema``, ``center_of_mass``, ``find_objects``, ``measure``)
are formatted from this kernel's table. Each row holds the statistics of one *slot*: one label of
an index, the labels > 0 taken together, every element, or (``select="labels"``) every label > 0
found in the data. The columns (:class:`Layout`) are the slot's key, then those asked for:

* ``count`` elements; ``sum`` of the values (float64, as scipy's ``bincount``); ``m2`` the sum of
  squared deviations from the slot's mean (scipy's centred variance numerator);
* ``min`` / ``max`` values and ``min_position`` / ``max_position``, the global C-order flat index
  of the first element (raster order) holding them; minima skip NaN unless every value is NaN,
  maxima are NaN as soon as one value is;
* ``com`` per axis the sum of value times global coordinate (``center_of_mass`` numerators),
  ``centroid`` per axis the sum of global coordinates, ``bbox`` per axis the smallest then the
  largest global coordinate.

It is a reduction: ``partial`` (NumPy) and ``dispatch`` (CUDA, ``kernels_cuda/label_statistics.cu``)
give rows for one block, whose position in the whole array is the ``origin`` parameter;
:func:`finalize` combines rows of the same key (sums add, extrema and their first positions
compare, centred sums of squares combine with Chan's formula). On a Dask array, :func:`dask_graph`
plans one task per block and one combine task. Values and labels go through float64 in the table:
integers beyond 2**53 in magnitude (int64 / uint64 only) are rounded.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec, always
from chunkernels._shared.cases import random_array

#: Statistics a table can hold, in column order.
STATS = ("count", "sum", "m2", "min", "max", "min_position", "max_position", "com", "centroid",
         "bbox")
#: What the slots are: ``all`` elements as one, labels ``positive`` as one, the labels of an
#: ``index`` one each, or every positive label found (``labels``).
SELECTS = ("all", "positive", "index", "labels")
#: Statistics the combine needs besides the ones asked for.
_IMPLIED = {"m2": ("count", "sum"), "min": ("count",), "max": ("count",),
            "min_position": ("min", "count"), "max_position": ("max", "count"),
            "com": ("sum",), "centroid": ("count",), "bbox": ("count",)}
_FLAGS = {"count": 1, "sum": 2, "m2": 4, "min": 8, "max": 16, "min_position": 32,
          "max_position": 64, "com": 128, "centroid": 256, "bbox": 512}
_MAP = {"all": 0, "positive": 1, "range": 2, "lut": 3, "search": 4}
_PER_AXIS = ("com", "centroid")
_THREADS = 256
_BLOCKS_PER_SM = 8
_MAX_WALKED = 4
#: Dtypes the GPU path takes for the image and the labels (bool is read as uint8, float16 as
#: float32, both exactly).
GPU_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float16", "float32", "float64")


class Layout:
    """Column numbers of a table holding ``stats`` for ``ndim``-dimensional data.

    ``key`` is column 0. Scalar statistics have one column each (``None`` when absent); ``com``,
    ``centroid``, ``bbox_lo`` and ``bbox_hi`` name the first of ``ndim`` columns, one per axis.
    """

    def __init__(self, stats: tuple[str, ...], ndim: int):
        self.stats, self.ndim = stats, ndim
        col = 1
        for name in STATS:
            width = 0
            if name in stats:
                width = 2 * ndim if name == "bbox" else ndim if name in _PER_AXIS else 1
            setattr(self, name if name != "bbox" else "bbox_lo", col if name in stats else None)
            col += width
        self.bbox_hi = None if self.bbox_lo is None else self.bbox_lo + ndim
        self.key = 0
        self.ncols = col

    @classmethod
    @functools.cache
    def of(cls, stats: tuple[str, ...], ndim: int) -> Layout:
        return cls(stats, ndim)

    def cols(self, name: str) -> slice:
        """The column(s) of ``name`` as a slice."""
        start = getattr(self, name)
        width = self.ndim if name in (*_PER_AXIS, "bbox_lo", "bbox_hi") else 1
        return slice(start, start + width)


def normalise_stats(stats) -> tuple[str, ...]:
    """``stats`` with what they imply (:data:`_IMPLIED`), in :data:`STATS` order."""
    if isinstance(stats, str):
        stats = (stats,)
    wanted = set()
    for name in stats:
        if name not in STATS:
            raise ValueError(f"label_statistics: unknown statistic {name!r}; known: "
                             f"{', '.join(STATS)}")
        wanted.add(name)
        wanted.update(_IMPLIED.get(name, ()))  # closed: what they imply implies nothing more
    return tuple(n for n in STATS if n in wanted)


def validate(ndim, *, stats=STATS, select="labels", index=None, origin=None, shape=None,
             rank=None, **unknown):
    """Normalise the parameters: implied statistics, the index as a sorted unique 1-D array.

    ``origin`` and ``shape`` place a block in the whole array (global coordinates and flat
    indices); by default the block is the whole array. ``rank``, the number of dimensions, is
    filled in for :func:`finalize`, which sees rows only.
    """
    if unknown:
        raise TypeError(f"label_statistics got unexpected parameters {sorted(unknown)}; it takes "
                        f"stats, select, index, origin and shape")
    stats = normalise_stats(stats)
    if not stats:
        raise ValueError(f"label_statistics: no statistics asked for; give stats= some of {STATS}")
    if select not in SELECTS:
        raise ValueError(f"label_statistics: select={select!r}; expected one of {SELECTS}")
    if select == "index":
        if index is None:
            raise ValueError("label_statistics: select='index' needs index= (the labels, sorted "
                             "and unique)")
        index = np.array(index.get() if cuda.is_cupy_array(index) else index)
        if index.ndim != 1 or (index.size > 1 and not np.all(index[1:] > index[:-1])):
            raise ValueError(f"label_statistics: index must be a 1-D array of sorted, unique "
                             f"labels; got shape {index.shape} (chunkernels.ndimage's functions "
                             f"map any index onto one)")
        index.setflags(write=False)
    elif index is not None:
        raise ValueError(f"label_statistics: index= goes with select='index'; select={select!r}")
    for name, value in (("origin", origin), ("shape", shape)):
        if value is not None and len(value) != ndim:
            raise ValueError(f"label_statistics: {name}={value!r} needs {ndim} entries")
    origin = None if origin is None else tuple(int(o) for o in origin)
    shape = None if shape is None else tuple(int(s) for s in shape)
    return {"stats": stats, "select": select, "index": index, "origin": origin, "shape": shape,
            "rank": ndim}


def slot_count(select, index) -> int | None:
    """Rows of the final table (``None``: known only from the data)."""
    return {"all": 1, "positive": 1, "index": None if index is None else len(index),
            "labels": None}[select]


def empty_rows(xp, n: int, lay: Layout):
    """``n`` rows of empty slots: zero counts and sums, NaN extrema, inverted boxes."""
    rows = xp.zeros((n, lay.ncols))
    rows[:, lay.key] = xp.arange(n)
    for name in ("min", "max", "min_position", "max_position"):
        if getattr(lay, name) is not None:
            rows[:, getattr(lay, name)] = np.nan
    if lay.bbox_lo is not None:
        rows[:, lay.cols("bbox_lo")] = np.inf
        rows[:, lay.cols("bbox_hi")] = -np.inf
    return rows


def label_keys(values, label_dtype):
    """``(valid, keys)``: which of ``values`` a label of ``label_dtype`` can equal, and the
    values converted to that dtype (garbage where not valid).

    Equality is exact, as ``labels == value`` in NumPy: ``2.5`` matches no integer label, ``-1``
    no unsigned one, ``2**24 + 1`` no float32 one. Boolean labels are the integers 0 and 1.
    """
    values = np.asarray(values)
    dt = np.dtype(np.uint8) if np.dtype(label_dtype) == bool else np.dtype(label_dtype)
    if dt.kind == "f":
        with np.errstate(invalid="ignore", over="ignore"):
            keys = values.astype(dt)
            return keys == values, keys
    info = (0, 1) if np.dtype(label_dtype) == bool else (np.iinfo(dt).min, np.iinfo(dt).max)
    if values.dtype.kind in "biu" and (not values.size or (values.min() >= info[0] and
                                                           values.max() <= info[1])):
        return np.ones(values.shape, bool), values.astype(dt)  # the common case, in one pass
    valid = (values >= info[0]) & (values <= info[1])
    if values.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            valid &= np.isfinite(values) & (values == np.floor(values))
    return valid, np.where(valid, values, 0).astype(dt)


def checked_keys(index, label_dtype):
    """The index converted to the labels' dtype; every value must be a possible label."""
    valid, keys = label_keys(index, label_dtype)
    if not np.all(valid):
        raise ValueError(f"label_statistics: index values {np.asarray(index)[~valid][:5]!r} can "
                         f"be no label of dtype {np.dtype(label_dtype)}; drop them first "
                         f"(chunkernels.ndimage's functions do)")
    return keys


# -- CPU: the statistics of one block ------------------------------------------------------------


def element_slots(labels, select, index):
    """Per element, its slot (-1: none), and the key of each slot (NumPy or CuPy labels).

    ``index`` holds sorted labels of the labels' dtype; ``select='labels'`` takes every label
    > 0 found (the keys are then the label values, otherwise slot numbers).
    """
    xp = cuda.array_module(labels)
    if select in ("all", "positive"):
        slot = xp.zeros(labels.shape, np.int64) if select == "all" else xp.where(labels > 0, 0, -1)
        return slot, xp.zeros(1)
    if select == "labels":
        index = xp.unique(labels[labels > 0])
    index = xp.asarray(index)
    keys = index if select == "labels" else xp.arange(index.size)
    if index.size == 0:
        return xp.full(labels.shape, -1), keys
    at = xp.minimum(xp.searchsorted(index, labels), index.size - 1)
    return xp.where(index[at] == labels, at, -1), keys


def partial(x, labels, *, stats, select="labels", index=None, origin=None, shape=None, rank=None):
    """CPU statistics of one block: one row per slot present in it, keyed as :func:`finalize`
    expects (slot numbers; label values for ``select='labels'``)."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise TypeError(f"label_statistics takes boolean, integer or float images; got dtype "
                        f"{x.dtype}")
    lay = Layout.of(stats, x.ndim)
    labels = np.broadcast_to(np.asarray(labels), x.shape)
    if labels.dtype == bool:
        labels = labels.view(np.uint8)
    if select == "index":
        index = checked_keys(index, labels.dtype)
    slot, keys = element_slots(labels, select, index)
    selected = slot >= 0
    s = slot[selected]
    n = keys.size
    count = np.bincount(s, minlength=n)
    present = np.flatnonzero(count) if select != "labels" else np.arange(n)
    rows = empty_rows(np, n, lay)[present]
    rows[:, lay.key] = keys[present]
    if not present.size:
        return rows
    v = x[selected].astype(np.float64)
    origin = np.zeros(x.ndim, np.int64) if origin is None else np.asarray(origin)
    coords = [c + o for c, o in zip(np.nonzero(selected), origin)] if x.ndim else []
    if lay.count is not None:
        rows[:, lay.count] = count[present]
    if lay.sum is not None:
        total = np.bincount(s, weights=v, minlength=n)
        rows[:, lay.sum] = total[present]
    if lay.m2 is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = total / count
        rows[:, lay.m2] = np.bincount(s, weights=(v - mean[s]) ** 2, minlength=n)[present]
    for name, where in (("com", lambda c: v * c), ("centroid", lambda c: c.astype(np.float64))):
        if getattr(lay, name) is not None:
            for a, c in enumerate(coords):
                rows[:, getattr(lay, name) + a] = np.bincount(s, weights=where(c),
                                                              minlength=n)[present]
    if lay.bbox_lo is not None:
        for a, c in enumerate(coords):
            lo, hi = np.full(n, np.inf), np.full(n, -np.inf)
            np.minimum.at(lo, s, c)
            np.maximum.at(hi, s, c)
            rows[:, lay.bbox_lo + a], rows[:, lay.bbox_hi + a] = lo[present], hi[present]
    if lay.min is not None or lay.max is not None:
        flat = np.ravel_multi_index(coords, x.shape if shape is None else shape) if coords \
            else np.zeros(s.size, np.int64)
        _extrema_cpu(rows, lay, s, v, flat, present, n)
    return rows


def _extrema_cpu(rows, lay, s, v, flat, present, n):
    """Per slot the smallest and largest value and the first flat index holding each.

    A lexicographic sort per slot: by value (NaN last: NumPy's order) then position for the
    minimum; NaN first, then by decreasing value, then position, for the maximum.
    """
    which = np.full(n, -1, np.int64)
    which[present] = np.arange(present.size)
    for name, keys in (("min", (flat, v, s)), ("max", (flat, -v, ~np.isnan(v), s))):
        if getattr(lay, name) is None:
            continue
        order = np.lexsort(keys)
        first = order[np.r_[True, s[order][1:] != s[order][:-1]]]
        rows[which[s[first]], getattr(lay, name)] = v[first]
        if getattr(lay, f"{name}_position") is not None:
            rows[which[s[first]], getattr(lay, f"{name}_position")] = flat[first]


def reference(x, labels, **params):
    """CPU reference: the whole array's table (:func:`partial`, then :func:`finalize`)."""
    return finalize(partial(x, labels, **params), (x.dtype, np.asarray(labels).dtype), **params)


# -- combining rows --------------------------------------------------------------------------------


def finalize(rows, dtypes, *, stats, select, index=None, origin=None, shape=None, rank):
    """Combine rows of statistics (blocks' partials, stacked) into the table.

    Rows with the same key are combined; the table has one row per slot (``select='index'``:
    one per index label, in order; ``'all'`` / ``'positive'``: one), or one per distinct label
    found (``'labels'``, sorted). Works on NumPy and CuPy rows alike, on their device.
    """
    xp = cuda.array_module(rows)
    lay = Layout.of(stats, rank)
    keys = rows[:, lay.key]
    if select == "labels":
        table_keys = xp.unique(keys)
        slot = xp.searchsorted(table_keys, keys)
    else:
        table_keys = None
        slot = keys.astype(np.int64)
    n = slot_count(select, index) if table_keys is None else int(table_keys.size)
    table = empty_rows(xp, n, lay)
    if table_keys is not None:
        table[:, lay.key] = table_keys
    # Rows of one key are combined in rounds: round r takes every key's r-th row, so no key
    # repeats within a round and each round is one vectorised combine.
    order = xp.argsort(slot, kind="stable")
    ranked = slot[order]
    nth = xp.arange(ranked.size) - xp.searchsorted(ranked, ranked)
    for r in range(int(nth.max()) + 1 if nth.size else 0):
        pick = order[nth == r]
        at = slot[pick]
        table[at] = combine(table[at], rows[pick], lay)
    return table


def combine(a, b, lay: Layout):
    """Rows ``a`` and ``b`` of the same slots, combined row by row (NumPy or CuPy)."""
    xp = cuda.array_module(a)
    out = a.copy()
    na = a[:, lay.count] if lay.count is not None else None
    nb = b[:, lay.count] if lay.count is not None else None
    for name in ("count", "sum", "com", "centroid"):
        if getattr(lay, name) is not None:
            cols = lay.cols(name)
            out[:, cols] = a[:, cols] + b[:, cols]
    if lay.m2 is not None:
        # Chan et al.: M2 = M2a + M2b + delta**2 * na * nb / (na + nb), delta the mean difference
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = b[:, lay.sum] / nb - a[:, lay.sum] / na
            extra = delta * delta * na * nb / (na + nb)
        out[:, lay.m2] = a[:, lay.m2] + b[:, lay.m2] + xp.where((na > 0) & (nb > 0), extra, 0.0)
    for name, better in (("min", xp.less), ("max", xp.greater)):
        col = getattr(lay, name)
        if col is None:
            continue
        va, vb = a[:, col], b[:, col]
        nan_a, nan_b = xp.isnan(va), xp.isnan(vb)
        # minima: NaN only when every value is NaN; maxima: NaN as soon as one value is
        wins = better(vb, va) & ~nan_a & ~nan_b
        wins |= (nan_a & ~nan_b) if name == "min" else (nan_b & ~nan_a)
        pos = getattr(lay, f"{name}_position")
        if pos is not None:
            tie = (vb == va) | (nan_a & nan_b)
            wins |= tie & (b[:, pos] < a[:, pos])
        take = (nb > 0) & ((na == 0) | wins)
        out[:, col] = xp.where(take, vb, va)
        if pos is not None:
            out[:, pos] = xp.where(take, b[:, pos], a[:, pos])
    if lay.bbox_lo is not None:
        lo, hi = lay.cols("bbox_lo"), lay.cols("bbox_hi")
        out[:, lo] = xp.minimum(a[:, lo], b[:, lo])
        out[:, hi] = xp.maximum(a[:, hi], b[:, hi])
    return out


# -- GPU: the statistics of one block --------------------------------------------------------------

_PASS1 = ("count", "sum", "min", "max", "com", "centroid", "bbox")
_PASS2 = ("m2", "min_position", "max_position")


def dispatch(x, labels, *, stats, select="labels", index=None, origin=None, shape=None, rank=None):
    """GPU statistics of one block: one row for every slot (present in the block or not), so
    nothing is read back; ``select='labels'`` first reads back the range of labels the block
    holds (:func:`_found_rows`), or the labels themselves where the range is too wide."""
    cp = cuda.cupy()
    x, labels = _device_view(x), _device_view(cp.broadcast_to(labels, x.shape))
    lay = Layout.of(stats, x.ndim)
    origin = (0,) * x.ndim if origin is None else tuple(origin)
    shape = x.shape if shape is None else tuple(shape)
    if select == "labels" and x.size:
        rows = _found_rows(cp, [(x, labels, origin)], lay, shape)
        if rows is not None:
            return rows
    found = None
    if select == "labels":
        found = cp.unique(labels[labels > 0]).get()
        select, index = "index", found
    if select == "index":
        index = checked_keys(index, labels.dtype)
    n = slot_count(select, index)
    if x.size == 0 or n == 0:
        rows = empty_rows(cp, n, lay)
    else:
        rows = _view_rows(cp, x, labels, lay, _slot_map(cp, select, index), n, origin, shape)
    if found is not None:
        rows[:, lay.key] = cp.asarray(found, dtype=np.float64)
    return rows


def dispatch_many(views, *, stats, select="labels", index=None, origin=None, shape=None,
                  rank=None):
    """GPU statistics of several blocks of one device at once: ``views`` are ``(x, labels,
    origin)`` of blocks that :func:`shares_accumulators` says may share them. One set of
    accumulators takes every block's launches, and one rows kernel reads them: the rows of the
    blocks together, as :func:`finalize` would combine the blocks' own (``select='labels'``:
    those of the labels present). A task that measures many blocks then costs the host a few
    launches a block, not a table's making and a read-back each. None where the found labels'
    range is too wide to hold as slots (the caller then takes the blocks one by one).
    ``origin``, the parameters' own for one block, is not used: each view has its own."""
    cp = cuda.cupy()
    views = [(_device_view(x), _device_view(cp.broadcast_to(lab, x.shape)), tuple(origin))
             for x, lab, origin in views]
    x0, labels0, _ = views[0]
    lay = Layout.of(stats, x0.ndim)
    shape = x0.shape if shape is None else tuple(shape)
    if select == "labels":
        return _found_rows(cp, views, lay, shape)
    if select == "index":
        index = checked_keys(index, labels0.dtype)
    n = slot_count(select, index)
    if n == 0:
        return empty_rows(cp, 0, lay)
    return _rows_of_views(cp, views, _walked(x0), lay, _slot_map(cp, select, index), n, shape)


def shares_accumulators(x, labels, like=None) -> bool:
    """Whether CuPy block ``x`` (labels ``labels``) can join :func:`dispatch_many` with the
    block ``like`` (``(x, labels)``, None: the first of a group): on the same device, of the same
    dtypes, walked along every axis (none of length 1: those the rows fill per block) in the
    same memory order, with no more axes than one launch walks."""
    if not (cuda.is_cupy_array(x) and cuda.is_cupy_array(labels)) or x.size == 0:
        return False
    walked = _walked(x)
    if len(walked) != x.ndim or len(walked) > _MAX_WALKED:
        return False
    if like is None:
        return True
    other, other_labels = like
    return (x.device.id == other.device.id and x.dtype == other.dtype
            and labels.dtype == other_labels.dtype and walked == _walked(other))


def _walked(x) -> list[int]:
    """The axes a launch walks over ``x``, outermost in memory first (those longer than 1)."""
    return [a for a in layout.memory_order(x.shape, x.strides) if x.shape[a] > 1]


#: A range of found labels this wide is always taken as slots by :func:`_found_rows`; a wider
#: one while its slots (accumulators and rows, 16 bytes a column) weigh no more than the labels.
_RANGE_FLOOR = 1 << 20


def _found_rows(cp, views, lay, shape):
    """The rows of the labels > 0 present in ``views`` (``(x, labels, origin)``, sharing a walk
    when several): one read-back of the smallest and largest, every label between them a slot
    (a range map: no sort, no table on the host), then the slots that counted none dropped.
    None for float labels, or a range wider than the labels' own bytes allow (their slots would
    outweigh the data): the caller then finds the labels themselves (``cupy.unique``)."""
    labels = [lab for _, lab, _ in views]
    if labels[0].dtype.kind == "f":
        return None
    wide = np.uint64 if labels[0].dtype.kind == "u" else np.int64
    ends = []
    for lab in labels:
        top = np.iinfo(lab.dtype).max
        ends += [cp.where(lab > 0, lab, lab.dtype.type(top)).min().astype(wide),
                 lab.max().astype(wide)]
    ends = cp.stack(ends).get().reshape(-1, 2)
    present = ends[:, 1] > 0
    if not present.any():
        return empty_rows(cp, 0, lay)
    lo, hi = int(ends[present, 0].min()), int(ends[present, 1].max())
    span = hi - lo + 1
    work = Layout.of(normalise_stats((*lay.stats, "count")), lay.ndim)
    weight = sum(lab.size * lab.itemsize for lab in labels)
    if span > layout.INT32_MAX or (span > _RANGE_FLOOR and span * work.ncols * 16 > weight):
        return None
    smap = _SlotMap(_MAP["range"], lo, span)
    if len(views) == 1:
        x, lab, origin = views[0]
        rows = _view_rows(cp, x, lab, work, smap, span, origin, shape)
    else:
        rows = _rows_of_views(cp, views, _walked(views[0][0]), work, smap, span, shape)
    rows[:, work.key] = cp.arange(span, dtype=np.float64) + float(lo)
    # the slots that counted some, found on the host: CuPy's boolean indexing scans the mask
    # with kernels it compiles on first use, and which ones depends on the mask's length (a
    # block-sum kernel past 512), so a run with more labels than its warm-up compiled there
    # (100 ms on one H100); it reads the count back as well
    rows = rows[cp.asarray(np.flatnonzero(cuda.to_host(rows[:, work.count] > 0)))]
    if work is not lay:  # count was added to find the labels present: its column goes
        rows = rows[:, [c for c in range(work.ncols) if c != work.count]]
    return rows


def _device_view(a):
    """Booleans read as uint8 (a view), float16 as float32 (a copy; values are exact)."""
    if a.dtype == bool:
        return a.view(np.uint8)
    return a.astype(np.float32) if a.dtype == np.float16 else a


class _SlotMap:
    """How the kernels map a label to its slot: MAP code, offset base, span and device tables."""

    def __init__(self, code, lo=0, span=0, lut=None, keys=None):
        self.code, self.lo, self.span, self.lut, self.keys = code, lo, span, lut, keys


def _slot_map(cp, select, index):
    """The cheapest map for the index: consecutive labels are an offset, a compact set a dense
    lookup table, anything else (float labels, sparse labels) a binary search."""
    if select in ("all", "positive"):
        return _SlotMap(_MAP[select])
    if index.dtype.kind in "iu":
        span = int(index[-1]) - int(index[0]) + 1
        if span == index.size:
            return _SlotMap(_MAP["range"], index[0], span)
        if span <= max(4 * index.size, 1 << 16):
            lut = np.full(span, -1, np.int32)
            wide = np.uint64 if index.dtype.kind == "u" else np.int64
            lut[index.astype(wide) - wide(index[0])] = np.arange(index.size, dtype=np.int32)
            return _SlotMap(_MAP["lut"], index[0], span, lut=cp.asarray(lut))
    return _SlotMap(_MAP["search"], keys=cp.asarray(index))


def _view_rows(cp, x, labels, lay, smap, n, origin, shape):
    """Rows of ``n`` slots for the view ``x`` (labels alike) whose first element sits at global
    coordinate ``origin`` of an array of ``shape``. Views of more than four non-size-1 axes are
    cut along their outermost axis and the parts' rows combined."""
    walked = _walked(x)
    if len(walked) > _MAX_WALKED:
        a0 = walked[0]
        rows = None
        for i in range(x.shape[a0]):
            cut = (slice(None),) * a0 + (slice(i, i + 1),)
            part = _view_rows(cp, x[cut], labels[cut], lay, smap,
                              n, origin[:a0] + (origin[a0] + i,) + origin[a0 + 1:], shape)
            rows = part if rows is None else combine(rows, part, lay)
        return rows
    rows = _rows_of_views(cp, [(x, labels, origin)], walked, lay, smap, n, shape)
    _fill_constant_axes(cp, rows, lay, [a for a in range(x.ndim) if a not in walked], origin)
    return rows


def _rows_of_views(cp, views, walked, lay, smap, n, shape):
    """Rows of ``n`` slots accumulated over ``views`` (``(x, labels, origin)``, walking the axes
    ``walked``, at most four, alike): each pass kernel is launched once per view into the same
    accumulators, and one rows kernel reads them. The columns of axes not walked are left to
    the caller (:func:`_fill_constant_axes`)."""
    x0, labels0, _ = views[0]
    acc = _Accumulators(cp, n, lay, x0.dtype, max(len(walked), 1))
    launches = []
    for x, labels, origin in views:
        walk = _walk_args(x, labels, walked, origin, shape, smap)
        grid = _grid(cp, int(np.prod([x.shape[a] for a in walked], dtype=np.int64)))
        launches.append((walk, grid))
    for kernel, names, args in (("label_stats_pass1", _PASS1, acc.pass1()),
                                ("label_stats_pass2", _PASS2, acc.pass2())):
        flags = sum(_FLAGS[name] for name in names if name in lay.stats)
        if not flags:
            continue
        for walk, grid in launches:
            types = (cuda.cuda_type(x0.dtype), cuda.cuda_type(labels0.dtype), walk.index_type,
                     acc.ndim, smap.code)
            expr = f"{kernel}<{', '.join(map(str, types))}, {flags}u>"
            cuda.function("label_statistics", expr)((grid,), (_THREADS,), (*walk.args, *args))
    rows = cp.empty((n, lay.ncols))
    per_axis = [-1 if getattr(lay, c) is None or not walked else getattr(lay, c)
                for c in ("com", "centroid", "bbox_lo", "bbox_hi")]
    columns = [-1 if getattr(lay, c) is None else getattr(lay, c)
               for c in ("key", "count", "sum", "m2", "min", "max", "min_position",
                         "max_position")]
    axes = (walked + [0] * _MAX_WALKED)[:_MAX_WALKED]
    expr = f"label_stats_rows<{cuda.cuda_type(x0.dtype)}, {acc.ndim}>"
    cuda.function("label_statistics", expr)(
        (max(1, min(-(-n // _THREADS), 65535)),), (_THREADS,),
        (np.int32(n), np.int32(lay.ncols), rows, *acc.results(),
         *map(np.int32, columns + per_axis + axes)))
    return rows


def _fill_constant_axes(xp, rows, lay, axes, origin):
    """Columns of the axes a view does not walk (size 1): their coordinate is ``origin``."""
    for a in axes:
        c = float(origin[a])
        if lay.com is not None:
            rows[:, lay.com + a] = c * rows[:, lay.sum]
        if lay.centroid is not None:
            rows[:, lay.centroid + a] = c * rows[:, lay.count]
        if lay.bbox_lo is not None:
            filled = rows[:, lay.count] > 0
            rows[:, lay.bbox_lo + a] = xp.where(filled, c, np.inf)
            rows[:, lay.bbox_hi + a] = xp.where(filled, c, -np.inf)


def _grid(cp, n: int) -> int:
    return max(1, min(-(-n // _THREADS), _BLOCKS_PER_SM * cuda.sm_count(cp.cuda.runtime.getDevice())))


class _Walk:
    """The walk's scalar kernel arguments, typed as the kernels declare them."""

    def __init__(self, args, index_type):
        self.args, self.index_type = args, index_type


def _walk_args(x, labels, walked, origin, shape, smap):
    extents = [x.shape[a] for a in walked] or [1]
    n = math.prod(extents)
    # the grid-stride loop must not overflow the index type past the last element
    index64 = layout.needs_index64(x, labels) or n + (1 << 24) > layout.INT32_MAX
    i = np.int64 if index64 else np.int32
    xs, ls = layout.element_strides(x), layout.element_strides(labels)
    flat_strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    pad = lambda values, fill: (list(values) + [fill] * _MAX_WALKED)[:_MAX_WALKED]  # noqa: E731
    wide = np.uint64 if labels.dtype.kind == "u" else np.int64
    args = (x, labels, i(n), *map(i, pad(extents[1:], 1)[:3]),
            *map(i, pad([xs[a] for a in walked], 0)), *map(i, pad([ls[a] for a in walked], 0)),
            *map(np.int64, pad([origin[a] for a in walked], 0)),
            *map(np.int64, pad([flat_strides[a] for a in walked], 0)),
            np.int64(sum(o * f for o, f in zip(origin, flat_strides))),
            wide(smap.lo), np.uint64(smap.span), smap.lut if smap.lut is not None else x,
            smap.keys if smap.keys is not None else labels,
            np.int32(0 if smap.keys is None else smap.keys.size))
    return _Walk(args, "long long" if index64 else "int")


class _Accumulators:
    """Per-slot accumulators of both passes, initialised to their identities."""

    def __init__(self, cp, n, lay, dtype, ndim):
        self.ndim = ndim
        key = np.uint64 if np.dtype(dtype).itemsize == 8 else np.uint32
        have = set(lay.stats)
        zeros = lambda name, dt, k=1: cp.zeros(n * k, dt) if name in have else None  # noqa: E731
        full = lambda name, v, dt, k=1: cp.full(n * k, v, dt) if name in have else None  # noqa: E731
        self.count = zeros("count", np.uint64)
        self.sum = zeros("sum", np.float64)
        self.m2 = zeros("m2", np.float64)
        self.minkey = full("min", np.iinfo(key).max, key)
        self.maxkey = zeros("max", key)
        self.minpos = full("min_position", np.iinfo(np.uint64).max, np.uint64)
        self.maxpos = full("max_position", np.iinfo(np.uint64).max, np.uint64)
        self.com = zeros("com", np.float64, ndim)
        self.centroid = zeros("centroid", np.float64, ndim)
        self.bbox_lo = full("bbox", np.iinfo(np.int64).max, np.int64, ndim)
        self.bbox_hi = full("bbox", np.iinfo(np.int64).min, np.int64, ndim)
        # a valid pointer for the arguments a kernel instance does not read
        self._unused = next(a for a in vars(self).values() if a is not None and not isinstance(a, int))

    def _or_unused(self, *arrays):
        return tuple(self._unused if a is None else a for a in arrays)

    def pass1(self):
        return self._or_unused(self.count, self.sum, self.minkey, self.maxkey, self.com,
                               self.centroid, self.bbox_lo, self.bbox_hi)

    def pass2(self):
        return self._or_unused(self.count, self.sum, self.minkey, self.maxkey, self.m2,
                               self.minpos, self.maxpos)

    def results(self):
        return self._or_unused(self.count, self.sum, self.m2, self.minkey, self.maxkey,
                               self.minpos, self.maxpos, self.com, self.centroid, self.bbox_lo,
                               self.bbox_hi)


# -- Dask: one task per block, one combine task --------------------------------------------------


def as_dask_operand(a, x):
    """``a`` (Dask, NumPy or CuPy, broadcastable to ``x``) as a Dask array of ``x``'s shape,
    chunks and chunk type."""
    import dask.array as da

    from chunkernels._graph import is_dask

    xp = cuda.array_module(x)
    if not is_dask(a):
        a = xp.asarray(a.get() if cuda.is_cupy_array(a) and xp is np else a)
        return da.from_array(xp.broadcast_to(a, x.shape), chunks=x.chunks, asarray=False)
    if cuda.array_module(a) is not xp:
        to = (lambda b: b.get()) if xp is np else xp.asarray
        a = a.map_blocks(to, dtype=a.dtype, meta=xp.empty((0,) * a.ndim, a.dtype))
    if a.shape != x.shape:
        a = da.broadcast_to(a, x.shape)
    return a.rechunk(x.chunks) if a.chunks != x.chunks else a


class _BlockRows:
    """The block task of :func:`dask_graph`: ``(origin, x, labels) -> rows`` of one block (CPU
    or GPU, :func:`~chunkernels._dispatch.run_block`), and :meth:`many` for the blocks of one
    task on a GPU worker."""

    def __init__(self, params, strict):
        self.params, self.strict = params, strict

    def __call__(self, origin, x, labels):
        from chunkernels._dispatch import run_block

        return run_block(SPEC, x, (labels,), {**self.params, "origin": origin},
                         strict=self.strict)

    def many(self, origins, blocks) -> list:
        """The rows of each of ``blocks`` (``(x, labels)`` pairs at ``origins``), CuPy blocks
        that can share accumulators measured together (:func:`dispatch_many`): their rows are
        folded into the first of them, the others' are empty, which :func:`finalize` combines
        alike. The rest (NumPy blocks, blocks the GPU path refuses, views of their own layout)
        one by one."""
        cp = None
        groups = []
        for b, (x, labels) in enumerate(blocks):
            if not (shares_accumulators(x, labels)
                    and SPEC.check_block(x, labels, **self.params)[0]):
                continue
            cp = cuda.cupy()
            for group in groups:
                if shares_accumulators(x, labels, blocks[group[0]]):
                    group.append(b)
                    break
            else:
                groups.append([b])
        results = [None] * len(blocks)
        for group in groups:
            if len(group) < 2:
                continue
            with blocks[group[0]][0].device:
                try:
                    rows = dispatch_many([(*blocks[b], origins[b]) for b in group], **self.params)
                except MemoryError:  # the blocks one by one, each with run_block's own error
                    rows = None
                if rows is None:
                    continue
                results[group[0]] = rows
                for b in group[1:]:
                    results[b] = cp.empty((0, rows.shape[1]))
        return [self(origins[b], *blocks[b]) if r is None else r for b, r in enumerate(results)]

    def __dask_tokenize__(self):
        from chunkernels._graph import tokenize

        return ("label_statistics-block-rows", tokenize(self.params, self.strict))


def _combine_rows(params, dtypes, partials):
    xp = cuda.array_module(partials[0])
    return finalize(xp.concatenate([xp.asarray(p) for p in partials]), dtypes, **params)


def dask_graph(x, labels, *, strict=False, stats, select="labels", index=None, origin=None,
               shape=None, rank=None):
    """The table of a Dask array: one partial-statistics task per block, one combine task.

    With ``select='labels'`` the number of rows is known only once computed (``nan``).
    """
    labels = as_dask_operand(labels, x)
    params = {"stats": stats, "select": select, "index": index, "shape": x.shape,
              "rank": x.ndim}
    from chunkernels._graph import blocks_then_combine

    lay = Layout.of(stats, x.ndim)
    n = slot_count(select, index)
    return blocks_then_combine(
        "label_statistics", x, [labels], _BlockRows(params, strict),
        functools.partial(_combine_rows, params, (x.dtype, labels.dtype)),
        token=(params, strict), chunks=((math.nan if n is None else n,), (lay.ncols,)),
        dtype=np.float64, meta=cuda.array_module(x).empty((0, 0)))


def _cases(rng):
    """Label images from thresholded noise (as scipy.ndimage.label makes them), with views."""
    import scipy.ndimage as ndi

    every = {"stats": STATS}
    for shape, dtype in (((61, 47), "float32"), ((23, 17, 9), "float64"), ((300,), "int16"),
                         ((40, 33), "uint8"), ((19, 21), "bool")):
        x = random_array(rng, shape, dtype)
        labels, n = ndi.label(random_array(rng, shape, "float64") > 0.3)
        yield x, (labels,), every
        yield x, (labels,), {**every, "select": "index", "index": np.arange(0, n + 3, 2)}
        yield x, (labels,), {"stats": ("sum", "com"), "select": "positive"}
    x = random_array(rng, (64, 50), "float32")
    labels, _ = ndi.label(random_array(rng, (64, 50), "float64") > 0)
    yield x[::-2, 3:-3], (labels[::-2, 3:-3],), every
    yield np.asfortranarray(x), (labels.astype(np.int64),), {**every, "select": "all"}
    yield x, (labels[:1].astype(np.float32),), every  # labels broadcast along the first axis
    yield random_array(rng, (3, 4, 2, 5, 6), "float64"), (rng.integers(0, 4, (3, 4, 2, 5, 6)),), every


SPEC = KernelSpec(
    name="label_statistics",
    summary="per-label count, sum, centred sum of squares, extrema and their first positions, "
            "coordinate sums and bounding boxes; reference scipy.ndimage's measurements",
    cpu=reference,
    gpu=dispatch,
    kind="reduction",
    source="label_statistics.cu",
    entries=("label_stats_pass1<float, int, int, 2, 2, 130u>",
             "label_stats_pass1<unsigned short, int, int, 2, 2, 539u>",
             "label_stats_pass2<double, long long, long long, 3, 4, 100u>",
             "label_stats_pass1<unsigned char, unsigned long long, int, 1, 3, 795u>",
             "label_stats_pass2<long long, float, int, 4, 4, 100u>",
             "label_stats_pass1<signed char, unsigned char, int, 3, 1, 27u>",
             "label_stats_rows<float, 2>",
             "label_stats_rows<unsigned long long, 4>"),
    dtypes=GPU_DTYPES,
    operands=("labels",),
    alignment="broadcast",
    result_dtype=always(np.float64),
    validate=validate,
    partial=partial,
    finalize=finalize,
    dask_graph=dask_graph,
    cases=_cases,
    # sums of many float64 terms are added in another order (atomics, per-block partial sums)
    rtol=1e-10,
)
