"""kappa_sigma_clip: one pass of κ-σ clipping with an exact median, over any chunking.

The pass kernel behind :func:`chunkernels.sources.kappa_sigma_clip`. The median is found by
histogram refinement over an order-preserving integer mapping of the values (their *keys*):
floats flip the sign bit of non-negative values and every bit of negative ones (``-0.0`` counts
as ``+0.0``, NaN keys fall outside ``[key(-inf), key(+inf)]``), signed integers flip the sign
bit. A pass over the values whose key lies in the *window* ``[lo, hi]`` (the values still kept)

* counts them, sums ``d = (x - center) * scale`` and ``d**2`` in float64 (``center``: the
  previous median, so the sums do not cancel; ``scale``: a power of two that keeps the sums of
  huge values from overflowing, 1 unless they would) and counts NaNs anywhere;
* histograms the keys in ``bins = (lo, hi, shift)`` into ``((hi - lo) >> shift) + 1`` bins of
  ``2**shift`` keys each, and finds the bins holding two ranks (by default the middle ones of the
  window's count) — 65536 bins resolve a float32 key in 2 passes, a float64 key in 4;
* or, given ``max_in`` / ``min_in`` key ranges instead, the largest key in the one and the
  smallest in the other: the two middle values of an even count that fell into different bins.

The result (``apply`` on NumPy, CuPy or Dask arrays) is a float64 vector of :data:`HEAD` values
(:data:`FIELDS`). Each block yields a row of those values followed by its histogram; rows add up
(extremes take the max / min), and :func:`select` then finds the ranks' bins. CUDA source:
``kernels_cuda/kappa_sigma_clip.cu`` (one pass per block, histograms privatised in shared memory;
``ksc_select`` for the ranks), which keeps several blocks of one device in one row.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import numpy as np

from chunkernels import cuda, layout
from chunkernels._registry import KernelSpec, always

#: Names of the values of a pass result, in order. ``na``/``nb`` count the values in the
#: ``max_in``/``min_in`` ranges, ``amax``/``bmin`` are the largest/smallest of them;
#: ``selN_bin`` is the bin holding rank N (-1: none), ``selN_before`` the count in the bins
#: before it and ``selN_in`` the count in it.
FIELDS = ("count", "sum", "sumsq", "nans", "na", "amax", "nb", "bmin",
          "sel1_bin", "sel1_before", "sel1_in", "sel2_bin", "sel2_before", "sel2_in")
COUNT, SUM, SUMSQ, NANS, NA, AMAX, NB, BMIN, SEL = range(9)
#: Length of a pass result; a block's row puts its histogram after this many values.
HEAD = 16
#: Histogram bins of a pass: 16 bits of a key per refinement round.
NBINS = 65536

GPU_DTYPES = ("float32", "float64", "int8", "int16", "int32", "int64",
              "uint8", "uint16", "uint32", "uint64")
_THREADS = 1024  # THREADS in the .cu file
_UNROLL = 8  # UNROLL in the .cu file
#: Bytes of static shared memory the pass kernel uses besides the histogram (upper bound).
_STATIC_SHARED = 4096


# -- keys: the order-preserving integer mapping ---------------------------------------------------

def key_dtype(dtype) -> np.dtype:
    """The unsigned integer type of the keys of ``dtype`` (32 bits, or 64 for 8-byte types)."""
    return np.dtype(np.uint64 if np.dtype(dtype).itemsize == 8 else np.uint32)


def _key_bits(dtype) -> int:
    return key_dtype(dtype).itemsize * 8


def check_dtype(dtype) -> np.dtype:
    """``dtype`` if κ-σ clipping takes it (real integers and float32/float64), else TypeError."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "iuf" or dtype.itemsize > 8 or (dtype.kind == "f" and dtype.itemsize < 4):
        raise TypeError(f"κ-σ clipping takes real integer, float32 or float64 data; got dtype "
                        f"{dtype} (convert it first, e.g. x.astype('float32'))")
    return dtype


def keys(x: np.ndarray) -> np.ndarray:
    """The keys of ``x``'s values: unsigned integers in the same order as the values."""
    dtype = x.dtype
    kt = key_dtype(dtype)
    top = kt.type(1 << (kt.itemsize * 8 - 1))
    if dtype.kind == "f":
        bits = x.view(kt)
        k = bits >> kt.type(kt.itemsize * 8 - 1)  # 1 for negative values
        k *= ~top  # all bits flip for negative values, the sign bit only for the others
        k |= top
        k ^= bits
        k[k == ~top] = top  # -0.0 counts as +0.0
        return k
    if dtype.kind == "i":
        return x.astype(np.dtype(f"i{kt.itemsize}")).view(kt) ^ top
    return x.astype(kt)


def values(k, dtype) -> np.ndarray:
    """The values of ``dtype`` whose keys are ``k`` (the inverse of :func:`keys`)."""
    dtype = np.dtype(dtype)
    kt = key_dtype(dtype)
    k = np.asarray(k, dtype=kt)
    top = kt.type(1 << (kt.itemsize * 8 - 1))
    if dtype.kind == "f":
        return np.where(k & top, k & kt.type(~top), ~k).view(dtype)
    if dtype.kind == "i":
        return (k ^ top).view(np.dtype(f"i{kt.itemsize}")).astype(dtype)
    return k.astype(dtype)


def key_of(value, dtype) -> int:
    """The key of one value of ``dtype``, as a Python int."""
    return int(keys(np.asarray([value], dtype=dtype))[0])


def all_keys(dtype) -> tuple[int, int]:
    """The window of every value but NaN: ``(key(-inf), key(+inf))``, or the integer range."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return key_of(-np.inf, dtype), key_of(np.inf, dtype)
    info = np.iinfo(dtype)
    return key_of(info.min, dtype), key_of(info.max, dtype)


def window_keys(lower: float, upper: float, dtype) -> tuple[int, int]:
    """The keys of the values of ``dtype`` strictly inside ``(lower, upper)``: ``(lo, hi)``, with
    ``lo > hi`` when there are none. ``lower``/``upper`` are float64 (NaN: nothing is inside)."""
    dtype = np.dtype(dtype)
    lower, upper = float(lower), float(upper)
    if math.isnan(lower) or math.isnan(upper) or lower == math.inf or upper == -math.inf:
        return 1, 0
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            lo, hi = dtype.type(lower), dtype.type(upper)  # nearest values of dtype
            # compared as Python floats: a float32 would round the bound to float32 first
            if float(lo) <= lower:
                lo = np.nextafter(lo, dtype.type(np.inf))
            if float(hi) >= upper:
                hi = np.nextafter(hi, dtype.type(-np.inf))
        if not lo <= hi:
            return 1, 0
        return key_of(lo, dtype), key_of(hi, dtype)
    info = np.iinfo(dtype)
    lo = max(info.min, math.floor(lower) + 1) if lower > -math.inf else info.min
    hi = min(info.max, math.ceil(upper) - 1) if upper < math.inf else info.max
    if lo > hi:
        return 1, 0
    return key_of(lo, dtype), key_of(hi, dtype)


def fit_bins(lo: int, hi: int, nbins: int = NBINS) -> tuple[int, int, int]:
    """``(lo, hi, shift)``: the keys ``[lo, hi]`` in bins of ``2**shift`` keys, at most ``nbins``
    (a power of two) of them."""
    shift = max(0, (hi - lo).bit_length() - (nbins.bit_length() - 1))
    return lo, hi, shift


def bin_count(bins) -> int:
    """Number of bins of a ``(lo, hi, shift)`` histogram range (0 when it is empty)."""
    lo, hi, shift = bins
    return ((hi - lo) >> shift) + 1 if lo <= hi else 0


# -- parameters -----------------------------------------------------------------------------------

def validate(ndim, *, window=None, bins=None, max_in=None, min_in=None, center=0.0, ranks=None,
             moments=True, scale=1.0):
    """Check and normalise a pass's parameters (key ranges as pairs of Python ints)."""
    def pair(name, value, n=2):
        if value is None:
            return None
        try:
            items = tuple(int(v) for v in value)
            exact = all(int(v) == v for v in value)
        except (TypeError, ValueError):
            items, exact = (), False
        if len(items) != n or not exact or any(v < 0 for v in items):
            raise ValueError(f"kappa_sigma_clip: {name}={value!r}; expected {n} non-negative "
                             f"integers ({'lo_key, hi_key' if n == 2 else 'lo_key, hi_key, shift'})")
        return items

    window, max_in, min_in, ranks = (pair(n, v) for n, v in (
        ("window", window), ("max_in", max_in), ("min_in", min_in), ("ranks", ranks)))
    bins = pair("bins", bins, 3)
    if bins is not None:
        if bins[2] >= 64:
            raise ValueError(f"kappa_sigma_clip: bins={bins!r} has shift {bins[2]}; at most 63")
        if bin_count(bins) > NBINS:
            raise ValueError(f"kappa_sigma_clip: bins={bins!r} make {bin_count(bins)} bins; at "
                             f"most {NBINS} (a larger shift, e.g. fit_bins(lo, hi))")
    if (max_in is not None or min_in is not None) and (bins is not None or ranks is not None):
        raise ValueError("kappa_sigma_clip: max_in/min_in ask for the extremes of key ranges, "
                         "which replaces the histogram; give them without bins and ranks")
    if not moments and ranks is None and max_in is None and min_in is None:
        raise ValueError("kappa_sigma_clip: moments=False leaves the count out, so the histogram "
                         "needs explicit ranks=(r1, r2) (the middle ranks come from the count)")
    try:
        center = float(center)
    except (TypeError, ValueError):
        raise TypeError(f"kappa_sigma_clip: center={center!r}; expected a real number") from None
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        scale = math.nan
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"kappa_sigma_clip: scale={scale!r}; expected a positive finite factor "
                         f"of the sums (a power of two keeps them exact; 1: unscaled)")
    return {"window": window, "bins": bins, "max_in": max_in, "min_in": min_in,
            "center": center, "ranks": ranks, "moments": bool(moments), "scale": scale}


def resolve(dtype, *, window=None, bins=None, max_in=None, min_in=None, center=0.0, ranks=None,
            moments=True, scale=1.0):
    """The parameters of one pass with defaults made concrete for ``dtype``: ``window=None`` is
    every value but NaN; ``bins=None`` the window in at most :data:`NBINS` bins (no histogram
    when ``max_in`` / ``min_in`` are given). Key ranges must fit the dtype's keys."""
    dtype = check_dtype(dtype)
    window = all_keys(dtype) if window is None else window
    extremes = max_in is not None or min_in is not None
    if bins is None and not extremes:
        bins = fit_bins(*window)
    limit = (1 << _key_bits(dtype)) - 1
    for name, value in (("window", window), ("bins", bins), ("max_in", max_in), ("min_in", min_in)):
        if value is not None and max(value[:2]) > limit:
            raise ValueError(f"kappa_sigma_clip: {name}={value!r} holds keys beyond "
                             f"{limit:#x}, the largest key of {dtype} data")
    empty = (1, 0)
    return {"window": tuple(window), "bins": bins if bins is not None else (*empty, 0),
            "max_in": max_in or empty, "min_in": min_in or empty, "center": center,
            "ranks": ranks, "extremes": extremes, "moments": moments, "scale": scale}


# -- CPU: reference, block statistics, combination ------------------------------------------------

def reference(x, **params):
    """CPU reference of one pass over the whole array ``x``, by sorting the window's keys."""
    x = np.asarray(x)
    p = resolve(x.dtype, **params)
    k = keys(x.reshape(-1))
    lo, hi = p["window"]
    inside = (k >= lo) & (k <= hi)
    d = _deviations(x.reshape(-1)[inside], p)
    head = np.zeros(HEAD)
    if p["moments"]:
        with np.errstate(over="ignore", invalid="ignore"):
            head[COUNT], head[SUM], head[SUMSQ] = inside.sum(), d.sum(), (d * d).sum()
        head[NANS] = np.isnan(x).sum() if x.dtype.kind == "f" else 0
    kin = np.sort(k[inside])
    head[SEL:SEL + 6] = (-1, 0, 0, -1, 0, 0)
    if p["extremes"]:
        for (a, b), n_at, v_at, pick in ((p["max_in"], NA, AMAX, -1), (p["min_in"], NB, BMIN, 0)):
            sel = kin[(kin >= a) & (kin <= b)]
            head[n_at] = sel.size
            head[v_at] = values(sel[pick], x.dtype)[()] if sel.size else 0
        return head
    blo, bhi, shift = p["bins"]
    counted = kin[(kin >= blo) & (kin <= bhi)]  # sorted, as kin is
    ranks = _ranks(p["ranks"], head[COUNT])
    bin_of = (counted - counted.dtype.type(blo)) >> counted.dtype.type(shift)
    for j, rank in enumerate(ranks):
        if rank is None or rank >= counted.size:
            continue
        b = bin_of[rank]
        before = np.searchsorted(bin_of, b, side="left")
        inbin = np.searchsorted(bin_of, b, side="right") - before
        head[SEL + 3 * j:SEL + 3 * j + 3] = (b, before, inbin)
    return head


def _ranks(ranks, count):
    """The two ranks to locate: as given, or the middle ones of ``count`` values."""
    if ranks is not None:
        return ranks
    n = int(count)
    return ((n - 1) // 2, n // 2) if n else (None, None)


def partial(x, **params):
    """CPU statistics of one block: a ``(1, HEAD + bins)`` row (histogram after the head).

    The key ranges are compared as values of the block's dtype (the same sets: keys keep the
    order), so only the values that reach the histogram or the extremes are turned into keys.
    """
    p = resolve(x.dtype, **params)
    nbins = bin_count(p["bins"]) if not p["extremes"] else 0
    row = np.zeros((1, HEAD + nbins))
    x = np.asarray(x).reshape(-1)
    head = row[0]
    inside = None
    if p["moments"]:
        inside = x[_between(x, p["window"])]
        d = _deviations(inside, p)
        with np.errstate(over="ignore", invalid="ignore"):  # the driver rescales overflowed sums
            head[COUNT], head[SUM] = inside.size, d.sum()
            head[SUMSQ] = np.square(d, out=d).sum()
        head[NANS] = np.count_nonzero(np.isnan(x)) if x.dtype.kind == "f" else 0
    if p["extremes"]:
        for key_range, n_at, v_at, reduce in ((p["max_in"], NA, AMAX, np.max),
                                              (p["min_in"], NB, BMIN, np.min)):
            sel = x[_between(x, _intersection(key_range, p["window"]))]
            head[n_at] = sel.size
            head[v_at] = reduce(sel) + x.dtype.type(0) if sel.size else 0  # -0.0 counts as 0.0
        return row
    blo, bhi, shift = p["bins"]
    covers = blo <= p["window"][0] and p["window"][1] <= bhi
    counted = keys(inside if covers and inside is not None
                   else x[_between(x, _intersection((blo, bhi), p["window"]))])
    counted -= counted.dtype.type(blo)
    counted >>= counted.dtype.type(shift)
    head[HEAD:] = np.bincount(counted.astype(np.intp), minlength=nbins)
    return row


def _deviations(values, p):
    """``(values - center) * scale`` in float64, as the CUDA kernel computes them: ``values *
    scale - center * scale`` (exact for a power-of-two scale; with scale 1, ``values - center``)."""
    d = values.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # the driver rescales overflowed sums
        if p["scale"] != 1.0:
            d *= p["scale"]
        d -= p["center"] * p["scale"]
    return d


def _intersection(a, b):
    return max(a[0], b[0]), min(a[1], b[1])


def _between(x, key_range):
    """Where the keys of ``x`` lie in ``key_range``, by comparing values (NaN never does)."""
    lo, hi = key_range
    if lo > hi:
        return np.zeros(x.shape, dtype=bool)
    low, high = values([lo, hi], x.dtype)
    return (x >= low) & (x <= high)


def combine(rows):
    """One row from the rows of several blocks: counts, sums and histograms add up, the
    extremes are the largest / smallest of the blocks that had values in their ranges. Works on
    NumPy and CuPy rows alike."""
    xp = cuda.array_module(rows)
    row = rows.sum(axis=0)
    for n_at, v_at, reduce, empty in ((NA, AMAX, xp.max, -np.inf), (NB, BMIN, xp.min, np.inf)):
        has = rows[:, n_at] > 0
        row[v_at] = xp.where(has.any(), reduce(xp.where(has, rows[:, v_at], empty)), 0.0)
    row[SEL:HEAD] = 0
    return row


def select(row, ranks=None):
    """Fill the ``sel*`` fields of a combined row: the bins holding the two ranks (default: the
    middle ones of its count). NumPy rows here; CuPy rows take the ``ksc_select`` kernel."""
    if cuda.is_cupy_array(row):
        return _select_gpu(row, ranks)
    select_bins(row[:HEAD], row[HEAD:], ranks)
    return row


def select_bins(head, hist, ranks=None):
    """:func:`select` for a NumPy head row and its histogram held apart (what a cluster's
    workers send): fills the ``sel*`` fields of ``head`` in place and returns it."""
    head[SEL:SEL + 6] = (-1, 0, 0, -1, 0, 0)
    if hist.size == 0:
        return head
    # the run of _SELECT_RUN bins holding the rank, then the bin within it: two short running
    # sums instead of one over every bin (a cluster's client does this once a pass). Counts are
    # whole numbers far below 2**53, so every sum is exact in any order.
    runs = np.add.reduceat(hist, np.arange(0, hist.size, _SELECT_RUN))
    cum_runs = np.cumsum(runs)
    for j, rank in enumerate(_ranks(ranks, head[COUNT])):
        if rank is None or rank >= cum_runs[-1]:
            continue
        r = int(np.searchsorted(cum_runs, rank, side="right"))
        part = hist[r * _SELECT_RUN:(r + 1) * _SELECT_RUN]
        cum = np.cumsum(part) + (cum_runs[r] - runs[r])
        b = int(np.searchsorted(cum, rank, side="right"))
        head[SEL + 3 * j:SEL + 3 * j + 3] = (r * _SELECT_RUN + b, cum[b] - part[b], part[b])
    return head


#: Bins per run in :func:`select_bins`' first search.
_SELECT_RUN = 1024


def finalize(stats, dtypes, *, window=None, bins=None, max_in=None, min_in=None, center=0.0,
             ranks=None, **params):
    """The pass result from the rows of every block (NumPy or CuPy, on their device)."""
    row = combine(stats)
    if max_in is None and min_in is None:
        row = select(row, ranks)
    else:
        row[SEL:SEL + 6] = cuda.array_module(row).asarray([-1, 0, 0, -1, 0, 0], dtype=np.float64)
    return row[:HEAD]


# -- GPU ------------------------------------------------------------------------------------------

def dispatch(x, **params):
    """GPU statistics of one block: a ``(1, HEAD + bins)`` row computed by one kernel launch."""
    cp = cuda.cupy()
    p = resolve(x.dtype, **params)
    nbins = bin_count(p["bins"]) if not p["extremes"] else 0
    row = cp.zeros((1, HEAD + nbins), dtype=np.float64)
    launch(walks(x), row[0], Scratch(cp), p)
    return row


class Scratch:
    """Per-thread-block partial statistics and the launch counter of the pass kernel on one
    device, reused by launches in stream order (the last thread block resets the counter)."""

    def __init__(self, cp):
        self.partials = cp.empty((_grid_limit(cp) * 8,), dtype=np.float64)
        self.done = cp.zeros((1,), dtype=np.uint32)


class Walk(NamedTuple):
    """How one launch walks a CuPy view: the view, its collapsed dims (1 to 3), the kernel's
    index type and grid, and the extents and element strides it takes (padded to 3 dims)."""

    view: object
    ndim: int
    index64: bool
    grid: int
    scalars: tuple


def walks(x) -> list[Walk]:
    """The launches that read CuPy block ``x`` in place: one, or one per slice of its outermost
    axis for a view that keeps more than 3 dims after collapsing (none when it is empty).
    Planned once per block and reused by every pass over it."""
    if x.size == 0:
        return []
    plan = layout.plan_pointwise(x)
    if plan.ndim > 3:
        axis = plan.axes[0][0]
        return [w for i in range(x.shape[axis]) for w in walks(x[(slice(None),) * axis + (i,)])]
    shape = plan.shape or (1,)
    strides = plan.strides[0] or (0,)
    ndim = len(shape)
    _, n1, n2 = (1,) * (3 - ndim) + tuple(shape)
    s0, s1, s2 = (0,) * (3 - ndim) + tuple(strides)
    n = math.prod(shape)
    grid = max(1, min(-(-n // (_THREADS * _UNROLL)), _grid_limit(cuda.cupy())))
    index64 = plan.index64 or n + grid * _THREADS * _UNROLL > layout.INT32_MAX
    i = np.int64 if index64 else np.int32
    return [Walk(x, ndim, index64, grid, (i(n), i(n1), i(n2), i(s0), i(s1), i(s2)))]


class Run(NamedTuple):
    """How one launch reads several contiguous CuPy blocks of one device as one run of values
    (:func:`run_of`): a device table of their pointers and of the run's index past each one's
    last value, its length, index type and grid. The blocks must outlive it."""

    view: object  # the first block (its dtype names the kernel)
    pointers: object
    ends: object
    n: object
    index64: bool
    grid: int


def run_of(blocks) -> list:
    """The launches that read CuPy ``blocks`` (of one device and dtype) in a pass: the
    contiguous ones (C or Fortran order, or any order without gaps: a pass does not care in
    which order it reads the values) as one :class:`Run`, one launch where a launch per block
    costs the host and the device a launch's fixed work each; the others' :func:`walks`."""
    cp = cuda.cupy()
    blocks = [b for b in blocks if b.size]
    is_dense = [layout.is_dense(b) for b in blocks]
    dense = [b for b, d in zip(blocks, is_dense) if d]
    rest = [w for b, d in zip(blocks, is_dense) if not d for w in walks(b)]
    if len(dense) < 2:
        return [w for b in dense for w in walks(b)] + rest
    ends = np.cumsum([b.size for b in dense], dtype=np.int64)
    n = int(ends[-1])
    grid = max(1, min(-(-n // (_THREADS * _UNROLL)), _grid_limit(cp)))
    index64 = n + grid * _THREADS * _UNROLL > layout.INT32_MAX
    i = np.int64 if index64 else np.int32
    starts = [layout.lowest_pointer(b) for b in dense]
    return [Run(dense[0], cp.asarray(np.array(starts, dtype=np.uint64)), cp.asarray(ends.astype(i)),
                i(n), index64, grid)] + rest


def launch(block_walks, row, scratch, p) -> None:
    """Launch the pass kernel over a block's :func:`walks`, accumulating into the 1-D device
    ``row``; ``p`` are parameters from :func:`resolve`."""
    if not block_walks:
        return
    cp = cuda.cupy()
    dtype = block_walks[0].view.dtype
    nbins = 0 if p["extremes"] else bin_count(p["bins"])
    cap = bins_cap(cp.cuda.runtime.getDevice())
    if nbins > cap:
        raise ValueError(f"kappa_sigma_clip: {nbins} histogram bins do not fit this GPU's shared "
                         f"memory, which holds {cap}; pass bins with a larger shift "
                         f"(fit_bins(lo, hi, {cap}))")
    k = key_dtype(dtype).type
    (wlo, whi), (hlo, hhi, shift) = p["window"], p["bins"]
    (alo, ahi), (blo, bhi) = p["max_in"], p["min_in"]
    keys_and_flags = (k(wlo), k(whi), k(hlo), k(hhi), np.int32(shift), np.int32(nbins), k(alo),
                      k(ahi), k(blo), k(bhi), np.float64(p["center"]), np.float64(p["scale"]),
                      np.int32(p["moments"]))
    shared = 4 * ((nbins + 1) // 2)
    extremes = "true" if p["extremes"] else "false"
    for walk in block_walks:
        index = "long long" if walk.index64 else "int"
        if isinstance(walk, Run):
            kernel = _pass_kernel(f"ksc_pass_blocks<{cuda.cuda_type(dtype)}, {index}, {extremes}>")
            args = (walk.pointers, walk.ends, walk.n)
        else:
            kernel = _pass_kernel(f"ksc_pass<{cuda.cuda_type(dtype)}, {index}, {walk.ndim}, "
                                  f"{extremes}>")
            args = (walk.view, *walk.scalars)
        kernel((walk.grid,), (_THREADS,),
               (*args, row, scratch.partials, scratch.done, *keys_and_flags), shared_mem=shared)


def _pass_kernel(expression):
    """The compiled pass kernel, allowed the shared memory of the largest histogram."""
    kernel = cuda.function("kappa_sigma_clip", expression)
    key = (cuda.cupy().cuda.runtime.getDevice(), expression)
    if _SHARED_LIMIT_SET.get(key) is not kernel:
        nbytes = 4 * (bins_cap(key[0]) // 2)
        if nbytes > 48 * 1024:  # beyond the default limit: opt in, once per function and device
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                kernel.max_dynamic_shared_size_bytes = nbytes
        _SHARED_LIMIT_SET[key] = kernel
    return kernel


#: Compiled pass kernels whose shared-memory limit is raised, by (device, expression).
_SHARED_LIMIT_SET: dict[tuple[int, str], object] = {}


@functools.cache
def bins_cap(device: int) -> int:
    """Most histogram bins one pass holds on GPU ``device`` (two 16-bit counters per 32-bit word
    of shared memory): :data:`NBINS` where a thread block may opt in to 128 KiB (A100, H100),
    fewer on GPUs with less shared memory (V100: 32768, T4: 16384)."""
    attrs = cuda.cupy().cuda.Device(device).attributes
    available = attrs.get("MaxSharedMemoryPerBlockOptin", attrs["MaxSharedMemoryPerBlock"])
    cap = NBINS
    while cap > 2 and 2 * cap + _STATIC_SHARED > available:
        cap //= 2
    return cap


def _grid_limit(cp) -> int:
    """Thread blocks of one pass: one per multiprocessor (a block of 1024 threads with a full
    histogram fills one)."""
    return cuda.sm_count(cp.cuda.runtime.getDevice())


def _select_gpu(row, ranks):
    cp = cuda.cupy()
    kernel = cuda.function("kappa_sigma_clip", "ksc_select")
    r1, r2 = (-1, -1) if ranks is None else ranks
    kernel((1,), (_THREADS,), (row, np.int32(row.size - HEAD), np.int64(r1), np.int64(r2)))
    return row


# -- Dask: one reduction task per block, one result of HEAD values --------------------------------

def dask_graph(x, *, strict=False, **params):
    """The pass over a Dask array: one task per block (its row) and one that combines them into
    a 1-D Dask array of :data:`HEAD` float64 values."""
    from chunkernels._dispatch import finalize

    return _pass_graph(x, params, functools.partial(finalize, SPEC, params, (x.dtype,)),
                       HEAD, "kappa_sigma_clip", strict)


def rows_graph(x, **params):
    """The pass over a Dask array with its histogram kept: the blocks' rows added up, a 1-D
    Dask array of :data:`HEAD` values then the histogram, nothing selected (for a driver that
    selects the ranks itself, once more passes are in)."""
    p = resolve(x.dtype, **validate(x.ndim, **params))
    length = HEAD + (0 if p["extremes"] else bin_count(p["bins"]))
    return _pass_graph(x, params, _joined_rows, length, "kappa_sigma_clip-rows", False)


def _pass_graph(x, params, combine_task, length, label, strict):
    from chunkernels import _graph
    from chunkernels._apply import BlockFunction

    fn = BlockFunction(SPEC, params, strict=strict)
    return _graph.reduce(fn, combine_task, f"{label}-{_graph.tokenize(fn, x)}", x, [],
                         chunks=((length,),), dtype=np.float64, meta=_graph.meta(x, np.float64, 1))


def _joined_rows(partials):
    """The blocks' rows (each ``(1, HEAD + bins)``) added up on their device: one row."""
    xp = cuda.array_module(partials[0])
    return combine(xp.concatenate([p.reshape(-1, p.shape[-1]) for p in partials]))


def _cases(rng):
    """Random data for ``chunkernels check``: first passes, refinement, extremes, views."""
    noisy = rng.standard_normal((61, 47))
    noisy[5, 7], noisy[30, 2] = 40.0, -25.0
    for dtype in ("float32", "float64"):
        x = noisy.astype(dtype)
        yield x, (), {"center": 0.1}
        yield x * 1e30 if dtype == "float64" else x, (), {"center": 2.0, "scale": 2.0**-100}
        lo, hi = window_keys(-2.5, 2.5, dtype)
        mid = key_of(0.0, dtype)
        yield x, (), {"window": (lo, hi), "bins": fit_bins(lo, mid, 4096), "ranks": (10, 11)}
        yield x[::-2, 3:], (), {"window": (lo, hi), "max_in": (lo, mid), "min_in": (mid, hi)}
    ints = rng.integers(-300, 300, size=(40, 33))
    for dtype in ("int16", "int64", "uint8"):
        x = (ints % 256 if dtype == "uint8" else ints).astype(dtype)
        window = window_keys(-100.5, 180.0, dtype)
        yield x.T, (), {"window": window, "bins": fit_bins(*window, 1024), "center": 3.0}


SPEC = KernelSpec(
    name="kappa_sigma_clip",
    summary="one pass of κ-σ clipping: count, shifted sums and the exact-median histogram of the "
            "values inside a window of keys; reference: sorting the window's keys",
    cpu=reference,
    gpu=dispatch,
    kind="reduction",
    source="kappa_sigma_clip.cu",
    entries=(
        "ksc_pass<float, int, 2, false>",
        "ksc_pass<float, int, 1, true>",
        "ksc_pass<double, long long, 3, false>",
        "ksc_pass<short, int, 2, false>",
        "ksc_pass<unsigned char, int, 1, true>",
        "ksc_pass<long long, long long, 2, true>",
        "ksc_pass<unsigned long long, int, 3, false>",
        "ksc_pass_blocks<float, int, false>",
        "ksc_pass_blocks<double, long long, true>",
        "ksc_pass_blocks<unsigned short, int, false>",
        "ksc_select",
    ),
    dtypes=GPU_DTYPES,
    result_dtype=always(np.float64),
    validate=validate,
    partial=partial,
    finalize=finalize,
    dask_graph=dask_graph,
    cases=_cases,
)
